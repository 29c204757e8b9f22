"""A grid sweep with ``-m`` on the test Slurm cluster: each trial is a Slurm job (the launcher returns at
``sbatch``; the driver waits on the trial's ledger), two run at once (``sweep.max_parallel=2``), all complete."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.helpers import jobs
from tests.helpers.slurm_cluster import ensure_slurm

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.xdist_group("slurm")]

GRID = ["-m", "train.learning_rate=1e-3,3e-3", "backend=slurm", "sweep.name=slurm-grid", "sweep.budget_usd=5",
        "sweep.max_parallel=2", "sweep.metric=eval_loss", "train.max_steps=30", "train.logging_steps=10",
        "data.num_examples=120", "checkpoint.every=off", "checkpoint.every_steps=10", "preemption.provider=none",
        "tracking.enabled=false", "train.eval_at_end=false", "compute.price_per_hour=1"]


def test_a_grid_sweep_runs_its_trials_as_slurm_jobs_two_at_once(tmp_path):
    ensure_slurm()
    env = jobs.job_env(tmp_path, {"ORCH_STEP_DELAY_SECONDS": "0.3"})  # long enough for the two to overlap
    done = subprocess.run(jobs.launch_cmd(GRID + [f"storage.uri={tmp_path / 'runs'}"]), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    state = json.loads((tmp_path / "runs" / "slurm-grid" / "sweep.json").read_text())
    assert [t["status"] for t in state["trials"]] == ["completed", "completed"], state["trials"]
    spans = []
    for t in state["trials"]:
        log = next((tmp_path / ".cache" / "work" / "sweeps" / "slurm-grid").glob(f"t{t['number']}.log")).read_text()
        assert re.search(r"submitted .* to slurm: job \d+", log), log[-2000:]  # the trial was a Slurm job
        ledger = json.loads((tmp_path / "runs" / t["run_name"] / "ledger.json").read_text())
        assert ledger["status"] == "completed" and ledger["step"] == 30 and "0" in t["values"]
        spans.append((ledger["attempts"][0]["started_at"], ledger["attempts"][-1]["ended_at"]))
    (a0, a1), (b0, b1) = spans
    assert max(a0, b0) < min(a1, b1), spans  # the two trials trained at the same time
