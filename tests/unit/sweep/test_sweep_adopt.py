"""A relaunched sweep driver and what the killed one left running: a launcher still alive on this host is waited
on (not started twice); a submission the record announces but that never reached the scheduler (the driver died
between writing the record and the sbatch) is launched again under the same number after a grace. Real
processes, real files in a local store; the driver's relaunch test uses the real launcher (Slurm's dry run)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from dataclasses import replace

from orchestrator.core import exitcodes
from orchestrator.records.sweep_record import Launcher, TrialEntry
from orchestrator.storage.local import LocalStore
from orchestrator.sweep import backends


def ledger(store, run: str, status: str, classes: list[str]) -> None:
    attempts = [{"fence": i + 1, "exit_class": c, "step_start": 0, "step_end": 4} for i, c in enumerate(classes)]
    doc = {"run_name": run, "status": status, "attempts": attempts}
    store.put_bytes(f"{run}/ledger.json", json.dumps(doc).encode())


def sleeper(run: str) -> subprocess.Popen:
    """A process whose command line names the trial as a launcher's does (``run.name=<run>``)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "orchestrator.launch",
                             f"run.name={run}"])


def running_trial(run: str, **extra) -> TrialEntry:
    """A running trial as the driver reads it from the record (``launcher``: a launcher's identity, as stored)."""
    who = extra.pop("launcher", None)
    return TrialEntry(number=0, run_name=run, params={}, rung=0, status="running", values={}, launches=1,
                      launcher=None if who is None else Launcher(who["host"], who["pid"], who["started"]), **extra)


def test_a_local_launcher_of_the_dead_driver_is_adopted_and_ends_with_its_ledger(tmp_path):
    store = LocalStore(tmp_path)
    proc = sleeper("s-t0")
    try:
        time.sleep(0.3)
        trial = running_trial("s-t0", submitted=None, launcher=backends.launcher_identity(proc.pid))
        watch = backends.adoptable(trial, store, submits=False, log_path=tmp_path / "t0.log")
        assert isinstance(watch, backends.AdoptedLauncher) and watch.poll() is None
        # a reused pid (another start time) or another trial's process is not the launcher
        assert backends.alive_launcher(replace(trial, launcher=replace(trial.launcher, started=1.0))) is None
        assert backends.alive_launcher(replace(trial, run_name="s-t1")) is None
        ledger(store, "s-t0", "budget_exhausted", ["budget_exhausted"])
        proc.kill()
        proc.wait()
        assert watch.poll() == exitcodes.BUDGET_EXHAUSTED  # paused at its rung: the exit code the ledger implies
        ledger(store, "s-t0", "running", ["running"])
        assert watch.poll() == backends.GONE  # killed with its trial, nothing final: launch it again
        assert backends.adoptable(trial, store, submits=False, log_path=tmp_path / "t0.log") is None
    finally:
        proc.kill()


def test_a_submission_that_never_happened_is_gone_after_the_grace_and_a_made_one_is_waited_on(tmp_path):
    # a name of its own: a launcher of another test's "s-t0" running on this host would be this trial's, alive
    run = f"s{uuid.uuid4().hex[:8]}-t0"
    store = LocalStore(tmp_path)
    log_path = tmp_path / "t0.log"
    log_path.write_bytes(f"submitted '{run}' to slurm: job 7\n".encode())  # an earlier launch's line, before the offset
    now = time.time()
    stale = running_trial(run, submitted=0, launched_at=now - 601, log_offset=log_path.stat().st_size,
                          launcher=None)
    assert backends.adoptable(stale, store, submits=True, log_path=log_path).poll() == backends.GONE
    fresh = replace(stale, launched_at=now)
    assert backends.adoptable(fresh, store, submits=True, log_path=log_path).poll() is None  # within the grace
    with open(log_path, "ab") as f:
        f.write(f"submitted '{run}' to slurm: job 8\n".encode())  # this launch's sbatch went through: queued, wait
    assert backends.adoptable(stale, store, submits=True, log_path=log_path).poll() is None
    ledger(store, run, "completed", ["completed"])
    assert backends.adoptable(replace(stale, log_offset=0), store, submits=True, log_path=log_path).poll() == 0


