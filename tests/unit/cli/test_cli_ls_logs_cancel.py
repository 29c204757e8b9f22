"""``orchestrator ls``, ``logs`` and ``cancel``, and the submission record they read (issue 44 item 5)."""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.backends import record_submission
from orchestrator.backends.handles import process_started
from orchestrator.cli import cancel as cancel_cli
from orchestrator.cli import logs as logs_cli
from orchestrator.cli import ls as ls_cli
from orchestrator.core.exitcodes import ExitClass
from orchestrator.records.ledger import Ledger
from orchestrator.records.submission import SubmissionRecord, read_submission, write_submission
from orchestrator.storage import LocalStore
from orchestrator.sweep.state import SweepState
from tests.helpers import jobs
from tests.helpers.backends import compose
from tests.helpers.paths import REPO

REPO_ROOT = REPO


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def _job(store, name: str, *, step: int, cost: float, status: str = "preempted") -> None:
    ledger = Ledger(store, name)
    ledger.begin_attempt(host="spot-a", pid=11, instance_type="g5.xlarge", gpu_type="a10g", gpus=1, spot=True,
                         checkpoint_step=0)
    ledger.end_attempt(ExitClass.PREEMPTED if status == "preempted" else ExitClass.COMPLETED, step=step,
                       cost_usd=cost, status=status)


def _fill(store) -> None:
    """Two jobs (old, then new), a corrupt ledger, a sweep with one trial, and the store's own folders."""
    _job(store, "old", step=25, cost=0.25)
    time.sleep(0.05)
    _job(store, "new", step=40, cost=0.5, status="completed")
    store.put_bytes("broken/ledger.json", b'{"run_name": "broken", "attempts": 3}')
    state = SweepState(store, "sw")
    state.open(space={"train.learning_rate": ["interval", 1e-05, 0.001, True]}, fixed=["train.max_steps=12"],
               settings={"sampler": "random", "seed": 0, "pruner": "asha"}, allow_changes=False)
    state.new_trial({"train.learning_rate": 1e-4})
    for folder in ("_spend", "_bench", "_prepared", "_prices", "_other"):
        store.put_bytes(f"{folder}/ledger.json", b"{}")
    store.put_bytes("_bench/x/ledger.json", b"{}")


@pytest.fixture(params=["local", "s3"])
def filled(request, tmp_path):
    """(storage uri, extra CLI args) of a filled store: a folder, and a bucket on moto's S3 server."""
    if request.param == "local":
        _fill(LocalStore(tmp_path / "runs"))
        return str(tmp_path / "runs"), []
    store = request.getfixturevalue("s3_store")
    _fill(store)
    return store.uri, ["--endpoint-url", request.getfixturevalue("s3_server").endpoint_url]


# -- ls ---------------------------------------------------------------------------------------------------------


def test_ls_lists_jobs_and_sweeps_newest_first_with_a_corrupt_ledger_as_one_row(filled):
    uri, extra = filled
    done = _cli("ls", uri, *extra)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert rows[0][:4] == ["name", "kind", "status", "attempts"]
    names = [r[0] for r in rows[1:]]
    assert sorted(names) == ["broken", "new", "old", "sw"], done.stdout  # no _-prefixed folder
    assert names.index("new") < names.index("old") and names[-1] == "broken", done.stdout  # newest first
    new = rows[1 + names.index("new")]
    assert new[1:6] == ["job", "completed", "1", "40", "$0.5000"], new
    broken = done.stdout.splitlines()[1 + names.index("broken")]
    assert "corrupt: 'attempts' is a JSON int, not a list" in broken
    sweep = rows[1 + names.index("sw")]
    assert sweep[1:3] == ["sweep", "running"] and "1 running" in " ".join(sweep), sweep


def test_ls_json_by_name(filled):
    uri, extra = filled
    done = _cli("ls", "--json", uri, "--sort", "name", *extra)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["name"] for r in rows] == ["broken", "new", "old", "sw"]
    old = rows[2]
    assert (old["kind"], old["status"], old["attempts"], old["step"], old["cost_usd"]) == ("job", "preempted", 1, 25, 0.25)
    assert rows[0]["status"].startswith("corrupt: ") and rows[3]["kind"] == "sweep" and rows[3]["attempts"] == 1


def test_ls_refuses_a_missing_folder(tmp_path, capsys):
    assert ls_cli.main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith("error: no store at ")


