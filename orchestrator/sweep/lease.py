"""One driver at a time: the sweep's record holds a fenced lease (``driver``: host, pid, process start time, when
it was last renewed; ``fence``: a number each new holder takes, as an attempt takes its ledger's fence).

A driver takes the lease when it opens the record (``SweepState.open``) and renews it at each of its writes (at
least every ~10 s while it runs); every write it makes first checks that the record's fence is still its own, so
a driver presumed dead that comes back stops (``SweepLeaseLost``) instead of launching trials a second time. A
second driver while the holder lives is refused (``SweepBusy``, exit 6) with the holder's host and pid. A lease
is stale, and taken over, when its holder's process is gone (this host: no process with that pid and start
time) or it was not renewed for ``LEASE_S`` (another host; the spend index's rule for a silent attempt,
``orchestrator.money.spend_leases``). The lease's fields are decoded with the record
(``orchestrator.records.sweep_record``); the functions here change the record as stored, inside its write.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Optional

from orchestrator.core.errors import UserError
from orchestrator.core.exitcodes import ExitClass
from orchestrator.money.spend_leases import LEASE_S


class SweepBusy(UserError):
    """Another live driver holds the sweep: this one launches nothing."""

    exit_class = ExitClass.FENCED


class SweepLeaseLost(SweepBusy):
    """This driver's lease was taken over (it was presumed dead): it stops without writing."""


def me() -> dict:
    """This process as a lease holder (``backends.launcher_identity``: host, pid, start time)."""
    import os

    from orchestrator.sweep.backends import launcher_identity

    return launcher_identity(os.getpid())


def same(a: Optional[dict], b: dict) -> bool:
    return isinstance(a, dict) and all(a.get(k) == b[k] for k in ("host", "pid", "started"))


def alive(who: Optional[dict], now: float) -> bool:
    """Whether the lease holder ``who`` may still drive: renewed within ``LEASE_S`` and, on this host, its process
    (same pid and start time) still runs."""
    if not isinstance(who, dict) or now - float(who["renewed_at"]) > LEASE_S:
        return False
    if who["host"] != socket.gethostname():
        return True
    import psutil

    try:
        proc = psutil.Process(who["pid"])
        return abs(proc.create_time() - float(who["started"])) <= 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def take(doc: dict, holder: dict, where: str, now: Optional[float] = None) -> int:
    """Take (or keep) the lease in ``doc`` for ``holder``; its fence. Raises SweepBusy while another holder lives."""
    now = time.time() if now is None else now
    who: Any = doc.get("driver")
    if same(who, holder):
        who["renewed_at"] = now
        doc["fence"] = int(doc.get("fence", 0))
        return doc["fence"]
    if alive(who, now):
        raise SweepBusy(
            f"the sweep {where} is driven by another driver: pid {who['pid']} on host {who['host']} "
            f"(its lease renewed {now - float(who['renewed_at']):.0f} s ago). This driver launches "
            f"nothing: wait for that one to end, or stop it; a driver that died is taken over as soon "
            f"as its process is gone (same host) or {LEASE_S:.0f} s after its last renewal."
        )
    doc["fence"] = int(doc.get("fence", 0)) + 1
    doc["driver"] = dict(holder, renewed_at=now)
    return doc["fence"]


def renew(doc: dict, holder: dict, fence: int, where: str) -> None:
    """Before a write of the holder of ``fence``: check the lease is still its own and renew it; SweepLeaseLost
    (nothing written) when another driver took it over."""
    who: Any = doc.get("driver")
    if doc.get("fence") != fence or not same(who, holder):
        other = f"pid {who['pid']} on host {who['host']}" if isinstance(who, dict) else "no driver"
        raise SweepLeaseLost(
            f"the sweep {where} was taken over by another driver ({other}) while this one was "
            "presumed dead; this driver stops without writing (its trials go on under the other)."
        )
    who["renewed_at"] = time.time()


def release(doc: dict, holder: dict, fence: int) -> bool:
    """Give the lease up (the next driver takes it at once); False when it is no longer this holder's."""
    if doc.get("fence") != fence or not same(doc.get("driver"), holder):
        return False
    doc["driver"] = None
    return True
