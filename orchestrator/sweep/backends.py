"""How the driver waits on a trial: its launcher process (local), or its ledger (a scheduler's backend).

``backend=local``: ``python -m orchestrator.launch`` runs the trial's supervisor and lives as long as the trial,
so its exit code is the trial's. ``backend=slurm|skypilot|kubernetes``: the launcher returns 0 once the engine
accepted the job; the trial then runs (and is requeued) on the engine's machines. The driver keeps the trial's
worker slot and reads the trial's ledger: the trial ended when an attempt begun after the submission has left
the job in a final status (completed, budget_exhausted (a paused rung), config_error, caps_reached), or
``failed`` with no new attempt for ``FAILED_SETTLE_SECONDS`` (the engine's requeue of a crash starts one
sooner). The number of attempts at submission is kept in the trial's record (``submitted``), so a relaunched
driver waits on a trial it submitted instead of submitting it twice.

The record says a trial was launched before its launcher starts (``launched_at``, and where its log then ended,
``log_offset``), and then who the launcher is (``launcher``: host, pid, start time). A relaunched driver
(``adoptable``) waits on a launcher of the dead driver that still runs on this host (found by its command line
when the driver died before recording it; local: it owns the trial, ``AdoptedLauncher``; a scheduler's: it is
still submitting) instead of starting a second one. A submission of
which nothing is known ``SUBMIT_GRACE_SECONDS`` after ``launched_at`` (no attempt in the ledger, no launcher
alive, no "submitted ... job" line in the trial's log since the launch: the driver died between writing the
record and the sbatch) is ``GONE``: the driver launches that trial again under the same number.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Optional, Union

import psutil

from orchestrator.core import exitcodes
from orchestrator.records.sweep_record import TrialEntry
from orchestrator.sweep.trust import trial_ledger

SUBMITTING = ("slurm", "skypilot", "kubernetes")
FAILED_SETTLE_SECONDS = 300.0
SUBMIT_GRACE_SECONDS = 600.0  # a launcher's start-up and sbatch (SBATCH_TIMEOUT_SECONDS) take less
GONE = "gone"  # poll(): the trial has no process and no submission: launch it again
_CODES = {
    o.ledger_status: o.exit_code
    for o in exitcodes.OUTCOMES.values()
    if o.final and o.ledger_status and o.exit_code is not None
}


def submits(cfg) -> bool:
    return str(cfg.backend.name) in SUBMITTING


def attempts_so_far(store, run_name: str) -> int:
    """The attempts in the trial's ledger (``trust.trial_ledger``: TrialRefused when it is not a ledger)."""
    return len(trial_ledger(store, run_name).record.attempts)


def launcher_identity(pid: int) -> dict:
    """What the record keeps of a launcher: enough to find it again and not mistake a reused pid for it."""
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        started = 0.0
    return {"host": socket.gethostname(), "pid": int(pid), "started": float(started)}


def alive_launcher(trial: TrialEntry) -> Optional[psutil.Process]:
    """The trial's launcher from the record, if it still runs on this host and is what a driver starts for it: the
    recorded pid and start time, a ``python -m orchestrator.launch ... run.name=<run>`` of this user, started no
    earlier than the launch the record announced (``launched_at``). A record naming another process (a stranger's,
    or one that was running before the launch) is not waited on. With none recorded (the driver died between its
    start and the record), one found by its command line."""
    who = trial.launcher
    if who is None and trial.launched_at:
        return _launcher_started_since(trial.run_name, trial.launched_at)
    if who is None or who.host != socket.gethostname():
        return None
    try:
        proc = psutil.Process(who.pid)
        if abs(proc.create_time() - who.started) > 1.0 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc if _launcher_of(proc, trial.run_name, trial.launched_at or 0.0) else None
    except (psutil.Error, ValueError):
        return None


def _launcher_of(proc: psutil.Process, run_name: str, since: float) -> bool:
    """Whether ``proc`` is a launcher of ``run_name`` this user started at or after ``since``."""
    import os

    cmd = proc.cmdline()
    return (
        "orchestrator.launch" in cmd
        and f"run.name={run_name}" in cmd
        and proc.create_time() >= since - 1.0
        and proc.uids().real == os.getuid()
    )