def test_a_relaunched_driver_launches_a_never_submitted_trial_again_under_its_number(tmp_path):
    from orchestrator import launch
    from orchestrator.sweep import decide
    from orchestrator.sweep.driver import Driver
    from orchestrator.sweep.plan import plan_sweep

    args = ["-m", "backend=slurm", "sweep.budget_usd=1", "sweep.n_trials=1",
            "train.learning_rate=1e-4,2e-4", f"storage.uri={tmp_path / 'runs'}", f"run.work_dir={tmp_path / 'work'}",
            "tracking.enabled=false"]
    plan = plan_sweep(args, launch.compose_for_launch)
    plan.fixed.append("backend.dry_run=true")  # the trial's launcher prints its sbatch script instead of running sbatch
    plan.state.new_trial(lambda trials: decide.sample(plan.space, plan.settings, trials, len(trials)))
    # the killed driver wrote the launch into the record, then died before its launcher ran sbatch
    plan.state.update(lambda d: d["trials"][0].update(submitted=0, launched_at=time.time() - 3600, log_offset=0,
                                                      launches=1, launcher=None))
    driver = Driver(plan, poll_seconds=0.1, python=sys.executable)
    doc = driver._fill(plan.state.load())
    assert list(driver.procs) == [0] and doc.trials[0].launches == 1  # first waited on, not resubmitted
    doc = driver._fill(driver._reap(doc))  # its submission is gone: launched again
    trial = doc.trials[0]
    assert len(doc.trials) == 1 and trial.launches == 2 and trial.launcher.pid > 0
    launcher = driver.procs[0].launcher
    assert launcher.wait(300) == 0
    text = (tmp_path / "work" / "sweeps" / "default" / "t0.log").read_text()
    assert "#SBATCH" in text and "run.name=default-t0" in text  # the same trial number, the same folder


def test_a_launcher_started_before_the_driver_recorded_it_is_found_by_its_command_line(tmp_path):
    """The driver wrote the launch, started the launcher and died before recording its pid."""
    store = LocalStore(tmp_path)
    launched_at = time.time()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "orchestrator.launch",
                             "run.name=s-t0"])
    try:
        time.sleep(0.3)
        trial = running_trial("s-t0", submitted=None, launched_at=launched_at, log_offset=0, launcher=None)
        watch = backends.adoptable(trial, store, submits=False, log_path=tmp_path / "t0.log")
        assert isinstance(watch, backends.AdoptedLauncher) and watch.process.pid == proc.pid
        # a launcher of the same trial started before this launch is an older one: not adopted
        assert backends.adoptable(replace(trial, launched_at=launched_at + 30), store, submits=False,
                                  log_path=tmp_path / "t0.log") is None
    finally:
        proc.kill()
        proc.wait()


def test_a_driver_whose_budget_is_spent_while_a_promoted_trial_waits_ends_instead_of_waiting(tmp_path):
    """Nothing runs, trial 0 was promoted (it waits for a worker) and the spend index says the sweep's budget is
    spent: no trial can start, so the driver ends (it used to wait for ever) and launches nothing."""
    import threading

    from orchestrator import launch
    from orchestrator.money.spend import Caps, SpendIndex
    from orchestrator.sweep.driver import Driver
    from orchestrator.sweep.plan import plan_sweep

    args = ["-m", "sweep.budget_usd=0.01", "sweep.n_trials=1", "train.learning_rate=1e-4,2e-4",
            f"storage.uri={tmp_path / 'runs'}", f"run.work_dir={tmp_path / 'work'}", "tracking.enabled=false"]
    plan = plan_sweep(args, launch.compose_for_launch)
    trial = plan.state.new_trial({"train.learning_rate": 1e-4})
    plan.state.update(lambda d: d["trials"][0].update(status="running", rung=1, values={"0": 0.5}))
    spent = SpendIndex(plan.store, Caps(trial.run_name, plan.experiment, experiment_max_usd=0.01))
    spent.reserve(1, 0.0, 0.01)
    spent.settle(1, 0.01)
    driver = Driver(plan, poll_seconds=0.05, python=sys.executable)
    assert driver._launchable(plan.state.load())  # the promoted trial waits

    ended = threading.Event()
    threading.Thread(target=lambda: (driver.run(), ended.set()), daemon=True).start()
    assert ended.wait(30), "the driver kept waiting for a budget that is spent"
    assert not driver.procs and plan.state.load().trials[0].launches == 0
