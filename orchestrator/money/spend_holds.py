"""Start-up holds: the spend index's reservation for an attempt's start-up, taken before its process starts.

A worker spends its start-up (interpreter, imports, model load: seconds here, 45 s and more on a cloud machine)
before it can reserve anything in the spend index, so N attempts launched at once into the same room would
pass a cap by N start-ups. The local supervisor, which is light and runs before the worker, takes a hold for
the start-up to come (``policy.restart.start_up_seconds``) at the attempt's price, in one conditional write,
and refuses the attempt (exit 3, before any child starts) when a cap is spent or leaves less than that start-up.

A hold is an open entry of the job keyed ``hold:<host>:<pid>:<n>`` (the supervisor's process, its n-th attempt)
that charges its ``through`` to the caps like any reservation. The worker is handed its key (``ORCH_START_HOLD``)
and its first reservation takes it over in the same write (``SpendIndex.reserve(hold=...)``: the hold becomes the
attempt's entry, counted once). A hold nobody took over is released by its supervisor when the child ends, at
what the child's run cost (its wall time at the attempt's price); one whose supervisor is gone is dead
(``spend_leases``) and settled at its whole hold: nothing says what its worker spent.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

from orchestrator.money.spend_leases import hold_key

log = logging.getLogger(__name__)

HOLD_ENV = "ORCH_START_HOLD"
__all__ = ["HOLD_ENV", "HoldAsk", "StartHolds", "hold_key", "release_hold", "take_hold"]


@dataclass(frozen=True)
class HoldAsk:
    """What one start-up hold asks for: ``seconds`` of start-up at ``usd_per_second``."""

    seconds: float
    usd_per_second: float

    @property
    def usd(self) -> float:
        return max(0.0, self.seconds) * max(0.0, self.usd_per_second)


def take_hold(index, key: str, ask: HoldAsk) -> Optional[str]:
    """One conditional write: hold ``ask.usd`` for job ``index.caps.run_name``'s start-up under ``key``; why not (a
    cap spent, or too little room for the start-up: nothing written), or None when held. Dead holds and this job's
    vanished attempts (``spend_leases``) are released in the same write, at their ledger cost."""
    from orchestrator.money.spend import CAP_TOLERANCE_USD, month_of
    from orchestrator.money.spend_leases import dead_holds, released
    from orchestrator.records.fields import MAX_USD
    from orchestrator.records.spend_record import SpendEntry, SpendIndexRecord

    now = index.clock()
    month = month_of(now)
    caps = index.caps
    dead = dead_holds(index.store, index.record(), own_run="", now=now)
    why: list[str] = []

    def change(doc: SpendIndexRecord) -> Optional[SpendIndexRecord]:
        doc, _ = released(doc, dead)
        room = caps.room_usd(doc, month)
        if room is not None and room < ask.usd - CAP_TOLERANCE_USD:
            why[:] = [caps.refusal(doc, month, index.where) or _short(index, room, ask)]
            return None
        why[:] = []
        held = SpendEntry(month=month, base=0.0, spent=0.0, through=min(MAX_USD, ask.usd), updated_at=now)
        return doc.with_job(caps.run_name, doc.job(caps.run_name, caps.experiment).with_entry(key, held))

    index.write(change)
    if not why:
        log.info(
            "spend index %s: held $%.6f for the start-up to come (%.1f s) under %s",
            index.where,
            ask.usd,
            ask.seconds,
            key,
        )
    return why[0] if why else None


def _short(index, room: float, ask: HoldAsk) -> str:
    return (
        f"spend cap nearly reached: the caps on {index.where} leave ${max(0.0, room):.6f}, less than the "
        f"start-up an attempt spends before it can stop (${ask.usd:.6f}: {ask.seconds:.1f} s from process start "
        "to first step: compute.restart_seconds, else the job's last measured, else the start prior), so no "
        "attempt starts. Raise the cap (budget.monthly_max_usd, budget.experiment_max_usd) to go on from the "
        "last checkpoint"
    )


def release_hold(index, key: str, spent_usd: float) -> bool:
    """Settle hold ``key`` if no worker took it over, at ``spent_usd`` (what its child's run cost); True if it did."""
    from orchestrator.records.fields import MAX_USD
    from orchestrator.records.spend_record import SpendIndexRecord

    done: list[bool] = []

    def change(doc: SpendIndexRecord) -> Optional[SpendIndexRecord]:
        job = doc.jobs.get(index.caps.run_name)
        if job is None or key not in job.open:
            return None
        done[:] = [True]
        return doc.with_job(index.caps.run_name, job.close(key, min(MAX_USD, float(spent_usd))))

    index.write(change)
    return bool(done)


class StartHolds:
    """A supervisor's start-up holds, one per attempt it starts; none for a job under no monthly or experiment cap.

    Args:
        cfg: the job's config (its caps and ``tracking.experiment``).
        store: the jobs' store (``storage.uri``).
        run_name: the job's name in storage.
        usd_per_second: the attempt's price.
        restart_seconds: ``compute.restart_seconds`` of the attempt's compute (None: unset).
    """

    def __init__(self, cfg: Any, store: Any, run_name: str, *, usd_per_second: float, restart_seconds: Optional[float]):
        from orchestrator.money.budget import spend_caps
        from orchestrator.money.spend import SpendIndex
        from orchestrator.records.ledger import Ledger

        budget = cfg.budget
        self.index = None
        if budget.monthly_max_usd is None and budget.experiment_max_usd is None:
            return
        self.index = SpendIndex(store, spend_caps(budget, run_name, str(cfg.tracking.experiment)))
        self.ledger = Ledger(store, run_name)
        self.usd_per_second = usd_per_second
        self.override = restart_seconds

    def take(self, number: int) -> tuple[Optional[str], Optional[str]]:
        """(the hold's key to hand the worker, or None; why the attempt may not start, or None)."""
        from orchestrator.core.errors import BudgetExhausted
        from orchestrator.policy.history import last_restart_seconds
        from orchestrator.policy.restart import start_up_seconds
        from orchestrator.records.ledger_record import LedgerRecord

        if self.index is None:
            return None, None
        key = hold_key(number, pid=os.getpid())
        try:
            attempts = LedgerRecord.decode(self.ledger.load(), self.ledger.uri).attempts  # corrupt: as storage down
            ask = HoldAsk(start_up_seconds(last_restart_seconds(attempts), self.override), self.usd_per_second)
            refusal = take_hold(self.index, key, ask)
        except BudgetExhausted as err:  # the spend index is unreadable: a cap it cannot check
            return None, str(err)
        except Exception as err:  # noqa: BLE001 - storage down: the worker's own first reservation decides
            log.warning("could not take a start-up hold in the spend index (%s); the attempt reserves on its own", err)
            return None, None
        return (None, refusal) if refusal else (key, None)

    def release(self, key: Optional[str], child_seconds: float) -> None:
        """After the child ended: a hold it never took over is settled at what its run cost."""
        if key is None or self.index is None:
            return
        try:
            if release_hold(self.index, key, child_seconds * self.usd_per_second):
                log.info("released start-up hold %s: its worker ended before it reserved", key)
        except Exception as err:  # noqa: BLE001 - storage down: the hold is dead once this process is (spend_leases)
            log.warning("could not release start-up hold %s (%s)", key, err)
