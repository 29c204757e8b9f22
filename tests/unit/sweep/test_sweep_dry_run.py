"""A sweep with ``backend.dry_run=true`` prints what each trial of its first round would submit (the trial's own
sampled values, through the backend's own dry-run printing) and writes nothing: no sweep record, no trial ledger,
no spend reservation, no trial log. It exits 0 in seconds; it used to wait forever on trials a dry run never
starts, with its record in the folder of the job named like the sweep.

A sweep named like a finished ordinary job (its ledger under that name) is refused before anything is written:
the sweep's record would land in the job's folder."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import launch
from tests.helpers.jobs import job_env

GRID = ["-m", "train.learning_rate=1e-4,2e-4", "sweep.budget_usd=1", "tracking.enabled=false"]
ASHA = ["sweep=asha", "train.learning_rate=tag(log, interval(1e-4,1e-2))", "sweep.n_trials=3", "train.max_steps=40",
        "sweep.budget_usd=1", "tracking.enabled=false"]
RENDERED = {"slurm": "#!/bin/bash", "local": "-m orchestrator.worker", "kubernetes": "kind: Job",
            "skypilot": "run:"}
LR = re.compile(r"train\.learning_rate=([0-9.e+-]+)")


def files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root`` with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def dry_run(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "orchestrator.launch", *args, "backend.dry_run=true"],
                            cwd=tmp_path, env=job_env(tmp_path), capture_output=True, text=True, timeout=120)
    return result, time.monotonic() - start


def trials(stdout: str, backend: str, name: str) -> dict[int, str]:
    """The rendered submission of each trial, by trial number: what follows the trial's heading."""
    parts = re.split(r"^# trial (\d+) of sweep \S+", stdout, flags=re.M)
    out = {int(number): text for number, text in zip(parts[1::2], parts[2::2])}
    for number, text in out.items():
        assert text.count(RENDERED[backend]) == 1, (backend, number, text)  # the backend's own rendering, once
        assert f"run.name={name}-t{number}" in text, text
        assert "backend.dry_run" not in text, text  # the commands a run would run, not the dry run's
    return out


def learning_rate(text: str) -> float:
    values = {float(v) for v in LR.findall(text)}
    assert len(values) == 1, text  # the heading, the driver's command and the submission agree
    return values.pop()


def existing_job(store_uri: str, name: str = "default") -> None:
    """A finished ordinary job named ``name`` in the store (its ledger)."""
    from orchestrator.records.ledger import Ledger
    from orchestrator.storage import open_store

    ledger = Ledger(open_store(store_uri), name)
    ledger.begin_attempt(host="h", pid=1, instance_type="cpu", gpu_type="none", gpus=0, spot=False, checkpoint_step=0)
    ledger.end_attempt("completed", step=40, cost_usd=0.0, status="completed")


