"""Shared by the tests: a sweep's command line, its record, and killing each trial once."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psutil

SWEEP = [
    "sweep=asha", "sweep.n_trials=4", "sweep.max_parallel=2", "sweep.seed=3", "sweep.budget_usd=2",
    "sweep.min_fraction=0.34", "sweep.reduction_factor=3", "sweep.metric=eval_loss",
    "train.learning_rate=tag(log, interval(1e-3,3e-2))",
    "train.max_steps=24", "train.logging_steps=4", "data.num_examples=200", "checkpoint.every=off",
    "checkpoint.every_steps=2", "preemption.provider=none", "tracking.enabled=false",
    "requeue.backoff_base_seconds=0.2", "train.eval_at_end=false",
]


def state(tmp_path: Path, name: str) -> dict:
    return json.loads((tmp_path / "runs" / name / "sweep.json").read_text())


def kill_each_trial_once(tmp_path: Path, name: str, driver: subprocess.Popen, killed: set[str]) -> None:
    """SIGKILL a trial's worker once it committed a checkpoint in its running attempt (then it must resume)."""
    for k in range(4):
        run = f"{name}-t{k}"
        if run in killed:
            continue
        attempts = trial_ledger(tmp_path, run).get("attempts") or [{}]
        last = attempts[-1]
        if last.get("exit_class") == "running" and last.get("checkpoint_step_end", 0) > last.get("step_start", 0):
            for p in workers_of(run):
                p.kill()
                killed.add(run)


def trial_ledger(tmp_path: Path, run: str) -> dict:
    path = tmp_path / "runs" / run / "ledger.json"
    return json.loads(path.read_text()) if path.exists() else {}


def workers_of(run: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "orchestrator.worker" in cmd and f"run.name={run}" in cmd:
            out.append(p)
    return out
