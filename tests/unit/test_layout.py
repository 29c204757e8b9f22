"""The tests mirror the packages: a reader finds a package's tests in ``tests/unit/<package>/`` and the whole jobs in
``tests/e2e/``, and a new test module lands there too.

``tests/unit/`` itself holds only the checks of the whole tree (lint, types, imports, shape, docs, this one).
"""
from __future__ import annotations

from pathlib import Path

from tests.helpers.paths import REPO

# the checks that read the whole tree rather than one package's code
WHOLE_TREE = frozenset({"test_docs.py", "test_imports.py", "test_layout.py", "test_lint.py", "test_shape.py",
                        "test_types.py"})


def packages(repo: Path) -> list[str]:
    """The folders a unit test may sit in: each package of ``orchestrator/`` and ``recipes``."""
    found = [p.parent.name for p in (repo / "orchestrator").glob("*/__init__.py")]
    return sorted(found + ["recipes"])


def layout_problems(tests: Path, names: list[str]) -> list[str]:
    """Each test module (``test_*.py``) outside its mirror, and each test folder Python cannot import, with the fix."""
    mirror = f"tests/unit/<package>/ (the package it tests: {', '.join(names)}) or tests/e2e/ (whole jobs)"
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        where = path.relative_to(tests)
        parts, name = where.parts[:-1], where.name
        if parts == ("unit",):
            ok = name in WHOLE_TREE
        elif parts == ("e2e",):
            ok = True
        else:
            ok = len(parts) == 2 and parts[0] == "unit" and parts[1] in names and not name.endswith("_e2e.py")
        if not ok:
            why = ("a module named *_e2e.py is end to end as a whole: move it to tests/e2e/"
                   if name.endswith("_e2e.py") and parts != ("e2e",) else f"move it to {mirror}")
            found.append(f"tests/{where.as_posix()}: {why}")
    for folder in sorted({tests / "unit", tests / "e2e", *(p.parent for p in (tests / "unit").glob("*/test_*.py") if p.parent.name in names)}):
        if folder.is_dir() and not (folder / "__init__.py").exists():
            found.append(f"tests/{folder.relative_to(tests).as_posix()}/ has no __init__.py: add an empty one "
                         "(two test modules of one name in different folders would collide without it)")
    return found


def test_every_test_module_sits_in_its_packages_mirror():
    assert layout_problems(REPO / "tests", packages(REPO)) == []


def test_the_layout_check_names_a_module_outside_the_mirror_and_the_fix(tmp_path):
    for rel in ("test_new.py", "helpers/test_helper.py", "unit/test_spend.py", "unit/orchestration/test_x.py",
                "unit/money/deep/test_y.py", "unit/money/test_spend.py", "unit/sweep/test_sweep_e2e.py",
                "e2e/test_sweep_e2e.py", "unit/test_lint.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    for folder in ("unit", "e2e", "unit/money"):
        (tmp_path / folder / "__init__.py").write_text("")
    problems = layout_problems(tmp_path, ["money", "recipes", "sweep"])
    mirror = "move it to tests/unit/<package>/ (the package it tests: money, recipes, sweep) or tests/e2e/ (whole jobs)"
    assert problems == [
        f"tests/helpers/test_helper.py: {mirror}",
        f"tests/test_new.py: {mirror}",
        f"tests/unit/money/deep/test_y.py: {mirror}",
        f"tests/unit/orchestration/test_x.py: {mirror}",
        "tests/unit/sweep/test_sweep_e2e.py: a module named *_e2e.py is end to end as a whole: move it to tests/e2e/",
        f"tests/unit/test_spend.py: {mirror}",
        "tests/unit/sweep/ has no __init__.py: add an empty one (two test modules of one name in different folders "
        "would collide without it)",
    ]

