"""The package's import graph: the floors contract, no cycles, nothing imports the launcher, and the Hydra-free
modules stay so.

Every import counts, also those inside functions (a lazy import is still a dependency); only those under
``if TYPE_CHECKING:`` (annotations, never run) are left out.
"""
from __future__ import annotations

import pytest
import ast
import subprocess
import sys
from pathlib import Path
from tests.helpers.paths import REPO

ROOT = REPO
PACKAGES = ("orchestrator", "recipes")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# The floors, lowest first: a module imports only from its own floor and the floors below it. A newcomer knows from
# a file's floor what it may use and who may use it (docs/architecture.md draws the house on this list).
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("orchestrator.core",)),  # exit codes, error types, durations, choices, numbers, ranks, env names
    ("config", ("orchestrator.config",)),  # the schemas, composing (Hydra only here), TRL options of a config
    ("storage", ("orchestrator.storage",)),  # the object store, conditional writes, inputs by digest
    ("records", ("orchestrator.records",)),  # documents kept in the bucket: the ledger, the reproducibility record
    ("policy", ("orchestrator.policy",)),  # pure decisions: requeue, interval, deadline, restart
    ("money", ("orchestrator.money",)),  # prices, the meter, budgets, the spend index, the cost report
    ("checkpoint", ("orchestrator.checkpoint",)),  # snapshot, manifest, commit, verified restore, caches
    ("tracking", ("orchestrator.tracking",)),  # MLflow, progress
    ("recipes", ("recipes",)),  # one module per method on TRL; nothing of storage, cost or requeue
    ("evaluation", ("orchestrator.evaluation",)),  # lm-evaluation-harness runs, results, gains
    ("planning", ("orchestrator.planning",)),  # memory, throughput, interruption pricing, simulation
    ("attempt", ("orchestrator.attempt",)),  # the parts of one attempt, the Trainer callbacks, preemption
    ("process", ("orchestrator.process",)),  # supervisor, forked attempts and ranks, the multi-node world
    ("backends", ("orchestrator.backends",)),  # local, Slurm, SkyPilot, Kubernetes renders and submissions
    ("sweep", ("orchestrator.sweep",)),  # studies in storage, trials as ordinary jobs
    ("app", ("orchestrator.app", "orchestrator.launch", "orchestrator.worker")),  # the processes' mains, launch checks
    ("cli", ("orchestrator.cli", "orchestrator.__main__")),  # one module per `orchestrator <command>`
)


def floor_of(module: str) -> int | None:
    """The index in FLOORS of ``module``'s floor (the longest matching prefix), -1 for ``orchestrator`` itself
    (its ``__init__`` holds the version and imports nothing)."""
    if module == "orchestrator":
        return -1
    found = [(len(prefix), index) for index, (_, prefixes) in enumerate(FLOORS) for prefix in prefixes
             if module == prefix or module.startswith(prefix + ".")]
    return max(found)[1] if found else None


def _typing_only(tree: ast.AST) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:``: annotations only, never imported at run time."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(inner) for inner in ast.walk(node))
    return skip