# -- the submission record ----------------------------------------------------------------------------------------


def _fake_tools(tmp_path: Path, monkeypatch, *names: str, stdout: str = "") -> Path:
    """A folder of shell scripts named ``names`` first on PATH, each appending its argv (one JSON list a line) to
    calls.jsonl and printing ``stdout``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls.jsonl"
    for name in names:
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\n{sys.executable} -c \'import json, sys; print(json.dumps(sys.argv[1:]))\' '
                          f'"$(basename "$0")" "$@" >> {calls}\nprintf "%s" {json.dumps(stdout)}\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def _calls(calls: Path) -> list[list[str]]:
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_a_slurm_submission_records_its_job_id_and_log(tmp_path, monkeypatch, capsys):
    from orchestrator.backends import run_backend

    monkeypatch.chdir(tmp_path)
    calls = _fake_tools(tmp_path, monkeypatch, "sbatch", stdout="4242;cluster")
    cfg, overrides = compose("slurm", f"storage.uri={tmp_path / 'runs'}", "storage.endpoint_url=null",
                             f"run.work_dir={tmp_path / 'work'}")
    assert run_backend(cfg, overrides) == 0
    assert _calls(calls)[0][:2] == ["sbatch", "--parsable"]
    record = read_submission(LocalStore(tmp_path / "runs"), "exp1")
    assert (record.backend, record.job_id, record.host) == ("slurm", "4242", socket.gethostname())
    assert record.log == str(tmp_path / "work" / "slurm" / "exp1-4242.out")
    assert record.job_log == str(tmp_path / "work" / "exp1" / "job.log")


def test_a_kubernetes_submission_records_namespace_name_and_kind(tmp_path):
    cfg, _ = compose("kubernetes", f"storage.uri={tmp_path / 'runs'}", "storage.endpoint_url=null",
                     "+backend.extra.namespace=train")
    record_submission(cfg, "kubernetes", "train/exp1")
    record = read_submission(LocalStore(tmp_path / "runs"), "exp1")
    assert (record.backend, record.job_id, record.kind, record.job_log) == ("kubernetes", "train/exp1", "Job", None)


def test_a_corrupt_submission_record_is_one_error_line(tmp_path, capsys):
    store = LocalStore(tmp_path / "runs")
    store.put_bytes("exp1/submission.json", b'{"version": 1, "run_name": "exp1", "backend": "pbs", "job_id": "1"}')
    for main in (cancel_cli.main, logs_cli.main):
        assert main([f"{store.uri}/exp1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "submission.json is corrupt" in err and "'backend'" in err, err


# -- cancel and logs through the engines' tools -------------------------------------------------------------------


def _submitted(tmp_path: Path, backend: str, job_id: str, **fields) -> str:
    store = LocalStore(tmp_path / "runs")
    write_submission(store, SubmissionRecord(run_name="exp1", backend=backend, job_id=job_id, host="login-1",
                                             pid=99, submitted_at=time.time(), **fields))
    return f"{store.uri}/exp1"


@pytest.mark.parametrize("backend, job_id, kind, expected", [
    ("slurm", "4242", None, ["scancel", "4242"]),
    ("skypilot", "exp1", None, ["sky", "jobs", "cancel", "-y", "exp1"]),
    ("kubernetes", "train/exp1", "Job", ["kubectl", "delete", "job", "exp1", "-n", "train", "--wait=false"]),
    ("kubernetes", "train/exp1", "JobSet", ["kubectl", "delete", "jobset", "exp1", "-n", "train", "--wait=false"]),
])
def test_cancel_runs_the_engines_command(tmp_path, monkeypatch, capsys, backend, job_id, kind, expected):
    uri = _submitted(tmp_path, backend, job_id, kind=kind)
    calls = _fake_tools(tmp_path, monkeypatch, expected[0])
    assert cancel_cli.main([uri]) == 0
    assert _calls(calls) == [expected]
    assert f"cancelled 'exp1' ({backend} job {job_id})" in capsys.readouterr().out


def test_cancel_without_the_tool_names_the_command(tmp_path, monkeypatch, capsys):
    uri = _submitted(tmp_path, "slurm", "4242")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert cancel_cli.main([uri]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: scancel is not on PATH here") and "`scancel 4242`" in err


def test_cancel_reports_the_engines_refusal(tmp_path, monkeypatch, capsys):
    uri = _submitted(tmp_path, "slurm", "4242")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text("#!/bin/sh\necho 'scancel: error: Invalid job id specified' >&2\nexit 1\n")
    (bin_dir / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert cancel_cli.main([uri]) == 1
    assert "Invalid job id specified" in capsys.readouterr().err


@pytest.mark.parametrize("backend, job_id, kind, follow, expected", [
    ("skypilot", "exp1", None, False, ["sky", "jobs", "logs", "--no-follow", "exp1"]),
    ("skypilot", "exp1", None, True, ["sky", "jobs", "logs", "exp1"]),
    ("kubernetes", "train/exp1", "Job", True, ["kubectl", "logs", "-n", "train", "job/exp1", "--tail=40", "-f"]),
    ("kubernetes", "train/exp1", "JobSet", False,
     ["kubectl", "logs", "-n", "train", "-l", "jobset.sigs.k8s.io/jobset-name=exp1", "--prefix", "--tail=40"]),
])
def test_logs_runs_the_engines_command(tmp_path, monkeypatch, capfd, backend, job_id, kind, follow, expected):
    uri = _submitted(tmp_path, backend, job_id, kind=kind)
    calls = _fake_tools(tmp_path, monkeypatch, expected[0], stdout="a line of the log")
    assert logs_cli.main([uri, *(["-f"] if follow else [])]) == 0
    assert _calls(calls) == [expected]
    out, err = capfd.readouterr()
    assert "a line of the log" in out and expected[0] in err


def test_logs_without_the_tool_prints_the_command(tmp_path, monkeypatch, capsys):
    uri = _submitted(tmp_path, "skypilot", "exp1")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert logs_cli.main([uri]) == 1
    assert "run: sky jobs logs --no-follow exp1" in capsys.readouterr().out


def test_logs_tails_a_slurm_output_on_this_machine_else_names_it(tmp_path, capsys):
    out = tmp_path / "work" / "slurm" / "exp1-4242.out"
    uri = _submitted(tmp_path, "slurm", "4242", log=str(out), job_log=str(tmp_path / "work" / "exp1" / "job.log"))
    assert logs_cli.main([uri]) == 1
    said = capsys.readouterr().out
    assert str(out) in said and "not on this machine" in said and f"tail -n 40 {out}" in said
    out.parent.mkdir(parents=True)
    assert logs_cli.main([uri]) == 1
    assert f"no log at {out} or " in capsys.readouterr().out  # its folder is here: not written yet
    out.write_text("".join(f"line {i}\n" for i in range(100)))
    assert logs_cli.main([uri, "-n", "3"]) == 0
    printed = capsys.readouterr()
    assert printed.out == "line 97\nline 98\nline 99\n" and "Slurm's batch output" in printed.err


# -- the local backend, end to end --------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("found_by", ["record", "ledger"])
def test_cancel_stops_a_local_job_which_is_not_requeued(tmp_path, found_by):
    storage = jobs.Storage(str(tmp_path / "runs"))
    overrides = jobs.with_overrides(jobs.FAST, "train.max_steps=2000", *storage.overrides(), "run.name=slow",
                                    f"run.work_dir={tmp_path / 'work'}")
    proc = jobs.start_job(overrides, tmp_path)
    try:
        jobs.wait_for_new_checkpoint(storage, "slow", proc, 0, timeout=300)
        record = read_submission(storage.store(), "slow")
        assert (record.backend, record.pid, record.host) == ("local", proc.pid, socket.gethostname())
        assert record.pid_started == process_started(proc.pid)
        assert record.job_log == str(tmp_path / "work" / "slow" / "job.log")
        shown = _cli("logs", f"{storage.uri}/slow", "-n", "5")  # the worker's job.log, or where it will be
        assert str(tmp_path / "work" / "slow" / "job.log") in shown.stdout + shown.stderr, shown
        if found_by == "ledger":  # a job launched before the record existed: its running attempt names the supervisor
            storage.store().delete("slow/submission.json")
        done = _cli("cancel", f"{storage.uri}/slow")
        assert done.returncode == 0, done.stderr
        assert f"sent SIGTERM to its supervisor, pid {proc.pid}" in done.stdout
        assert proc.wait(120) == 75  # preempted: the worker committed and stopped; no further attempt
    finally:
        if proc.poll() is None:
            jobs.kill_group(proc)
    time.sleep(1.5)  # a requeue would have begun another attempt by now (backoff 0.2 s)
    ledger = jobs.ledger(storage, "slow")
    assert [a["exit_class"] for a in ledger["attempts"]] == ["preempted"], ledger["attempts"]
    assert ledger["status"] == "preempted" and ledger["step"] < 2000
    assert "not requeued: this supervisor received SIGTERM" in jobs.log_text(tmp_path)
    again = _cli("cancel", f"{storage.uri}/slow")
    assert again.returncode == 0 and "nothing to cancel" in again.stdout, again.stdout
    assert ("has ended" if found_by == "record" else "no local supervisor is recorded as running") in again.stdout


def test_cancel_a_local_job_on_another_host_or_gone(tmp_path, capsys):
    uri = _submitted(tmp_path, "local", "99")
    assert cancel_cli.main([uri]) == 1
    assert "on login-1 (pid 99), not on this host" in capsys.readouterr().err
    store = LocalStore(tmp_path / "runs")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        # the record names this host and a pid now held by another process (a different start time): never signalled
        write_submission(store, SubmissionRecord(run_name="exp1", backend="local", job_id=str(sleeper.pid),
                                                 host=socket.gethostname(), pid=sleeper.pid, submitted_at=time.time(),
                                                 pid_started=(process_started(sleeper.pid) or 0) - 1))
        assert cancel_cli.main([uri]) == 0
        assert "nothing to cancel" in capsys.readouterr().out
        assert sleeper.poll() is None
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()


def test_cancel_without_a_record_finds_the_supervisor_in_the_ledger(tmp_path, monkeypatch, capsys):
    """A job launched before the submission record existed: its running attempt names its supervisor."""
    store = LocalStore(tmp_path / "runs")
    monkeypatch.setenv("ORCH_SUPERVISOR_TOKEN", "gpu-box-7:4321:2")
    Ledger(store, "exp1").begin_attempt(host="gpu-box-7", pid=4400, instance_type=None, gpu_type="a10g", gpus=1,
                                        spot=True, checkpoint_step=0)
    assert cancel_cli.main([f"{store.uri}/exp1"]) == 1
    assert "on gpu-box-7 (pid 4321), not on this host" in capsys.readouterr().err


def test_logs_follows_a_local_job_log_until_its_supervisor_ends(tmp_path):
    log = tmp_path / "work" / "exp1" / "job.log"
    log.parent.mkdir(parents=True)
    log.write_text("first\n")
    supervisor = subprocess.Popen(["sleep", "60"])  # stands in for the launcher: the record names its pid
    try:
        store = LocalStore(tmp_path / "runs")
        write_submission(store, SubmissionRecord(run_name="exp1", backend="local", job_id=str(supervisor.pid),
                                                 host=socket.gethostname(), pid=supervisor.pid, submitted_at=time.time(),
                                                 pid_started=process_started(supervisor.pid), job_log=str(log)))
        following = subprocess.Popen([sys.executable, "-m", "orchestrator", "logs", "-f", f"{store.uri}/exp1"],
                                     cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2.0)
        with open(log, "a") as f:
            f.write("second\n")
        time.sleep(1.0)
        assert following.poll() is None, "it follows while the supervisor lives"
        with open(log, "a") as f:
            f.write("last\n")
        supervisor.kill()
        supervisor.wait()
        out, err = following.communicate(timeout=30)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    assert following.returncode == 0, err
    assert out == "first\nsecond\nlast\n" and f"==> {log} (the worker's log, local job {supervisor.pid}" in err


def test_cancel_by_the_ledger_signals_only_an_orchestrator_process(tmp_path, monkeypatch, capsys):
    """A pid from the ledger alone, now held by a process that is not the orchestrator's: never signalled."""
    store = LocalStore(tmp_path / "runs")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        monkeypatch.setenv("ORCH_SUPERVISOR_TOKEN", f"{socket.gethostname()}:{sleeper.pid}:1")
        Ledger(store, "exp1").begin_attempt(host=socket.gethostname(), pid=sleeper.pid, instance_type=None,
                                            gpu_type="a10g", gpus=1, spot=True, checkpoint_step=0)
        assert cancel_cli.main([f"{store.uri}/exp1"]) == 0
        assert "nothing to cancel" in capsys.readouterr().out
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