@pytest.mark.parametrize("backend", ["slurm", "local"])
def test_a_dry_run_grid_sweep_prints_each_trials_submission_and_writes_nothing(backend, tmp_path):
    """The reported command, with the default storage and work folders under the current directory (another
    job's record already there)."""
    existing_job(str(tmp_path / ".cache" / "runs"), "other")
    before = files(tmp_path)
    result, seconds = dry_run([*GRID, f"backend={backend}"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert seconds < 60
    found = trials(result.stdout, backend, "default")
    assert sorted(found) == [0, 1]
    assert sorted(learning_rate(text) for text in found.values()) == [1e-4, 2e-4]
    assert files(tmp_path) == before  # no sweep.json, no trial ledger, no spend index, no trial log


def test_a_dry_run_asha_sweep_prints_every_trial_at_its_first_rung(tmp_path):
    before = files(tmp_path)
    result, seconds = dry_run([*ASHA, "backend=slurm", "sweep.name=lr"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert seconds < 60
    found = trials(result.stdout, "slurm", "lr")
    assert sorted(found) == [0, 1, 2]
    rates = [learning_rate(found[k]) for k in range(3)]
    assert len(set(rates)) == 3 and all(1e-4 <= r <= 1e-2 for r in rates)
    assert all("train.pause_at_step=10" in text for text in found.values())  # rung 0: a quarter of 40 steps
    assert files(tmp_path) == before
    from orchestrator.sweep.plan import plan_sweep
    from orchestrator.sweep.trust import rederive

    plan = plan_sweep([*ASHA, "backend=slurm", "sweep.name=lr", "backend.dry_run=true",
                       f"storage.uri={tmp_path / '.cache' / 'runs'}"], launch.compose_for_launch)
    sampled = [rederive(plan.space, plan.settings, k)["train.learning_rate"] for k in range(3)]
    assert rates == pytest.approx(sampled)  # what the sweep itself would run, trial by trial


@pytest.mark.parametrize("backend,extra", [("kubernetes", ["backend.image=x"]), ("skypilot", [])])
def test_a_dry_run_sweep_on_a_cloud_backend_leaves_its_bucket_as_it_was(backend, extra, tmp_path, s3_server,
                                                                          s3_bucket):
    bucket, _, prefix = s3_bucket[len("s3://"):].partition("/")
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key=f"{prefix}/other/ledger.json", Body=b"{}")

    def listing():
        return sorted((o["Key"], o["ETag"]) for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))

    before, local = listing(), files(tmp_path)
    result, seconds = dry_run([*GRID, f"backend={backend}", *extra, f"storage.uri={s3_bucket}",
                               f"storage.endpoint_url={s3_server.endpoint_url}", "sweep.name=lr"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert seconds < 60
    found = trials(result.stdout, backend, "lr")
    assert sorted(learning_rate(text) for text in found.values()) == [1e-4, 2e-4]
    assert listing() == before and files(tmp_path) == local


@pytest.mark.parametrize("dry", [False, True])
def test_a_sweep_named_like_a_finished_job_is_refused_before_anything_is_written(dry, tmp_path, capsys):
    runs = tmp_path / "runs"
    existing_job(str(runs))
    before = files(tmp_path)
    code = launch.main([*GRID, f"storage.uri={runs}", f"run.work_dir={tmp_path / 'work'}",
                        *(["backend.dry_run=true"] if dry else [])])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 4
    assert len(err) == 1 and err[0].startswith("error: "), err
    for needle in ("run.name='default'", "ordinary job", str(runs / "default" / "ledger.json"), "sweep.name="):
        assert needle in err[0], (needle, err[0])
    assert files(tmp_path) == before


def test_a_dry_run_beside_a_live_driver_neither_waits_for_it_nor_touches_its_record(tmp_path):
    """A dry run takes no lease: it runs while the sweep's driver lives (a run would exit 6) and says the record is
    there, which a run would resume."""
    from orchestrator.sweep.plan import plan_sweep

    plan = plan_sweep([*GRID, "sweep.name=lr", f"storage.uri={tmp_path / '.cache' / 'runs'}"],
                      launch.compose_for_launch)  # this test is the sweep's live driver: it holds the lease
    try:
        before = files(tmp_path)
        result, seconds = dry_run([*GRID, "backend=slurm", "sweep.name=lr"], tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "sweep lr already has a record" in result.stdout and "a run resumes it" in result.stdout
        assert sorted(trials(result.stdout, "slurm", "lr")) == [0, 1]
        assert files(tmp_path) == before
    finally:
        plan.state.release()


def test_a_dry_run_renders_where_the_store_cannot_be_read(tmp_path, monkeypatch):
    """As a job's dry run, a sweep's renders on a machine without the bucket's credentials: it says what it could
    not check there (a run checks it), and does not wait out storage.retry_for."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result, seconds = dry_run([*GRID, "backend=kubernetes", "backend.image=x", "storage.uri=s3://no-such-bucket/runs",
                               "sweep.name=lr"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert seconds < 60
    assert "s3://no-such-bucket/runs could not be read" in result.stdout and "no AWS credentials" in result.stdout
    assert sorted(trials(result.stdout, "kubernetes", "lr")) == [0, 1]
