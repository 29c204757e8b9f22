"""The linter's rules (pyproject's [tool.ruff.lint]) hold on the product's code: ``orchestrator/`` and ``recipes/``."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from tests.helpers.paths import REPO

ROOT = REPO


def test_ruff_finds_nothing_in_the_product_code():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "orchestrator", "recipes"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_ruff_would_catch_an_unused_import_and_an_undefined_name(tmp_path):
    (tmp_path / "planted.py").write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
                          str(tmp_path / "planted.py")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "F401" in out.stdout and "F821" in out.stdout, out.stdout


def test_the_product_code_is_as_ruff_format_writes_it():
    """``ruff format`` (pyproject's [tool.ruff]: 120 columns) is applied: ``ruff format orchestrator recipes`` fixes it."""
    out = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "orchestrator", "recipes"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, "run: ruff format orchestrator recipes\n" + out.stdout[-4000:] + out.stderr[-2000:]


def test_ruff_format_would_catch_unformatted_code(tmp_path):
    (tmp_path / "planted.py").write_text("x = {  'a':1 }\n")
    out = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "--config",
                          str(ROOT / "pyproject.toml"), str(tmp_path / "planted.py")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and "planted.py" in out.stdout, out.stdout
