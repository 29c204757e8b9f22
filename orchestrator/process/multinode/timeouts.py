"""How long a node may be silent (``distributed.heartbeat_timeout``) and how long a collective may wait.

``auto`` derives the heartbeat timeout from what earlier attempts of the job measured (the ledger): every
collective waits on the slowest node, so a node silent for three steady steps and a checkpoint save has
stalled the world; never under ``FLOOR_S`` (a loaded host may miss a beat), never over ``CEILING_S``, and
``DEFAULT_S`` before anything was measured. NCCL's 600 s (and gloo's 30 min) are not used: the ranks'
process group gets ``collective_timeout_s``, a backstop for a rank that hangs while its node still beats.
"""

from __future__ import annotations

import logging
from typing import Iterable, Sequence

from orchestrator.core.durations import parse_duration
from orchestrator.policy.history import last_restart_seconds, measured_cost_seconds, steady_seconds_per_step

log = logging.getLogger(__name__)

DEFAULT_S = 30.0
FLOOR_S = 10.0
CEILING_S = 300.0
COLLECTIVE_FLOOR_S = 120.0
MAX_HEARTBEAT_S = 86400.0


def heartbeat_timeout_s(value, attempts: Iterable = ()) -> float:
    """``distributed.heartbeat_timeout`` in seconds: a duration as given, or ``auto`` from the ledger's attempts.

    Raises:
        ValueError: not ``auto`` and not a positive duration (the message names the key and the forms).
    """
    if str(value).strip().lower() != "auto":
        seconds = parse_duration(value, key="distributed.heartbeat_timeout")
        if seconds <= 0:
            raise ValueError(
                f"distributed.heartbeat_timeout={value!r} must be positive: a silent node would never "
                "be noticed. Use auto or a duration such as 30s."
            )
        if seconds > MAX_HEARTBEAT_S:  # the ranks' collective timeout is 4x it: past a day, no world waits it out
            raise ValueError(
                f"distributed.heartbeat_timeout={value!r} is more than {MAX_HEARTBEAT_S / 3600:g} h: a "
                "node silent that long is lost, and the world's collective timeout (4x it) would "
                "never end. Use auto or a duration such as 30s."
            )
        return seconds
    attempts = list(attempts)
    step, save = steady_seconds_per_step(attempts), measured_cost_seconds(attempts)
    if step is None and save is None:
        return DEFAULT_S
    return min(CEILING_S, max(FLOOR_S, 3 * (step or 0.0) + (save or 0.0)))


def collective_timeout_s(heartbeat_s: float, attempts: Sequence = ()) -> float:
    """The ranks' process-group timeout: past the heartbeat's, and past a restart's download on rank 0."""
    return max(COLLECTIVE_FLOOR_S, 4 * heartbeat_s, 2 * last_restart_seconds(list(attempts)))


def job_attempts(cfg) -> list:
    """The job's earlier attempts from its ledger ([] when it cannot be read: the defaults apply)."""
    from orchestrator.records.ledger import Ledger
    from orchestrator.records.ledger_record import LedgerRecord
    from orchestrator.storage import store_from_config

    try:
        ledger = Ledger(store_from_config(cfg.storage), cfg.run.name)
        return list(LedgerRecord.decode(ledger.load(), ledger.uri).attempts)  # one that does not decode: defaults
    except Exception as err:  # noqa: BLE001 - storage down: the timeouts fall back to their defaults
        log.warning("could not read the ledger for the heartbeat timeout (%s); using the defaults", err)
        return []
