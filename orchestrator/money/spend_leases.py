"""Dead holds in the spend index: other jobs' reservations whose attempt is gone, released by whoever reads next.

A job settles its own vanished attempts when it runs again (``spend._settle_vanished``). One that never runs again
(a sweep's trial SIGKILLed with its launcher, then pruned; a job abandoned after a lost machine) would hold its
unspent reservation against the caps for good. The rule here: an open entry of *another* job is dead, and is
settled at its ledger cost (what the attempt had spent by its last heartbeat, as the ledger counts it; never less
than the entry's own ``spent``), when that job's ledger shows the attempt

- ended (its exit class is no longer ``running``: it ended without settling), or fenced by a newer attempt;
- running on this host under a process id that no longer exists (the local backend: SIGKILLed);
- running with no heartbeat for ``LEASE_S`` (another host, silent that long: a start-up or a final save is
  minutes at most, and an attempt alive past the lease charges its spend again at its next reservation, so a
  wrong guess over-charges the caps, never under-charges them).

An entry whose job has no ledger, or no attempt with that fence, is kept (nothing says it is dead). A start-up
hold (``spend_holds``: taken by a supervisor before its worker starts, so no attempt has it yet) is dead when its
supervisor's process no longer exists on this host, or when it is older than ``LEASE_S``; it is settled at its
whole hold (nothing says what its worker spent before it died).
"""

from __future__ import annotations

import logging
import socket
from typing import Optional, Union

from orchestrator.records.spend_record import SpendEntry, SpendIndexRecord

log = logging.getLogger(__name__)

LEASE_S = 600.0
HOLD_PREFIX = "hold:"  # a start-up hold's key in a job's open entries (``spend_holds``)


def is_hold(key: str) -> bool:
    return key.startswith(HOLD_PREFIX)


def hold_key(number: int, *, host: Optional[str] = None, pid: int) -> str:
    """The key of the start-up hold supervisor ``pid`` on ``host`` takes for its ``number``-th attempt."""
    return f"{HOLD_PREFIX}{host or socket.gethostname()}:{pid}:{number}"


def hold_owner(key: str) -> tuple[str, int]:
    """(host, pid) of the supervisor that took hold ``key``; ("", 0) when the key does not say."""
    host, _, _number = key[len(HOLD_PREFIX) :].rpartition(":")
    host, _, pid = host.rpartition(":")
    return (host, int(pid)) if pid.isdigit() else ("", 0)


def _gone(pid) -> bool:
    import psutil

    return isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and not psutil.pid_exists(pid)


def _dead_cost(attempt, newest_fence: int, now: float) -> Optional[float]:
    """The ledger cost of an attempt (a decoded ``AttemptEntry``) that is gone, or None while it may be alive."""
    if not attempt.running or attempt.fence < newest_fence:
        return attempt.cost_usd
    stale = attempt.last_seen is not None and now - attempt.last_seen > LEASE_S
    here = attempt.host == socket.gethostname() and _gone(attempt.pid)
    return attempt.cost_usd if (stale or here) else None


def _dead_hold(key: str, entry: SpendEntry, now: float) -> bool:
    """Whether a start-up hold's supervisor is gone (this host, its pid no longer exists) or the hold is stale."""
    host, pid = hold_owner(key)
    return (host == socket.gethostname() and _gone(pid)) or now - entry.updated_at > LEASE_S


def _decoded(index: Union[SpendIndexRecord, dict]) -> SpendIndexRecord:
    """The index decoded; a dict is its stored shape (``spend.parse_index``'s, as a sweep holds it)."""
    return index if isinstance(index, SpendIndexRecord) else SpendIndexRecord.decode(index)


def dead_holds(store, index: Union[SpendIndexRecord, dict], *, own_run: str, now: float) -> dict:
    """{run: {fence: ledger cost}} of other jobs' open entries whose attempt is gone (the rules above)."""
    from orchestrator.core.errors import UserError
    from orchestrator.records.ledger import Ledger
    from orchestrator.records.ledger_record import LedgerRecord

    out: dict = {}
    for run, job in _decoded(index).jobs.items():
        if run == own_run or not job.open:
            continue
        for key, entry in job.open.items():
            if is_hold(key) and _dead_hold(key, entry, now):
                out.setdefault(run, {})[key] = entry.through
        if all(is_hold(key) for key in job.open):
            continue
        ledger = Ledger(store, run)
        try:  # another job's ledger is untrusted input: it degrades that job's holds, never this job's start
            record = LedgerRecord.decode(ledger.load(), ledger.uri)
        except (UserError, ValueError) as err:  # an unreadable ledger proves nothing: keep its holds (CorruptRecord
            # is a UserError; ValueError: bytes that are not JSON)
            log.warning("spend index: job %r's ledger is unreadable (%s); its reservations stay held", run, err)
            continue
        newest = record.newest_fence
        by_fence = {str(a.fence): a for a in record.attempts}
        for fence in (key for key in job.open if not is_hold(key)):
            attempt = by_fence.get(fence)
            cost = _dead_cost(attempt, newest, now) if attempt is not None else None
            if cost is not None:
                out.setdefault(run, {})[fence] = cost
    return out


def released(index: SpendIndexRecord, dead: dict) -> tuple[SpendIndexRecord, list[str]]:
    """The index with the ``dead`` holds still open in it settled at their ledger cost; and what was released."""
    said = []
    for run, fences in dead.items():
        for fence, cost in fences.items():
            job = index.jobs.get(run)
            entry = job.open.get(fence) if job is not None else None
            if job is None or entry is None:
                continue
            charge = max(0.0, max(float(cost), entry.spent) - entry.base)
            index = index.with_job(run, job.close(fence, charge))
            said.append(
                f"{run} fence {fence}: held ${max(entry.through, entry.spent):.6f}, "
                f"settled at ${charge + entry.base:.6f}"
            )
    return index, said


def release(index: dict, dead: dict) -> list[str]:
    """``released`` on the index's stored shape (``spend.parse_index``'s, as a sweep holds it), in place."""
    after, said = released(_decoded(index), dead)
    index.clear()
    index.update(after.encode())
    return said
