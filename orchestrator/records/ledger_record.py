"""A job's ledger as its readers see it: one decode into types, with types, finiteness and bounds checked.

The ledger (``orchestrator.records.ledger``: its shape, its conditional writes, its fences) is read from storage,
so whatever it holds is untrusted. ``LedgerRecord.decode`` is the one reading for every reader that is not the
ledger's own writer (``orchestrator status``, the requeue policy, the supervisor, the spend index's dead-hold
sweep, the cost report): an attempt without a whole fence, a cost of 1e300 or a step that is a string is one
``CorruptRecord`` naming the ledger and the field, never a ``KeyError`` deep in a policy. Readers use attributes.

``extra`` (an attempt's measurements) and ``repro`` stay JSON objects: their own readers check what they read
(``orchestrator.policy.history``, ``orchestrator.records.repro``).

A job whose OWN ledger does not decode stops, at the start of its attempt, and nothing is written to the ledger:
``Ledger.begin_attempt`` decodes it inside its conditional write, before it marks or appends anything, so the
worker's ``AttemptRecord.begin`` raises ``CorruptRecord``. That is a DataError: the worker prints it as one
``error:`` paragraph (the ledger's URI, the field, and the fix: move the ledger aside, which starts its record
afresh, or restore it from a copy), no traceback, and exits 4 (``config_error``: final, never requeued: a retry
reads the same bytes). The local supervisor stops on that exit; its own reading of the ledger (``_ledger_attempts``) only
warns. Another job's ledger that does not decode (the spend index's dead-hold sweep, a sweep's trials) is skipped
with a warning naming it, and its neighbours go on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, cast

from orchestrator.core.exitcodes import RUN_STATUSES, RUNNING, ExitClass
from orchestrator.records.fencing import upgraded_ledger
from orchestrator.records.fields import MAX_STEPS, CorruptRecord, Fields  # noqa: F401 - CorruptRecord: the readers'

EXIT_CLASSES = frozenset({RUNNING, *(c.value for c in ExitClass)})
MAX_PID = 2**31 - 1
MAX_GPUS = 100_000
MAX_ZONE_NAME = 64  # a cloud zone or region name (``config.zones.ZONE_NAME``: at most 63)
MAX_ZONE_REASON = 400  # one short sentence
MAX_USD_PER_HOUR = 1e5  # one allocation's hourly price: past this, corrupt


@dataclass(frozen=True)
class NodeEntry:
    """One node of a multi-node attempt (``orchestrator.process.multinode.records``)."""

    node: int
    host: str
    started_at: Optional[float]
    ended_at: Optional[float]
    exit: Optional[int]

    @classmethod
    def decode(cls, f: Fields) -> "NodeEntry":
        return cls(
            node=f.whole("node", high=MAX_GPUS),
            host=f.text("host", "-"),
            started_at=f.time("started_at"),
            ended_at=f.time("ended_at"),
            exit=f.whole("exit", low=-255, high=255, default=None),
        )


@dataclass(frozen=True)
class AttemptEntry:
    """One attempt: where it ran, when, how it ended, what it trained and cost."""

    fence: int
    exit_class: str  # RUNNING while it lives, else an ExitClass value
    host: str
    pid: Optional[int]
    started_at: Optional[float]
    ended_at: Optional[float]
    last_seen: Optional[float]
    step_start: int
    step_end: int
    checkpoint_step_at_start: int
    checkpoint_step_end: Optional[int]
    cost_usd: float
    instance_type: Optional[str]
    gpu_type: Optional[str]
    gpus: int
    spot: bool
    launched_by: Optional[str]
    nodes: tuple[NodeEntry, ...]
    extra: Mapping[str, Any]
    zone: Optional[str] = None  # where it landed (``ORCH_ZONE``, the cloud's own); None: not known
    zone_region: Optional[str] = None
    zone_usd_per_hour: Optional[float] = None  # the allocation's hourly price there, what its meter billed
    zone_reason: Optional[str] = None  # why that zone: the placement's reason, or "the backend's choice"

    @classmethod
    def decode(cls, f: Fields) -> "AttemptEntry":
        return cls(
            fence=f.whole("fence", low=1),
            exit_class=f.choice("exit_class", EXIT_CLASSES),
            host=f.text("host", "-"),
            pid=f.whole("pid", high=MAX_PID, default=None),
            started_at=f.time("started_at"),
            ended_at=f.time("ended_at"),
            last_seen=f.time("last_seen"),
            step_start=f.whole("step_start", default=0),
            step_end=f.whole("step_end", default=0),
            checkpoint_step_at_start=f.whole("checkpoint_step_at_start", default=0),
            checkpoint_step_end=f.whole("checkpoint_step_end", default=None),
            cost_usd=f.usd("cost_usd"),
            instance_type=f.text("instance_type", None),
            gpu_type=f.text("gpu_type", None),
            gpus=f.whole("gpus", high=MAX_GPUS, default=0),
            spot=f.flag("spot"),
            launched_by=f.text("launched_by", None),
            nodes=tuple(NodeEntry.decode(n) for n in f.objects("nodes")),
            extra=f.mapping("extra"),
            zone=f.text("zone", None, limit=MAX_ZONE_NAME),
            zone_region=f.text("zone_region", None, limit=MAX_ZONE_NAME),
            zone_usd_per_hour=f.number("zone_usd_per_hour", high=MAX_USD_PER_HOUR, default=None),
            zone_reason=f.text("zone_reason", None, limit=MAX_ZONE_REASON),
        )

    @classmethod
    def unrecorded(cls, exit_class: str, step: int = 0) -> "AttemptEntry":
        """An attempt that left no entry in the ledger, as its requeue policy counts it: a worker that died before
        it opened the ledger (the supervisor saw it end with ``exit_class`` at ``step``), a simulated attempt
        (``orchestrator.planning.simulate``). Fence 0: it never took one."""
        return cls(
            fence=0,
            exit_class=exit_class,
            host="-",
            pid=None,
            started_at=None,
            ended_at=None,
            last_seen=None,
            step_start=step,
            step_end=step,
            checkpoint_step_at_start=step,
            checkpoint_step_end=None,
            cost_usd=0.0,
            instance_type=None,
            gpu_type=None,
            gpus=0,
            spot=False,
            launched_by=None,
            nodes=(),
            extra={},
        )

    @property
    def running(self) -> bool:
        return self.exit_class == RUNNING

    @property
    def end(self) -> Optional[float]:
        """Its end, else its last heartbeat."""
        return self.ended_at or self.last_seen


@dataclass(frozen=True)
class CheckpointEntry:
    step: int
    key: str
    size: int
    time: Optional[float]
    fence: int

    @classmethod
    def decode(cls, f: Fields) -> "CheckpointEntry":
        return cls(
            step=f.whole("step"),
            key=f.text("key"),
            size=f.whole("size", high=2**60, default=0),
            time=f.time("time"),
            fence=f.whole("fence", default=0),
        )


@dataclass(frozen=True)
class CapacityDecision:
    """One ``run.deadline`` decision: spot or on-demand, why, and what the backend does with it."""

    capacity: str
    previous: Optional[str]
    reason: str
    action: Optional[str]
    time: Optional[float]
    fence: int
    step: int
    locked: bool = False  # on-demand for good: the deadline leaves no room for another spot attempt

    @classmethod
    def decode(cls, f: Fields) -> "CapacityDecision":
        return cls(
            capacity=f.text("capacity", "?"),
            previous=f.text("previous", None),
            reason=f.text("reason", ""),
            action=f.text("action", None),
            time=f.time("time"),
            fence=f.whole("fence", default=0),
            step=f.whole("step", default=0),
            locked=f.flag("locked"),
        )


@dataclass(frozen=True)
class LedgerRecord:
    """A job's ledger, decoded. ``where``: the ledger's URI (what an error names)."""

    where: str
    run_name: str
    status: str
    fence: int
    attempts: tuple[AttemptEntry, ...]
    checkpoints: tuple[CheckpointEntry, ...]
    checkpoints_committed: int
    alerts: Mapping[str, float]
    mlflow_run_id: Optional[str]
    cost_usd: float
    step: int
    created_at: Optional[float]
    capacity: tuple[CapacityDecision, ...]
    repro: Mapping[str, Any]
    model_input: Optional[str]  # the model the job trained, ``name@revision`` (its reproducibility record)

    @classmethod
    def decode(cls, doc: Any, where: str) -> "LedgerRecord":
        """``doc`` (the parsed ledger.json) into types. Raises CorruptRecord naming ``where`` and the field."""
        f = Fields(upgraded_ledger(doc) if isinstance(doc, dict) else doc, where)
        attempts = tuple(AttemptEntry.decode(a) for a in f.objects("attempts"))
        checkpoints = tuple(CheckpointEntry.decode(c) for c in f.objects("checkpoints"))
        alerts = f.mapping("alerts")
        return cls(
            where=where,
            run_name=f.text("run_name", "?"),
            status=f.choice("status", RUN_STATUSES, RUNNING),
            fence=f.whole("fence", default=0),
            attempts=attempts,
            checkpoints=checkpoints,
            checkpoints_committed=f.whole("checkpoints_committed", default=len(checkpoints)),
            alerts={str(k): cast(float, Fields(alerts, f"{where} alerts").time(k, 0.0)) for k in alerts},
            mlflow_run_id=f.text("mlflow_run_id", None),
            cost_usd=f.usd("cost_usd"),
            step=f.whole("step", high=MAX_STEPS, default=0),
            created_at=f.time("created_at"),
            capacity=tuple(CapacityDecision.decode(d) for d in f.objects("capacity")),
            repro=f.mapping("repro"),
            model_input=Fields(f.mapping("repro"), f"{where} repro").text("model_input", None),
        )

    def trained(self, model: str) -> bool:
        """Whether the job trained ``model`` (a hub id or a path), as its reproducibility record says."""
        return self.model_input is not None and (self.model_input == model or self.model_input.startswith(model + "@"))

    @property
    def attempts_cost_usd(self) -> float:
        """What the job's attempts cost together, as the ledger bills them (``records.ledger.attempts_cost_usd``)."""
        return float(sum(a.cost_usd for a in self.attempts))

    @property
    def newest_fence(self) -> int:
        return max((a.fence for a in self.attempts), default=0)

    def with_lost_attempts(self) -> "LedgerRecord":
        """The ledger with every "running" attempt that a later attempt took over shown as vanished.

        ``Ledger.begin_attempt`` marks them itself; this covers ledgers written otherwise (an older version, a
        hand edit, a writer that lost its race)."""
        newest = self.newest_fence
        fixed = tuple(
            replace(a, exit_class=ExitClass.VANISHED.value, ended_at=a.end) if a.running and a.fence < newest else a
            for a in self.attempts
        )
        return replace(self, attempts=fixed)
