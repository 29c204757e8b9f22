"""One CLI vocabulary (docs/cli.md): every ``orchestrator <command>`` parses with argparse, answers --help with
exit 0, refuses an unknown flag with exit 2 and ``error:``, prints user errors as ``error: ...`` (2, or 4 for a
bad job config), and shows sizes in one decimal unit."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main as cli
from orchestrator.core.console import format_bytes
from orchestrator.core.exitcodes import ExitClass
from orchestrator.records.ledger import Ledger
from orchestrator.storage import LocalStore
from tests.helpers.net import free_port
from tests.helpers.paths import REPO

ROOT = REPO
TRACES = ROOT / "data" / "spot-traces"
COMMANDS = list(cli.COMMANDS)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    """``orchestrator ARGV`` in-process: (exit code, stdout, stderr); argparse's exits become codes."""
    try:
        code = cli.main(list(argv))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def test_top_level_help_lists_every_command_on_one_line(capsys):
    code, out, _ = _run(capsys, "--help")
    assert code == 0
    lines = out.splitlines()
    for name in COMMANDS:
        assert sum(line.startswith(f"  {name} ") for line in lines) == 1, out


@pytest.mark.parametrize("argv", [[], ["bogus"], ["--bogus"]], ids=["none", "unknown-command", "unknown-flag"])
def test_top_level_usage_errors(capsys, argv):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.splitlines()[-1].startswith("error: "), err


@pytest.mark.parametrize("name", COMMANDS + ["storage init", "storage repair-spend", "prices refresh"])
def test_each_command_help_exits_0(capsys, name):
    code, out, err = _run(capsys, *name.split(), "--help")
    assert code == 0, err
    assert out.startswith(f"usage: orchestrator {name}"), out


@pytest.mark.parametrize("argv", [["launch"], ["status", "x/y"], ["report"], ["plan"], ["simulate", "--traces", "t", "--job-hours", "1"],
                                  ["checkpoints", "x/y"], ["storage", "init", "s3://b"], ["eval", "x/y"],
                                  ["ls", "x"], ["logs", "x/y"], ["cancel", "x/y"], ["prices", "refresh"]], ids=COMMANDS)
def test_each_command_refuses_an_unknown_flag(capsys, argv):
    code, out, err = _run(capsys, *argv, "--no-such-flag")
    assert code == 2, err
    assert err.splitlines()[-1].startswith("error: unrecognized arguments: --no-such-flag"), err
    assert "Traceback" not in err


@pytest.fixture
def user_errors(tmp_path, monkeypatch) -> dict[str, tuple[list[str], int, str]]:
    """Per command: (argv, exit code, what the message names)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # a closed port is refused at once
    nothing = f"http://127.0.0.1:{free_port()}"
    return {
        "launch": (["launch", "hydra.run.dir=out"], 4, "hydra.run.dir=out"),
        "status": (["status", f"{tmp_path}/runs/nojob"], 2, f"no ledger at {tmp_path}/runs/nojob/ledger.json"),
        "report": (["report", "--tracking-uri", nothing], 2, f"cannot reach MLflow at {nothing}"),
        "plan": (["plan", "model=no-such-model"], 4, "model=no-such-model"),
        "simulate": (["simulate", "--traces", str(TRACES), "--job-hours", "2", "--policy", "deadline"], 2,
                     "--deadline-hours"),
        "checkpoints": (["checkpoints", "s3://"], 2, "s3://"),
        "storage": (["storage", "init", str(tmp_path)], 2, "applies to S3 URIs"),
        "eval": (["eval", f"{tmp_path}/job", "eval.tasks=[]"], 4, "eval.tasks is empty"),
        "ls": (["ls", f"{tmp_path}/nowhere"], 2, f"no store at {tmp_path}/nowhere"),
        "logs": (["logs", f"{tmp_path}/runs/nojob"], 2, f"no job named 'nojob' under {tmp_path}/runs"),
        "cancel": (["cancel", f"{tmp_path}/runs/nojob"], 2, f"no job named 'nojob' under {tmp_path}/runs"),
        "prices": (["prices", "refresh", "--storage-uri", str(tmp_path), "--clouds", "oracle"], 2, "--clouds 'oracle'"),
    }


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_prints_a_user_error_with_the_shared_prefix(capsys, user_errors, name):
    argv, expected, named = user_errors[name]
    code, _, err = _run(capsys, *argv)
    assert code == expected, err
    assert err.startswith("error: ") and named in err, err
    assert "Traceback" not in err


def test_unknown_flag_from_a_shell_has_no_traceback():
    for argv in (["status", "x/y"], ["plan"], ["checkpoints", "x/y"]):
        done = subprocess.run([sys.executable, "-m", "orchestrator", *argv, "--no-such-flag"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 2, done.stderr
        assert "error: unrecognized arguments: --no-such-flag" in done.stderr and "Traceback" not in done.stderr


def test_sizes_are_decimal_everywhere(capsys, tmp_path):
    assert [format_bytes(n) for n in (512, 118_000, 3 * 1024 * 1024, 15.2e9)] == \
        ["512 B", "118.0 kB", "3.1 MB", "15.2 GB"]
    ledger = Ledger(LocalStore(tmp_path / "runs"), "exp1")
    ledger.begin_attempt(host="a", pid=1, instance_type="x", gpu_type="t4", gpus=1, spot=True, checkpoint_step=0)
    ledger.record_checkpoint(step=20, key="exp1/checkpoints/20-1", size=3 * 1024 * 1024)
    ledger.end_attempt(ExitClass.COMPLETED, step=20, cost_usd=0.1, status="completed")
    code, out, err = _run(capsys, "status", f"{tmp_path}/runs/exp1")
    assert code == 0, err
    assert "3.1 MB" in out and "MiB" not in out


@pytest.mark.parametrize("argv", [
    ["x/y", "eval.tasks=[a]", "--endpoint-url", "http://e"],
    ["x/y", "--endpoint-url", "http://e", "eval.tasks=[a]"],
    ["--endpoint-url", "http://e", "x/y", "eval.tasks=[a]"],
], ids=["after", "among", "before"])
def test_options_go_before_after_or_among_a_run_uri_and_overrides(argv):
    from orchestrator.cli.checkpoints import parse_args as checkpoints_args
    from orchestrator.app.launch_flags import parse as launch_args
    from orchestrator.cli.evaluate import parse_args as eval_args

    args = eval_args(argv)
    assert (args.run_uri, args.overrides, args.endpoint_url) == ("x/y", ["eval.tasks=[a]"], "http://e")
    plain = [word for word in argv if word != "eval.tasks=[a]"]
    assert checkpoints_args(plain + ["--verify"]).verify and checkpoints_args(["--json", *plain]).json
    launch = launch_args([word.replace("--endpoint-url", "--cfg").replace("http://e", "job") for word in argv])
    assert launch.cfg == "job" and launch.overrides == ["x/y", "eval.tasks=[a]"]
