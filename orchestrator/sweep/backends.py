"""How the driver waits on a trial: its launcher process (local), or its ledger (a scheduler's backend).

``backend=local``: ``python -m orchestrator.launch`` runs the trial's supervisor and lives as long as the trial,
so its exit code is the trial's. ``backend=slurm|skypilot|kubernetes``: the launcher returns 0 once the engine
accepted the job; the trial then runs (and is requeued) on the engine's machines. The driver keeps the trial's
worker slot and reads the trial's ledger: the trial ended when an attempt begun after the submission has left
the job in a final status (completed, budget_exhausted (a paused rung), config_error, caps_reached), or
``failed`` with no new attempt for ``FAILED_SETTLE_SECONDS`` (the engine's requeue of a crash starts one
sooner). The number of attempts at submission is kept in the trial's record (``submitted``), so a relaunched
driver waits on a trial it submitted instead of submitting it twice.
"""
from __future__ import annotations

import time
from typing import Optional

from orchestrator import exitcodes
from orchestrator.ledger import Ledger

SUBMITTING = ("slurm", "skypilot", "kubernetes")
FAILED_SETTLE_SECONDS = 300.0
_CODES = {o.ledger_status: o.exit_code for o in exitcodes.OUTCOMES.values()
          if o.final and o.ledger_status and o.exit_code is not None}


def submits(cfg) -> bool:
    return str(cfg.backend.name) in SUBMITTING


def attempts_so_far(store, run_name: str) -> int:
    ledger = Ledger(store, run_name).load()
    attempts = ledger.get("attempts") if isinstance(ledger, dict) else None
    return len(attempts) if isinstance(attempts, list) else 0


class SubmittedTrial:
    """``poll()`` as ``subprocess.Popen.poll``: None while the trial lives, else the exit code its ledger implies.

    ``launcher``: the submitting ``python -m orchestrator.launch`` process (None for a trial adopted from a
    driver that died after submitting it); ``before``: the trial's attempts at submission."""

    def __init__(self, launcher, store, run_name: str, before: int, *, settle: float = FAILED_SETTLE_SECONDS,
                 clock=time.monotonic):
        self.launcher, self.store, self.run_name, self.before = launcher, store, run_name, before
        self.settle, self.clock = settle, clock
        self._failed_since: Optional[tuple[float, int]] = None

    def poll(self) -> Optional[int]:
        if self.launcher is not None:
            code = self.launcher.poll()
            if code is None or code != exitcodes.COMPLETED:
                return code  # still submitting, or refused (exit 4, ...): the trial's outcome
            self.launcher = None
        return self._from_ledger()

    def _from_ledger(self) -> Optional[int]:
        ledger = Ledger(self.store, self.run_name).load()
        attempts = ledger.get("attempts") if isinstance(ledger, dict) else None
        if not isinstance(attempts, list) or len(attempts) <= self.before:
            return None  # queued: no attempt of this submission yet
        if any(not isinstance(a, dict) or a.get("exit_class") == exitcodes.RUNNING for a in attempts[self.before:]):
            self._failed_since = None
            return None
        status = ledger.get("status")
        if status in _CODES:
            return _CODES[status]
        if status == "failed":  # the engine requeues a crash unless its restarts are spent: wait for a new attempt
            if self._failed_since is None or self._failed_since[1] != len(attempts):
                self._failed_since = (self.clock(), len(attempts))
            if self.clock() - self._failed_since[0] >= self.settle:
                return exitcodes.CRASHED
        return None