def _sources() -> dict[str, str]:
    return {_module_name(p): p.read_text() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _graph(sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    sources = _sources() if sources is None else sources
    modules = set(sources)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    inits = {_module_name(p) for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py")}
    for name, text in sources.items():
        package = name if name in inits else name.rpartition(".")[0]
        tree = ast.parse(text)
        skip = _typing_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
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


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a higher floor than the importer's (and every module on no floor)."""
    found = []
    for name, deps in sorted(graph.items()):
        own = floor_of(name)
        if own is None:
            found.append(f"{name} is on no floor: add it to FLOORS")
            continue
        for dep in sorted(deps):
            theirs = floor_of(dep)
            if own < 0 and dep:
                found.append(f"{name} imports {dep}: the top package imports nothing")
            if theirs is not None and theirs > own:
                found.append(f"{name} ({FLOORS[own][0]}) imports {dep} ({FLOORS[theirs][0]})")
    return found


def _package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles among packages (``orchestrator.attempt``, ``recipes``...): two floors' packages that reach each other."""
    def package(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "orchestrator" and len(parts) > 1 else parts[0]

    packages: dict[str, set[str]] = {}
    for name, deps in graph.items():
        packages.setdefault(package(name), set()).update(package(d) for d in deps if package(d) != package(name))
    for deps in list(packages.values()):
        for dep in deps:
            packages.setdefault(dep, set())
    return _cycles(packages)


def test_every_module_imports_only_its_own_floor_and_those_below():
    graph = _graph()
    assert not upward_imports(graph), "\n".join(upward_imports(graph))
    assert not _package_cycles(graph), _package_cycles(graph)


def test_the_floors_contract_fails_on_an_upward_import_even_inside_a_function():
    sources = _sources()
    # the lowest floor reaching for a command's helper, lazily, as a convenience import would
    sources["orchestrator.core.errors"] += "\n\ndef _planted():\n    from orchestrator.cli.status import format_ledger\n"
    assert upward_imports(_graph(sources)) == [
        "orchestrator.core.errors (core) imports orchestrator.cli.status (cli)"]
    # the same import only for annotations is no dependency
    sources["orchestrator.core.errors"] = _sources()["orchestrator.core.errors"] + (
        "\n\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from orchestrator.cli.status import format_ledger\n")
    assert upward_imports(_graph(sources)) == []
    # a new top-level module nobody placed is refused too
    sources["orchestrator.helpers"] = "import os\n"
    assert upward_imports(_graph(sources)) == ["orchestrator.helpers is on no floor: add it to FLOORS"]


def test_the_cycle_check_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


@pytest.mark.e2e
def test_storage_preemption_and_the_backends_import_without_hydra():
    code = ("import sys\n"
            "import orchestrator.core.durations, orchestrator.storage, orchestrator.attempt.preemption, orchestrator.backends\n"
            "import orchestrator.records.ledger, orchestrator.checkpoint.store\n"
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


def test_no_test_module_imports_another_test_modules_names():
    """What several test modules share lives in tests/helpers/: a test module importing another's names runs that
    module's collection side effects and ties the two together (move one, and the other breaks)."""
    assert imports_of_test_modules(ROOT / "tests") == []


def _a_test_module(name: str) -> bool:
    """``tests.unit.money.test_spend``, ``tests.e2e.test_sweep_e2e``, ``tests.test_x``: a test module's dotted name."""
    return name.startswith("tests.") and name.rpartition(".")[2].startswith("test_")


def imports_of_test_modules(tests: Path) -> list[str]:
    """Every import, in a test module anywhere under ``tests``, of another test module's names."""
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        where = path.relative_to(tests).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (
                    _a_test_module(node.module or "")
                    or (node.module or "").startswith("tests") and any(a.name.startswith("test_") for a in node.names)):
                found.append(f"{where}: from {node.module} import ...")
            elif isinstance(node, ast.ImportFrom) and node.level:
                found.append(f"{where}: a relative import (from {'.' * node.level}{node.module or ''} import ...)")
            elif isinstance(node, ast.Import) and any(_a_test_module(a.name) for a in node.names):
                found.append(f"{where}: import {', '.join(a.name for a in node.names)}")
    return found


def test_the_test_module_check_finds_an_import_of_another_test_modules_names(tmp_path):
    (tmp_path / "unit" / "money").mkdir(parents=True)
    (tmp_path / "unit" / "money" / "test_a.py").write_text("from tests.unit.sweep.test_b import TRIAL\n")
    (tmp_path / "unit" / "test_c.py").write_text("from tests.e2e import test_d\nfrom tests.helpers import jobs\n")
    (tmp_path / "e2e").mkdir()
    (tmp_path / "e2e" / "test_d.py").write_text("import tests.unit.money.test_a\nfrom .test_e import x\n")
    assert imports_of_test_modules(tmp_path) == [
        "e2e/test_d.py: import tests.unit.money.test_a",
        "e2e/test_d.py: a relative import (from .test_e import ...)",
        "unit/money/test_a.py: from tests.unit.sweep.test_b import ...",
        "unit/test_c.py: from tests.e2e import ...",
    ]
