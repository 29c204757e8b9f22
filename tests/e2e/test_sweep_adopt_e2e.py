"""A sweep driver SIGKILLed while its trial trains, and rerun: the new driver adopts the launcher the dead one
left running (local backend: it owns the trial) instead of launching the trial a second time. Real launcher,
real tiny-model trial, real SIGKILL."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import jobs

pytestmark = pytest.mark.e2e

SWEEP = [
    "-m", "sweep.name=adopt", "sweep.budget_usd=2", "sweep.n_trials=1", "sweep.max_parallel=1",
    "sweep.metric=eval_loss", "train.learning_rate=1e-3,2e-3", "train.max_steps=12", "train.logging_steps=4",
    "data.num_examples=100", "checkpoint.every=off", "checkpoint.every_steps=4", "preemption.provider=none",
    "tracking.enabled=false", "train.eval_at_end=false",
]


def read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_rerun_driver_adopts_the_running_launcher_instead_of_starting_the_trial_again(tmp_path):
    env = jobs.job_env(tmp_path, {"ORCH_STEP_DELAY_SECONDS": "1.0"})
    cmd = jobs.launch_cmd(SWEEP + [f"storage.uri={tmp_path / 'runs'}", f"run.work_dir={tmp_path / 'work'}"])
    driver = jobs.start_cmd(cmd, tmp_path, tmp_path / "driver.log", env=env)  # forked from the warm zygote
    ledger_path = tmp_path / "runs" / "adopt-t0" / "ledger.json"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and driver.poll() is None:
        attempts = read(ledger_path).get("attempts") or []
        if attempts and attempts[-1].get("exit_class") == "running":
            break
        time.sleep(0.2)
    assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
    launcher = read(tmp_path / "runs" / "adopt" / "sweep.json")["trials"][0].get("launcher") or {}
    driver.send_signal(signal.SIGKILL)  # the trial's launcher (its supervisor and worker) lives on
    driver.wait(30)
    try:
        rerun = jobs.run_cmd(cmd, tmp_path, env=env, timeout=900)
    finally:
        if launcher and psutil.pid_exists(launcher["pid"]):
            psutil.Process(launcher["pid"]).kill()
    out = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, out[-4000:]
    trial = read(tmp_path / "runs" / "adopt" / "sweep.json")["trials"][0]
    assert trial["launches"] == 1 and trial["status"] == "completed" and "0" in trial["values"], trial
    attempts = read(ledger_path)["attempts"]
    assert len(attempts) == 1 and attempts[0]["exit_class"] == "completed", attempts  # trained once, not twice
    assert "was launched by an earlier driver and still runs" in out
