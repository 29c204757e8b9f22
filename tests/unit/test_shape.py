"""The codebase's size limits hold (scripts/shape_check.py: modules <= 450 lines, functions <= 60, classes < 200)."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from tests.helpers.paths import REPO

ROOT = REPO


def _shape_check():
    spec = importlib.util.spec_from_file_location("shape_check", ROOT / "scripts" / "shape_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_module_function_or_class_is_over_the_limits():
    check = _shape_check()
    assert check.over_limits([str(ROOT / "orchestrator"), str(ROOT / "recipes")]) == []


def test_the_check_finds_a_long_function(tmp_path):
    (tmp_path / "long.py").write_text("def f():\n" + "    x = 1\n" * 70)
    assert _shape_check().over_limits([str(tmp_path)]) == [f"{tmp_path}/long.py:1: function f of 71 lines (limit 60)"]


def test_a_call_wrapped_one_argument_per_line_counts_as_its_first_line(tmp_path):
    """The limits hold before and after ``ruff format``: a wrapped call is one line, a long body is not."""
    body = "    x = f(\n" + "        1,\n" * 80 + "    )\n"
    (tmp_path / "wrapped.py").write_text("def f(*a):\n" + body + "    return x\n")
    assert _shape_check().over_limits([str(tmp_path)]) == []
    (tmp_path / "wrapped.py").write_text("def f(*a):\n" + body + "    y = 1\n" * 60)
    assert _shape_check().over_limits([str(tmp_path)]) == [f"{tmp_path}/wrapped.py:1: function f of 62 lines (limit 60)"]
