"""The launcher as a Hydra user knows it: --help, --cfg job, --info; hydra.* refused; `orchestrator launch` the same.

In-process (``launch.main``), as the config-validation tests are: nothing here starts a job.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator import launch
from orchestrator.cli import main as cli
from tests.helpers.paths import REPO

ROOT = REPO


@pytest.fixture(autouse=True)
def no_job(monkeypatch):
    """A job that would start fails the test: these commands must not run one."""
    import orchestrator.backends

    def refuse(*args, **kwargs):
        raise AssertionError("a job was started")

    monkeypatch.setattr(orchestrator.backends, "run_backend", refuse)


def _launch(capsys, *argv: str, via_cli: bool = False) -> tuple[int, str, str]:
    try:
        code = cli.main(["launch", *argv]) if via_cli else launch.main(list(argv))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["recipe=dpo", "--help"]])
def test_help_lists_the_groups_their_options_and_examples(capsys, argv):
    code, out, err = _launch(capsys, *argv)
    assert code == 0 and err == "", err
    assert out.startswith("usage: python -m orchestrator.launch")
    assert "  recipe       sft | dpo | grpo | qlora" in out and "  backend      local | kubernetes | skypilot | slurm" in out
    assert "examples:" in out and "--cfg job" in out and "+experiment" in out


def test_cfg_job_prints_the_composed_config_and_runs_nothing(capsys, tmp_path):
    runs = tmp_path / "runs"
    code, out, err = _launch(capsys, f"storage.uri={runs}", "--cfg", "job", "train.per_device_train_batch_size=4",
                             "recipe=dpo")
    assert code == 0, err
    cfg = yaml.safe_load(out)
    assert cfg["train"]["per_device_batch_size"] == 4 and cfg["recipe"]["name"] == "dpo"
    assert cfg["storage"]["uri"] == str(runs) and not runs.exists()
    assert _launch(capsys, f"storage.uri={runs}", "--cfg", "all", "train.per_device_train_batch_size=4",
                   "recipe=dpo")[1] == out
    code, out, _ = _launch(capsys, "--cfg=job", "--package", "train", "train.max_steps=7")
    assert code == 0 and yaml.safe_load(out)["max_steps"] == 7 and "recipe" not in yaml.safe_load(out)


def test_cfg_job_of_a_bad_config_exits_4_in_one_line(capsys):
    code, out, err = _launch(capsys, "--cfg", "job", "train.max_steps=many")
    assert code == 4 and out == "" and len(err.strip().splitlines()) == 1 and "train.max_steps=many" in err


def test_info_names_the_config_directory_and_the_defaults(capsys):
    code, out, _ = _launch(capsys, "--info", "recipe=dpo")
    assert code == 0 and f"config directory: {ROOT / 'conf'}" in out and "  recipe: sft" in out
    assert "overrides: recipe=dpo" in out


@pytest.mark.parametrize("override,fix", [
    ("hydra.run.dir=outputs/x", "run.work_dir"),
    ("hydra/launcher=submitit_slurm", "backend=local|slurm|skypilot|kubernetes"),
    ("hydra/sweeper=optuna", "sweep=asha"),
    ("+hydra.job.env_set.X=1", "Drop the override"),
    ("train.max_steps=[1", "not an override"),  # Hydra's grammar refuses it: one line, not its lexer's trace
])
def test_hydra_runtime_overrides_are_refused_in_one_line_exit_4(capsys, override, fix):
    code, out, err = _launch(capsys, override)
    lines = err.strip().splitlines()
    assert code == 4 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert fix in lines[0] and "LexerNoViableAlt" not in lines[0]


@pytest.mark.parametrize("argv,code", [
    (["--bogus"], 2), (["-cd", "conf2"], 2), (["--cfg", "hydra"], 2), (["--resolve"], 2),
])
def test_flags_the_launcher_lacks_exit_2_naming_the_alternative(capsys, argv, code):
    got, _, err = _launch(capsys, *argv)
    assert got == code and err.splitlines()[-1].startswith("error: "), err


@pytest.mark.parametrize("argv", [["--help"], ["--cfg", "job", "recipe=grpo"], ["hydra.verbose=true"], ["--bogus"],
                                  ["+train.adam_beta1=0.9"]])
def test_orchestrator_launch_is_the_same_command(capsys, argv):
    module = _launch(capsys, *argv)
    command = _launch(capsys, *argv, via_cli=True)
    assert command[0] == module[0]
    assert command[1:] == tuple(text.replace("python -m orchestrator.launch", "orchestrator launch") for text in module[1:])


def test_help_from_a_shell_exits_0_without_a_traceback():
    done = subprocess.run([sys.executable, "-m", "orchestrator.launch", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "config groups" in done.stdout and "Traceback" not in done.stderr, done.stderr
