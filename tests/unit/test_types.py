"""The type checker (pyproject's [tool.mypy]) holds on all of orchestrator/ and recipes/: the default strictness
over the product's code, mypy's strict flags on core, records and policy."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from tests.helpers.paths import REPO

ROOT = REPO
CACHE = ROOT / ".cache" / "mypy"  # ignored by git; a first run (no cache) takes about 20 s


# The paths mypy must find nothing in (strict ones: those pyproject's override names).
CLEAN = ["orchestrator", "recipes"]  # all of the product's code


def _mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(CACHE), *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_mypy_finds_nothing_in_the_clean_paths():
    out = _mypy(*CLEAN)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def test_the_strict_flags_would_catch_an_untyped_function_and_a_bad_return(tmp_path):
    """A module under orchestrator.core (so pyproject's strict override applies) with an untyped def and a str
    returned as an int: mypy must fail naming both."""
    package = tmp_path / "orchestrator" / "core"
    package.mkdir(parents=True)
    (tmp_path / "orchestrator" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "planted.py").write_text(
        "def untyped(x):\n    return x\n\n\ndef count() -> int:\n    return 'three'\n")
    out = _mypy("--config-file", str(ROOT / "pyproject.toml"), "orchestrator/core/planted.py", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "[no-untyped-def]" in out.stdout and "[return-value]" in out.stdout, out.stdout
