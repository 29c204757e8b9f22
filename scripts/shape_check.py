"""The codebase's size limits: no module over 450 lines, no function over 60, no class of 200 lines or more.

    python scripts/shape_check.py [paths...]   # default: orchestrator recipes; exits 1 listing what is over

A line inside brackets that continues the line before it (a call's arguments one per line, as ``ruff format``
writes a call that does not fit in 120 columns) is not counted: the limits measure how much a unit says, not how
the formatter wraps it, so formatting never moves a unit over or under a limit.
"""
from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

MODULE_LINES, FUNCTION_LINES, CLASS_LINES = 450, 60, 200


def continuation_lines(text: str) -> set[int]:
    """The numbers of the lines that begin inside an open bracket (or inside a string that does)."""
    found: set[int] = set()
    depth, last_row = 0, 0
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        (row, _), (end_row, _) = token.start, token.end
        if depth > 0:
            found.update(range(max(row, last_row + 1), end_row + 1))
        last_row = max(last_row, end_row)
        if token.type == tokenize.OP and token.string in "([{":
            depth += 1
        elif token.type == tokenize.OP and token.string in ")]}":
            depth -= 1
    return found


def over_limits(paths: list[str]) -> list[str]:
    found = []
    for root in paths:
        for path in sorted(Path(root).rglob("*.py")):
            text = path.read_text()
            wrapped = continuation_lines(text)
            lines = text.count("\n") - len(wrapped)
            if lines > MODULE_LINES:
                found.append(f"{path}: module of {lines} lines (limit {MODULE_LINES})")
            for node in ast.walk(ast.parse(text)):
                first, last = getattr(node, "lineno", 0), getattr(node, "end_lineno", None) or getattr(node, "lineno", 0)
                size = sum(1 for n in range(first, last + 1) if n not in wrapped) if first else 0
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > FUNCTION_LINES:
                    found.append(f"{path}:{node.lineno}: function {node.name} of {size} lines (limit {FUNCTION_LINES})")
                elif isinstance(node, ast.ClassDef) and size >= CLASS_LINES:
                    found.append(f"{path}:{node.lineno}: class {node.name} of {size} lines (limit {CLASS_LINES - 1})")
    return found


if __name__ == "__main__":
    problems = over_limits(sys.argv[1:] or ["orchestrator", "recipes"])
    print("\n".join(problems) if problems else "within the limits")
    sys.exit(1 if problems else 0)
