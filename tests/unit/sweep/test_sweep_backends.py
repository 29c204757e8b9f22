"""A trial handed to a scheduler (Slurm, SkyPilot, Kubernetes) is waited on through its ledger, not its launcher:
the launcher's exit 0 means "submitted"; the trial ends when an attempt of this submission leaves a final status.
Ledgers here are real files in a local store, written as the job machinery writes them."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.core import exitcodes
from orchestrator.storage.local import LocalStore
from orchestrator.sweep.backends import SubmittedTrial, attempts_so_far


def write(store, run: str, status: str, classes: list[str]) -> None:
    attempts = [{"fence": i + 1, "exit_class": c, "step_start": 0, "step_end": 4} for i, c in enumerate(classes)]
    store.put_bytes(f"{run}/ledger.json", json.dumps({"run_name": run, "status": status, "attempts": attempts}).encode())


def done_launcher(code: int = 0) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait()
    return proc


def test_a_submitted_trial_ends_with_its_ledger_not_with_its_launcher(tmp_path):
    store = LocalStore(tmp_path)
    write(store, "s-t0", "budget_exhausted", ["budget_exhausted"])  # paused at rung 0 before this submission
    before = attempts_so_far(store, "s-t0")
    trial = SubmittedTrial(done_launcher(0), store, "s-t0", before)
    assert trial.poll() is None  # submitted and queued: the old pause is not this submission's end
    write(store, "s-t0", "running", ["budget_exhausted", "running"])
    assert trial.poll() is None
    write(store, "s-t0", "preempted", ["budget_exhausted", "preempted"])  # requeued by the engine: still running
    assert trial.poll() is None
    write(store, "s-t0", "running", ["budget_exhausted", "preempted", "running"])
    assert trial.poll() is None
    write(store, "s-t0", "budget_exhausted", ["budget_exhausted", "preempted", "budget_exhausted"])
    assert trial.poll() == exitcodes.BUDGET_EXHAUSTED  # paused at its next rung
    write(store, "s-t0", "completed", ["budget_exhausted", "preempted", "completed"])
    assert SubmittedTrial(None, store, "s-t0", before).poll() == exitcodes.COMPLETED  # adopted after a relaunch


def test_a_refused_submission_is_the_trials_outcome_and_a_crash_waits_for_the_engines_requeue(tmp_path):
    store = LocalStore(tmp_path)
    assert SubmittedTrial(done_launcher(4), store, "s-t1", 0).poll() == 4
    now = [0.0]
    trial = SubmittedTrial(None, store, "s-t1", 0, settle=60, clock=lambda: now[0])
    write(store, "s-t1", "failed", ["crashed"])
    assert trial.poll() is None
    now[0] = 59
    assert trial.poll() is None
    write(store, "s-t1", "failed", ["crashed", "crashed"])  # the engine requeued it; it crashed again
    now[0] = 100
    assert trial.poll() is None  # the settle clock restarts with each new attempt
    now[0] = 160
    assert trial.poll() == exitcodes.CRASHED


@pytest.mark.parametrize("raw,needle", [(b'{"attempts": "nonsense"}', "'attempts' is a JSON str, not a list"),
                                        (b'[1, 2]', "is a JSON list, not an object"), (b'{"att', "is not JSON")])
def test_an_unreadable_ledger_refuses_that_trial_with_a_message_naming_it(tmp_path, raw, needle):
    """Waiting on it would wait for ever, and reading it raised a traceback: the driver refuses that trial only."""
    from orchestrator.sweep.trust import TrialRefused

    store = LocalStore(tmp_path)
    store.put_bytes("s-t2/ledger.json", raw)
    for read in (lambda: SubmittedTrial(None, store, "s-t2", 0).poll(), lambda: attempts_so_far(store, "s-t2")):
        with pytest.raises(TrialRefused) as err:
            read()
        assert needle in str(err.value) and store.get_uri("s-t2/ledger.json") in str(err.value)
