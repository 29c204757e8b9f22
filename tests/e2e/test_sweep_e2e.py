"""A sweep end to end: real trials (``python -m orchestrator.launch`` subprocesses), real SIGKILLs.

One ASHA sweep runs uninterrupted; a second with the same seed has every trial's worker SIGKILLed at least
once and its driver SIGKILLed and rerun mid-sweep. Both must decide the same (the same promotions, the same
metric per rung, the same leader), no trial may start again from scratch, and the spend stays within the
budget. Kept small (4 trials, 2 at once, rungs at 8 and 24 steps of the tiny model; the two sweeps run side by
side).
"""
from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import jobs
from tests.helpers.sweeps import SWEEP, kill_each_trial_once, state, trial_ledger

pytestmark = pytest.mark.e2e


def sweep_cmd(tmp_path: Path, name: str) -> list[str]:
    return jobs.launch_cmd(SWEEP + [f"sweep.name={name}", f"storage.uri={tmp_path / 'runs'}",
                                    f"run.work_dir={tmp_path / 'work'}"])


def decisions(doc: dict) -> list[tuple]:
    return sorted((d["trial"], d["rung"], d["decision"]) for d in doc["decisions"])


def test_an_asha_sweep_killed_everywhere_decides_as_the_uninterrupted_one(tmp_path):
    env = jobs.job_env(tmp_path, {"ORCH_STEP_DELAY_SECONDS": "0.25"})
    # the uninterrupted sweep runs beside the killed one (its decisions depend on metrics, not on timing): the
    # two share the machine's idle time (steps' floors, start-ups waiting on disk) instead of taking turns
    started = time.monotonic()
    # the drivers are forked from the test's warm interpreter (tests/helpers/zygote.py), as every job here is
    calm = jobs.start_cmd(sweep_cmd(tmp_path, "calm"), tmp_path, tmp_path / "calm.log", env=env)
    calm_seconds = None

    killed: set[str] = set()
    driver = jobs.start_cmd(sweep_cmd(tmp_path, "chaos"), tmp_path, tmp_path / "driver.log", env=env)
    driver_killed = False
    deadline = time.monotonic() + 1500
    while driver.poll() is None and time.monotonic() < deadline:
        if calm_seconds is None and calm.poll() is not None:
            calm_seconds = time.monotonic() - started
        kill_each_trial_once(tmp_path, "chaos", driver, killed)
        path = tmp_path / "runs" / "chaos" / "sweep.json"
        if not driver_killed and path.exists() and len(state(tmp_path, "chaos")["decisions"]) >= 1:
            driver.send_signal(signal.SIGKILL)  # the driver vanishes mid-sweep; rerun the same command
            driver.wait(30)
            driver_killed = True
            driver = jobs.start_cmd(sweep_cmd(tmp_path, "chaos"), tmp_path, tmp_path / "driver.log", env=env)
        time.sleep(0.2)
    assert driver.wait(30) == 0, (tmp_path / "driver.log").read_text()[-4000:]
    assert calm.wait(max(30.0, deadline - time.monotonic())) == 0, (tmp_path / "calm.log").read_text()[-4000:]
    calm_seconds = calm_seconds or time.monotonic() - started
    calm_stdout = (tmp_path / "calm.log").read_text()
    print(f"uninterrupted sweep: {calm_seconds:.0f} s; both: {time.monotonic() - started:.0f} s")

    a, b = state(tmp_path, "calm"), state(tmp_path, "chaos")
    assert driver_killed and killed == {f"chaos-t{k}" for k in range(4)}
    # numbering continued: four trials, each once, with the uninterrupted sweep's parameters
    assert [t["number"] for t in b["trials"]] == [0, 1, 2, 3]
    assert [t["params"] for t in b["trials"]] == [t["params"] for t in a["trials"]]
    assert decisions(b) == decisions(a) and any(d[2] == "prune" for d in decisions(a))
    for ta, tb in zip(a["trials"], b["trials"]):
        assert tb["values"] == pytest.approx(ta["values"], abs=1e-6), (ta, tb)
        assert tb["status"] == ta["status"]
    for t in b["trials"]:
        attempts = trial_ledger(tmp_path, t["run_name"])["attempts"]
        for i, attempt in enumerate(attempts[1:], 1):  # every later attempt starts at the newest commit
            committed = max(x["checkpoint_step_end"] for x in attempts[:i])
            assert attempt["step_start"] == committed, (t["run_name"], attempts)
        # the SIGKILL landed after a commit: the attempt after it went on from there, not from step 0
        assert any(a["step_start"] > 0 for a in attempts[1:]), (t["run_name"], attempts)
    status = subprocess.run([jobs.PYTHON, "-m", "orchestrator", "status", str(tmp_path / "runs" / "chaos")],
                            env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "leader: t" in status.stdout, status.stdout + status.stderr
    leader_a = [line for line in calm_stdout.splitlines() if line.startswith("leader:")]
    assert leader_a and leader_a[0].replace("calm-t", "chaos-t") in status.stdout  # the same trial leads
    spent = float(status.stdout.split("spent $")[1].split()[0])
    assert 0 < spent <= 2.0  # the budget does not bind here: test_sweep_budget_e2e.py holds a sweep to one that does
    # the workers' idle share of paid slot time, measured (printed with -s; the issue's bar is 5% for 16 trials)
    for name, doc in (("uninterrupted", a), ("killed", b)):
        usage = doc["usage"]
        print(f"{name} sweep: workers idle {usage['idle_seconds'] / usage['slot_seconds']:.1%} of slot time")


HYPERBAND = [
    "sweep=asha", "sweep.pruner=hyperband", "sweep.n_trials=3", "sweep.max_parallel=3", "sweep.seed=3",
    "sweep.budget_usd=2", "sweep.min_fraction=0.25", "sweep.reduction_factor=2", "sweep.metric=eval_loss",
    "train.learning_rate=tag(log, interval(1e-3,3e-2))", "train.max_steps=8", "train.logging_steps=2",
    "data.num_examples=64", "checkpoint.every=off", "checkpoint.every_steps=2", "preemption.provider=none",
    "tracking.enabled=false", "train.eval_at_end=false",
]


def test_a_hyperband_sweep_runs_each_trial_to_its_own_brackets_rungs_and_resumes_promoted_ones(tmp_path):
    """Rungs at steps 2, 4, 8: trials 0, 1, 2 fall in Optuna's brackets 1, 2, 0, so t2 pauses at 2 and 4, t0 first
    at 4, t1 runs straight to 8; each promoted trial's next launch resumes at the step its rung committed."""
    from orchestrator.sweep import decide

    name = "hb"
    cmd = jobs.launch_cmd(HYPERBAND + [f"sweep.name={name}", f"storage.uri={tmp_path / 'runs'}",
                                       f"run.work_dir={tmp_path / 'work'}"])
    done = jobs.run_cmd(cmd, tmp_path, timeout=900, fresh=True)  # a fresh driver: what it imports is measured below
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = state(tmp_path, name)
    assert [decide.bracket(doc["settings"], k) for k in range(3)] == [1, 2, 0]
    rungs = {0: [4, 8], 1: [8], 2: [2, 4, 8]}  # each trial's bracket's rungs
    for t in doc["trials"]:
        ledger = trial_ledger(tmp_path, t["run_name"])
        steps = rungs[t["number"]]
        assert ledger["status"] == "completed" and ledger["step"] == 8, (t, ledger.get("status"))
        evals = {int(s) for s in ledger["quality"]["evals"]} - {0}  # step 0: the "before training" evaluation
        assert set(steps) <= evals and min(evals) == steps[0], (t["run_name"], evals)  # none before its first rung
        assert sorted(t["values"]) == [str(r) for r in range(len(steps))]  # a result at each of them
        attempts = ledger["attempts"]
        assert [a["step_start"] for a in attempts] == [0, *steps[:-1]], (t["run_name"], attempts)
        for i, attempt in enumerate(attempts[1:], 1):  # the promoted trial went on from its rung's checkpoint
            assert attempt["step_start"] == max(x["checkpoint_step_end"] for x in attempts[:i])
    # every launch of a trial is forked from the driver, which imported the training stack once: no trial's
    # attempt pays that import again (a fresh launcher's first attempt inherits all of it)
    imported = re.search(r"training stack imported once \(([0-9.]+) CPU-s\): trials' launchers are forked from "
                         r"this sweep driver", done.stdout + done.stderr)
    assert imported, (done.stdout + done.stderr)[-3000:]
    spent = [a["extra"]["restart"]["cpu_s"] for t in doc["trials"]
             for a in trial_ledger(tmp_path, t["run_name"])["attempts"]]
    assert len(spent) == 6 and max(spent) < 0.5 * float(imported.group(1)), (imported.group(0), spent)
    made = sorted((d["trial"], d["rung"], d["decision"]) for d in doc["decisions"])
    assert made == [(0, 0, "promote"), (0, 1, "complete"), (1, 0, "complete"),
                    (2, 0, "promote"), (2, 1, "promote"), (2, 2, "complete")]
    assert "bracket 2 rung 0" in done.stdout and "at step 8" in done.stdout
