"""The package's import graph: no cycles, nothing imports the launcher, and the Hydra-free modules stay so.

Every import counts, also those inside functions (a lazy import is still a dependency).
"""
from __future__ import annotations

import pytest
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "recipes")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                # a module imports the deepest known module its target names
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_import_cycles_and_nothing_imports_the_launcher():
    graph = _graph()
    assert "orchestrator.launch" in graph and "orchestrator.attempt.runner" in graph
    assert not _cycles(graph), _cycles(graph)
    importers = sorted(name for name, deps in graph.items() if "orchestrator.launch" in deps)
    assert importers == [], f"modules importing orchestrator.launch: {importers}"


def test_the_cycle_check_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


@pytest.mark.e2e
def test_storage_preemption_and_the_backends_import_without_hydra():
    code = ("import sys\n"
            "import orchestrator.config.durations, orchestrator.storage, orchestrator.preemption, orchestrator.backends\n"
            "import orchestrator.ledger, orchestrator.checkpoint.store\n"
            "print(sorted(m for m in ('hydra', 'torch', 'transformers') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def _importers_of(package: str) -> list[str]:
    found = set()
    for path in (p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n == package or n.startswith(package + ".") for n in names):
                found.add(_module_name(path))
    return sorted(found)


def test_only_compose_and_the_schemas_import_hydra():
    assert _importers_of("hydra") == ["orchestrator.config.compose", "orchestrator.config.schema"]


@pytest.mark.e2e
def test_the_launcher_composes_validates_and_plans_without_the_training_stack(tmp_path):
    code = ("import sys\n"
            "from orchestrator import launch\n"
            "cfg, overrides = launch.compose_for_launch([])\n"
            "launch.print_plan(cfg)\n"
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'peft', 'datasets', 'mlflow') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "plan: sft" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
