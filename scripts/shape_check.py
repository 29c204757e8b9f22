"""The codebase's size limits: no module over 450 lines, no function over 60, no class of 200 lines or more.

    python scripts/shape_check.py [paths...]   # default: orchestrator recipes; exits 1 listing what is over
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

MODULE_LINES, FUNCTION_LINES, CLASS_LINES = 450, 60, 200


def over_limits(paths: list[str]) -> list[str]:
    found = []
    for root in paths:
        for path in sorted(Path(root).rglob("*.py")):
            text = path.read_text()
            lines = text.count("\n")
            if lines > MODULE_LINES:
                found.append(f"{path}: module of {lines} lines (limit {MODULE_LINES})")
            for node in ast.walk(ast.parse(text)):
                size = (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > FUNCTION_LINES:
                    found.append(f"{path}:{node.lineno}: function {node.name} of {size} lines (limit {FUNCTION_LINES})")
                elif isinstance(node, ast.ClassDef) and size >= CLASS_LINES:
                    found.append(f"{path}:{node.lineno}: class {node.name} of {size} lines (limit {CLASS_LINES - 1})")
    return found


if __name__ == "__main__":
    problems = over_limits(sys.argv[1:] or ["orchestrator", "recipes"])
    print("\n".join(problems) if problems else "within the limits")
    sys.exit(1 if problems else 0)
