"""Spot or on-demand, between the backends and the worker (``run.deadline``).

The worker decides (``orchestrator.attempt.capacity``) and records its decisions
in the ledger; a backend tells the worker what the attempt runs on and what the
backend does with a change, through the environment of the attempt:

- ``ORCH_CAPACITY``: ``spot`` | ``on_demand``, what this attempt runs on;
- ``ORCH_CAPACITY_ACTION``: ``move`` (Slurm: the worker saves and stops, the batch
  script moves the job to the other partition, named in
  ``ORCH_CAPACITY_REQUEST_FILE``) or ``resubmit`` (SkyPilot, Kubernetes: the next
  submission renders the capacity the ledger's newest decision names,
  ``planned_capacity``); unset (local): the worker can only advise.

No Hydra or transformers import: the launcher renders with it.
"""

from __future__ import annotations

import dataclasses
import logging
import unicodedata
from typing import TYPE_CHECKING, Any, Optional

from orchestrator.policy.deadline import ON_DEMAND, SPOT
from orchestrator.records.ledger_record import CapacityDecision

if TYPE_CHECKING:
    from orchestrator.config.schema import ComputeConfig

log = logging.getLogger(__name__)

CAPACITY_ENV = "ORCH_CAPACITY"
ACTION_ENV = "ORCH_CAPACITY_ACTION"
REQUEST_FILE_ENV = "ORCH_CAPACITY_REQUEST_FILE"
MOVE, RESUBMIT = "move", "resubmit"


def label(capacity: str) -> str:
    return "on-demand" if capacity == ON_DEMAND else "spot"


def attempt_capacity(compute: Any, environ) -> str:
    """What this attempt runs on: the backend's word (``ORCH_CAPACITY``) for a spot job, else ``compute.spot``."""
    said = environ.get(CAPACITY_ENV, "")
    if said in (SPOT, ON_DEMAND) and compute.spot:
        return said
    return SPOT if compute.spot else ON_DEMAND


def attempt_compute(compute: ComputeConfig, capacity: str) -> ComputeConfig:
    """``compute`` (the schema's dataclass) as this attempt runs: on-demand is priced and recorded as such
    (``spot: false``), in a copy."""
    if capacity == ON_DEMAND and compute.spot:
        compute = dataclasses.replace(compute, spot=False)
    return compute


def stored_text(value: Any) -> str:
    """Text read from storage, fit to copy into a rendered script or manifest: control and format characters
    (CR, NUL, escapes, line and paragraph separators, bidi overrides) dropped, whitespace runs made one space.
    Every render copies what it read from the bucket through this (``planned_capacity``)."""

    def one(c: str) -> str:
        kind = unicodedata.category(c)
        return " " if kind in ("Cc", "Zl", "Zp") else "" if kind[0] == "C" else c

    return " ".join("".join(map(one, str(value))).split())


def latest_decision(ledger: Any) -> Optional[CapacityDecision]:
    """The ledger's newest capacity decision (None: none): ``ledger`` decoded (``LedgerRecord``)."""
    return ledger.capacity[-1] if ledger.capacity else None


def planned_capacity(cfg: Any) -> tuple[str, Optional[dict]]:
    """The capacity the next submission of ``cfg``'s job takes, and the ledger's decision behind it (None: none).

    A spot job with a ``run.deadline`` follows its ledger's newest decision; any other job takes ``compute.spot``.
    """
    configured = SPOT if cfg.compute.spot else ON_DEMAND
    if not (cfg.run.deadline and cfg.compute.spot):
        return configured, None
    from orchestrator.records.fields import CorruptRecord
    from orchestrator.records.ledger import Ledger
    from orchestrator.records.ledger_record import LedgerRecord
    from orchestrator.storage import store_from_config

    ledger = Ledger(store_from_config(cfg.storage), str(cfg.run.name))
    try:
        decision = latest_decision(LedgerRecord.decode(ledger.load(), ledger.uri))
    except CorruptRecord as err:  # the attempt's start stops on it (exit 4); the render follows the config
        log.warning("%s; following compute.spot", err)
        return configured, None
    if not decision:
        return configured, None
    if decision.capacity not in (SPOT, ON_DEMAND):  # storage is untrusted: only the two known values
        log.warning(
            "the ledger's newest capacity decision names %r, neither %s nor %s; following compute.spot",
            stored_text(decision.capacity)[:40],
            SPOT,
            ON_DEMAND,
        )
        return configured, None
    return decision.capacity, dict(dataclasses.asdict(decision), reason=stored_text(decision.reason))


def capacity_env(cfg: Any, capacity: str, action: str) -> dict[str, str]:
    """The attempt's environment for ``run.deadline`` (empty for a job without one)."""
    if not cfg.run.deadline:
        return {}
    return {CAPACITY_ENV: capacity, ACTION_ENV: action}


def capacity_comment(capacity: str, decision: Optional[dict]) -> str:
    """A comment line for the rendered text: why this submission runs on-demand (empty when it follows the config)."""
    if not decision:
        return ""
    reason = stored_text(decision.get("reason", ""))
    return f"# capacity: {label(capacity)}, as the ledger's newest decision (run.deadline) says: {reason}\n"