def _launcher_started_since(run_name: str, since: float) -> Optional[psutil.Process]:
    """A ``python -m orchestrator.launch ... run.name=<run_name>`` on this host started at or after ``since``."""
    for proc in psutil.process_iter(["cmdline"]):
        if f"run.name={run_name}" not in (proc.info["cmdline"] or []):
            continue
        try:
            if _launcher_of(proc, run_name, since) and _running(proc):
                return proc
        except psutil.Error:
            continue
    return None


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class AdoptedLauncher:
    """A local trial's launcher a dead driver started, still running its supervisor: ``poll()`` is None while it
    lives, then the exit code the trial's ledger implies (not its child: its own code is lost), or ``GONE`` when
    the ledger holds no final status (the launcher was killed too: launch the trial again)."""

    def __init__(self, process: psutil.Process, store, run_name: str):
        self.process, self.store, self.run_name = process, store, run_name

    def poll(self) -> Union[int, str, None]:
        if _running(self.process):
            return None
        ledger = trial_ledger(self.store, self.run_name)  # TrialRefused when it is not a ledger
        return _CODES.get(ledger.status, GONE)


class _Submitting:
    """A dead driver's launcher still submitting (``Popen.poll`` shape): None while it lives, then 0."""

    def __init__(self, process: psutil.Process):
        self.process = process

    def poll(self) -> Optional[int]:
        return None if _running(self.process) else exitcodes.COMPLETED


def submission_logged(log_path: Path, offset: int, run_name: str) -> bool:
    """Whether the trial's log holds, since ``offset``, the launcher's "submitted '<run>' to <engine>" line."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, offset))
            return f"submitted '{run_name}' to ".encode() in f.read()
    except OSError:
        return False


def adoptable(trial: TrialEntry, store, *, submits: bool, log_path: Path, grace: float = SUBMIT_GRACE_SECONDS):
    """What a relaunched driver waits on for a trial the record says runs: the dead driver's launcher (local),
    its submission (a scheduler's), or None (nothing runs it: launch it)."""
    alive = alive_launcher(trial)
    if submits and trial.submitted is not None:
        known = alive is not None or submission_logged(log_path, trial.log_offset or 0, trial.run_name)
        expires = None if known else (trial.launched_at or 0.0) + grace
        return SubmittedTrial(
            _Submitting(alive) if alive else None, store, trial.run_name, trial.submitted, expires_at=expires
        )
    return AdoptedLauncher(alive, store, trial.run_name) if alive is not None and not submits else None


class SubmittedTrial:
    """``poll()`` as ``subprocess.Popen.poll``: None while the trial lives, else the exit code its ledger implies.

    ``launcher``: the submitting ``python -m orchestrator.launch`` process (None for a trial adopted from a
    driver that died after submitting it); ``before``: the trial's attempts at submission; ``expires_at``: the
    wall time after which a submission with no attempt yet is taken as never made (``GONE``; None: it was made)."""

    def __init__(
        self,
        launcher,
        store,
        run_name: str,
        before: int,
        *,
        settle: float = FAILED_SETTLE_SECONDS,
        clock=time.monotonic,
        expires_at: Optional[float] = None,
    ):
        self.launcher, self.store, self.run_name, self.before = launcher, store, run_name, before
        self.settle, self.clock, self.expires_at = settle, clock, expires_at
        self._failed_since: Optional[tuple[float, int]] = None

    def poll(self) -> Union[int, str, None]:
        if self.launcher is not None:
            code = self.launcher.poll()
            if code is None or code != exitcodes.COMPLETED:
                return code  # still submitting, or refused (exit 4, ...): the trial's outcome
            self.launcher = None
        return self._from_ledger()

    def _from_ledger(self) -> Union[int, str, None]:
        ledger = trial_ledger(self.store, self.run_name)  # TrialRefused when it is not a ledger
        attempts = ledger.record.attempts
        if len(attempts) <= self.before:
            if self.expires_at is not None and time.time() >= self.expires_at:
                return GONE  # the dead driver never submitted it
            return None  # queued: no attempt of this submission yet
        if any(a.running for a in attempts[self.before :]):
            self._failed_since = None
            return None
        status = ledger.status
        if status in _CODES:
            return _CODES[status]
        if status == "failed":  # the engine requeues a crash unless its restarts are spent: wait for a new attempt
            if self._failed_since is None or self._failed_since[1] != len(attempts):
                self._failed_since = (self.clock(), len(attempts))
            if self.clock() - self._failed_since[0] >= self.settle:
                return exitcodes.CRASHED
        return None
