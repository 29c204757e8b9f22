"""The run's record in storage: attempts, fences (fencing), cost, alerts, MLflow run id.

The ledger lives at ``<run_name>/ledger.json`` and moves only by conditional
write: read it with its version, change it, write it back only if nobody
else wrote in between, else re-read and retry. That makes every change
atomic across machines sharing the store.

Fencing: each attempt takes a new ``fence`` in ``begin_attempt``. Every later
write through ``update`` first checks that the stored fence is still this
attempt's; if a newer attempt took over (the old machine was presumed dead but
was only partitioned), the old one gets ``Fenced`` and must stop without
writing.

Shape (other modules and ``orchestrator status --json`` rely on these names)::

    {"run_name", "status", "fence", "attempts": [...], "checkpoints": [...],
     "alerts": {name: unix_time}, "mlflow_run_id", "cost_usd", "step",
     "created_at", "repro"}

``status`` is one of RUN_STATUSES (``exitcodes.OUTCOMES`` gives the status each
way of ending sets). Each attempt is
``{"fence", "host", "pid", "started_at", "ended_at", "last_seen", "exit_class",
"step_start", "step_end", "checkpoint_step_at_start", "checkpoint_step_end", "cost_usd",
"instance_type", "gpu_type", "gpus", "spot", "extra", "launched_by"}`` (with ``compute.zones`` or a zone the
backend named: also ``zone``, ``zone_region``, ``zone_usd_per_hour``, the price its meter billed, and ``zone_reason``) with ``exit_class``
"running" while live, else an ExitClass value (several nodes: also ``rdzv_id`` and ``nodes``, which each
node's launcher writes: ``orchestrator.process.multinode.records``). Each checkpoint is
``{"step", "key", "size", "time", "fence"}``; only the newest ``keep_checkpoints``
(``checkpoint.keep_last``: the ones retention keeps in storage, which are all a
restore can fall back to) are listed, and ``checkpoints_committed`` counts every
commit, so a week-long job's ledger, rewritten at every heartbeat, stays small.

Decisions and measurements (``run.deadline``, ``checkpoint.every=auto``): an attempt's
``extra`` holds ``restart`` (its start-up split by phase; ``total_s`` is its start to the end of its
first step, which ledgers before it held as ``start_to_first_step_s``: ``orchestrator.policy.history``) and
``checkpoint_interval`` (the newest interval it chose, with its inputs C, M and the notice
share); ``capacity`` lists the job's capacity decisions, newest last (the newest
``MAX_CAPACITY_DECISIONS``), each ``{"capacity", "previous", "reason", "locked", "at_risk",
"action", "time", "fence", "step"}``; the next submission of a job reads the newest.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable, Iterable, Mapping, cast

from orchestrator.core.env import RDZV_ID_ENV
from orchestrator.core.errors import CapsReached, Fenced, UserError
from orchestrator.core.exitcodes import (
    FINAL_RUN_STATUSES,
    RUN_STATUSES,
    RUNNING,
    ExitClass,
    outcome,
)
from orchestrator.records.fencing import upgraded_ledger
from orchestrator.records.ledger_record import LedgerRecord
from orchestrator.storage.base import ObjectStore
from orchestrator.storage.transact import record_once, transact

LEDGER_FILENAME = "ledger.json"
DEFAULT_KEEP_CHECKPOINTS = 3  # CheckpointConfig.keep_last's default
# Set by the local supervisor for each child; begin_attempt stores it as the attempt's "launched_by",
# so the supervisor finds its child's attempt (and records its end when the child was killed).
LAUNCHED_BY_ENV = "ORCH_SUPERVISOR_TOKEN"
ZONE_FIELDS = ("zone", "zone_region", "zone_usd_per_hour", "zone_reason")  # an attempt's place (records.ledger_record)
MAX_CAPACITY_DECISIONS = 50  # the ledger is rewritten at every heartbeat: keep it small


def attempts_cost_usd(attempts: Iterable[Mapping[str, Any]]) -> float:
    """What a job's attempts cost together, as the ledger bills them: the one sum every figure uses."""
    return float(sum(float(a.get("cost_usd") or 0.0) for a in attempts))


def decode_ledger(raw: bytes) -> dict[str, Any]:
    """A ledger as stored, parsed; one written before the rename (``orchestrator.records.fencing``) reads as today's."""
    ledger: dict[str, Any] = upgraded_ledger(json.loads(raw))
    return ledger


def new_ledger(run_name: str) -> dict[str, Any]:
    """An empty ledger for ``run_name``, before any attempt."""
    return {
        "run_name": run_name,
        "status": RUNNING,
        "fence": 0,
        "attempts": [],
        "checkpoints": [],
        "checkpoints_committed": 0,
        "alerts": {},
        "mlflow_run_id": None,
        "cost_usd": 0.0,
        "step": 0,
        "created_at": time.time(),
        "repro": None,
    }


def _total_cost(ledger: dict[str, Any]) -> float:
    """The attempts' cost and that of the job's ``orchestrator eval`` runs (``evaluations``)."""
    return attempts_cost_usd(ledger["attempts"]) + attempts_cost_usd(evaluations(ledger))


def evaluations(ledger: dict[str, Any]) -> list[Any]:
    """The ``orchestrator eval`` runs billed to the job (``orchestrator.evaluation.billing``); none when the
    stored list is not one of dicts with a finite, non-negative cost (storage is untrusted)."""
    entries = ledger.get("evaluations")
    ok = isinstance(entries, list) and all(
        isinstance(e, dict)
        and isinstance(e.get("cost_usd"), (int, float))
        and not isinstance(e.get("cost_usd"), bool)
        and math.isfinite(e["cost_usd"])
        and e["cost_usd"] >= 0
        for e in entries
    )
    return cast("list[Any]", entries) if ok else []


def add_evaluation(ledger: dict[str, Any], entry: dict[str, Any]) -> None:
    """Add (or update, by ``id``) one ``orchestrator eval`` run's bill; the ledger's ``cost_usd`` counts it."""
    kept = [e for e in evaluations(ledger) if e.get("id") != entry["id"]]
    ledger["evaluations"] = kept + [entry]
    ledger["cost_usd"] = _total_cost(ledger)


class Ledger:
    """One job's ledger in ``store``.

    Args:
        store: where the job lives (``storage.uri``).
        run_name: the job's name; the ledger is ``<run_name>/ledger.json``.
        fence: the attempt this instance acts for. Set by ``begin_attempt``;
            pass it explicitly only to act for an attempt started elsewhere
            (a supervisor closing its child's attempt).
        keep_checkpoints: how many checkpoint records to keep (``checkpoint.keep_last``).
    """

    def __init__(
        self,
        store: ObjectStore,
        run_name: str,
        *,
        fence: int | None = None,
        keep_checkpoints: int = DEFAULT_KEEP_CHECKPOINTS,
    ):
        if not run_name or "/" in run_name:
            raise ValueError(f"run name {run_name!r} must be non-empty and contain no '/'")
        if keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints={keep_checkpoints} must be at least 1")
        self.store = store
        self.run_name = run_name
        self.key = f"{run_name}/{LEDGER_FILENAME}"
        self.fence = fence
        self.keep_checkpoints = int(keep_checkpoints)

    @property
    def uri(self) -> str:
        return self.store.get_uri(self.key)

    # -- reading -----------------------------------------------------------
    def load(self) -> dict[str, Any]:
        """The stored ledger, or {} when the job has never started."""
        try:
            return decode_ledger(self.store.get_bytes(self.key))
        except FileNotFoundError:
            return {}

    def current_attempt(self, ledger: dict[str, Any]) -> dict[str, Any]:
        """This instance's attempt in ``ledger``. Raises KeyError if absent."""
        for attempt in reversed(ledger.get("attempts", [])):
            if attempt["fence"] == self.fence:
                return cast("dict[str, Any]", attempt)
        raise KeyError(f"no attempt with fence {self.fence} in {self.uri}")

    # -- the one write path ------------------------------------------------
    # -- attempts ------------------------------------------------------------
    def begin_attempt(
        self,
        *,
        host: str,
        pid: int,
        instance_type: str | None,
        gpu_type: str | None,
        gpus: int,
        spot: bool,
        checkpoint_step: int,
        refuse: Callable[[LedgerRecord], UserError | str | None] | None = None,
        extra: dict[str, Any] | None = None,
        zone: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Start a new attempt and take the next fence, in one conditional write.

        Creates the ledger if absent; decodes it (``LedgerRecord.decode``: a ledger that does not decode raises
        ``CorruptRecord``, a DataError, and nothing is written); marks any attempt still "running" as
        "vanished" (ended at its last heartbeat); then asks ``refuse(record)``
        (the ledger decoded, with the vanished marks) for a reason to stop. If it returns a
        UserError (or a string: CapsReached of it), no attempt is added and that
        error is raised; the vanished marks are still written and, unless the
        job already had a final status, the status becomes the error's
        (``exitcodes.OUTCOMES``: "caps_reached", "budget_exhausted"). Otherwise
        bumps the fence, appends the attempt, sets status "running", and
        remembers the fence on this instance.

        ``zone``: where the attempt landed (``zone``, ``zone_region``, ``zone_usd_per_hour``, ``zone_reason``:
        ``orchestrator.attempt.zone``), stored on the attempt.

        Returns the new attempt dict. Raises the refusal (a UserError), or CorruptRecord.
        """
        refused: list[UserError] = []
        fields = dict(
            host=host,
            pid=pid,
            instance_type=instance_type,
            gpu_type=gpu_type,
            gpus=gpus,
            spot=spot,
            extra=dict(extra or {}),
            launched_by=os.environ.get(LAUNCHED_BY_ENV),
            rdzv_id=os.environ.get(RDZV_ID_ENV),
            **dict(zone or {}),
        )

        def mutate(ledger: dict[str, Any] | None) -> dict[str, Any] | None:
            created = ledger is None
            ledger = new_ledger(self.run_name) if ledger is None else ledger
            refused.clear()
            LedgerRecord.decode(ledger, self.uri)  # the job's own ledger: one that does not decode stops it here
            marked = _mark_vanished(ledger)
            reason = refuse(LedgerRecord.decode(ledger, self.uri)) if refuse is not None else None
            if reason:
                error = reason if isinstance(reason, UserError) else CapsReached(str(reason))
                refused.append(error)
                marked = _set_refused_status(ledger, error) or marked
                return ledger if (marked and not created) else None
            _append_attempt(ledger, checkpoint_step, fields)
            return ledger

        ledger = transact(self.store, self.key, mutate, decode=decode_ledger)
        if refused:
            raise refused[0]
        self.fence = ledger["fence"]
        return cast("dict[str, Any]", ledger["attempts"][-1])

    def update(self, fn: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
        """Fenced read-modify-write: ``fn(ledger)`` changes the ledger in place.

        ``fn`` may run more than once (once per lost race), each time on a
        fresh copy, so it must only change the dict it is given. Returns the
        ledger as written. Raises Fenced, without writing, when another
        attempt holds a newer fence.
        """

        def mutate(ledger: dict[str, Any] | None) -> dict[str, Any]:
            ledger = require_fence(ledger, self.fence, self.uri)
            fn(ledger)
            ledger["cost_usd"] = _total_cost(ledger)
            return ledger

        return transact(self.store, self.key, mutate, decode=decode_ledger)

    def check_fence(self) -> None:
        """Raise Fenced if another attempt has taken over; writes nothing."""
        require_fence(self.load() or None, self.fence, self.uri)

    def heartbeat(self, step: int, cost_usd: float) -> dict[str, Any]:
        """Record that this attempt is alive at ``step`` having cost ``cost_usd`` so far."""

        def fn(ledger: dict[str, Any]) -> None:
            attempt = self.current_attempt(ledger)
            attempt["last_seen"] = time.time()
            attempt["step_end"] = step
            attempt["cost_usd"] = float(cost_usd)
            ledger["step"] = step

        return self.update(fn)

    def record_checkpoint(self, step: int, key: str, size: int, cost_usd: float | None = None) -> dict[str, Any]:
        """Add a committed checkpoint (``key`` relative to the store) to the ledger.

        With ``cost_usd`` (the attempt's cost so far) it is also the attempt's heartbeat:
        one read-modify-write of the ledger per checkpoint instead of two. Only the
        newest ``keep_checkpoints`` records stay (by step, as retention keeps them
        in storage); ``checkpoints_committed`` counts them all.
        """
        record = {"step": step, "key": key, "size": int(size), "fence": self.fence}
        return self.update(
            lambda ledger: _add_checkpoint(
                ledger, self.current_attempt(ledger), record, keep=self.keep_checkpoints, cost_usd=cost_usd
            )
        )

    def end_attempt(
        self, exit_class: ExitClass | str, step: int, cost_usd: float, status: str | None = None
    ) -> dict[str, Any]:
        """Close this attempt with ``exit_class`` and set the job's ``status`` (one of RUN_STATUSES).

        ``status`` defaults to the one ``exitcodes.OUTCOMES`` gives ``exit_class``.
        """
        exit_value = ExitClass(exit_class).value
        status = outcome(exit_class).ledger_status if status is None else status
        if status not in RUN_STATUSES:
            raise ValueError(f"ledger status {status!r} is not one of {', '.join(RUN_STATUSES)}")

        def fn(ledger: dict[str, Any]) -> None:
            now = time.time()
            attempt = self.current_attempt(ledger)
            attempt.update(ended_at=now, last_seen=now, exit_class=exit_value, step_end=step, cost_usd=float(cost_usd))
            ledger["status"] = status
            ledger["step"] = step

        return self.update(fn)

    def close_lost_attempt(self, exit_class: ExitClass | str) -> bool:
        """Record the end of this instance's attempt that could not record it itself.

        For a supervisor whose child was killed (a vanished machine's process
        group, the kernel's OOM killer): the attempt with ``self.fence`` is
        closed with ``exit_class`` at its last heartbeat, keeping its step and
        cost, and the job takes that class's status. Writes nothing (returns
        False) when the attempt is gone, already closed, or another attempt
        has taken the job over (then that one has already marked it vanished).
        """
        exit_value = ExitClass(exit_class).value
        status = outcome(exit_class).ledger_status
        closed: list[bool] = []

        def mutate(ledger: dict[str, Any] | None) -> dict[str, Any] | None:
            closed[:] = [_close_lost(ledger, self.fence, exit_value, status)]
            return ledger if closed[0] else None

        transact(self.store, self.key, mutate, decode=decode_ledger)
        return closed == [True]

    def record_alert(self, name: str) -> bool:
        """Mark alert ``name`` as sent; True only the first time across the whole job (all attempts)."""
        return record_once(
            lambda mutate: transact(self.store, self.key, mutate, decode=decode_ledger),
            lambda ledger: require_fence(ledger, self.fence, self.uri),
            name,
            time.time,
        )

    def set_attempt_extra(self, **fields: Any) -> dict[str, Any]:
        """Merge ``fields`` into this attempt's ``extra`` (its measurements and decisions)."""
        return self.update(lambda ledger: self.current_attempt(ledger)["extra"].update(fields))

    def record_capacity(self, decision: dict[str, Any]) -> dict[str, Any]:
        """Append a capacity decision (``run.deadline``) to the job's ``capacity`` list, stamped with this attempt."""
        return self.update(lambda ledger: _append_capacity(ledger, dict(decision, time=time.time(), fence=self.fence)))

    def set_mlflow_run_id(self, run_id: str) -> dict[str, Any]:
        """Remember the job's MLflow run so every attempt logs into the same one."""
        return self.update(lambda ledger: ledger.__setitem__("mlflow_run_id", run_id))


def pin_input(ledger: Ledger, uri: str, digest: str) -> str | None:
    """Record ``digest`` as input ``uri``'s in the job's ledger the first time an attempt lists it (``inputs``); the
    digest recorded before when it is another (the objects under ``uri`` changed since), else None."""
    recorded: dict[str, Any] = {}

    def fn(doc: dict[str, Any]) -> None:
        inputs = doc.get("inputs")
        if not isinstance(inputs, dict):
            inputs = doc["inputs"] = {}
        earlier = inputs.get(uri)
        if not isinstance(earlier, str):  # the first lister's (a value that is no digest is replaced)
            inputs[uri] = earlier = digest
        recorded["earlier"] = earlier

    ledger.update(fn)
    return recorded["earlier"] if recorded["earlier"] != digest else None


# ---- the ledger's changes, as functions of the ledger dict (the Ledger writes them conditionally) ----
def _append_capacity(ledger: dict[str, Any], entry: dict[str, Any]) -> None:
    ledger["capacity"] = (list(ledger.get("capacity") or []) + [entry])[-MAX_CAPACITY_DECISIONS:]


def _mark_vanished(ledger: dict[str, Any]) -> bool:
    """Attempts still "running" when a new one begins are gone: ended at their last heartbeat."""
    marked = False
    for attempt in ledger["attempts"]:
        if attempt["exit_class"] == RUNNING:
            attempt["exit_class"] = ExitClass.VANISHED.value
            attempt["ended_at"] = attempt["last_seen"]
            for node in attempt.get("nodes") or []:  # a node lost with it could not record its end
                if isinstance(node, dict) and node.get("ended_at") is None:
                    node["ended_at"] = attempt["last_seen"]
            marked = True
    return marked


def _set_refused_status(ledger: dict[str, Any], error: UserError) -> bool:
    """A refused start sets the job's status from the refusal, unless the job already ended for good."""
    status = outcome(error.exit_class).ledger_status
    if ledger["status"] in FINAL_RUN_STATUSES or not status or ledger["status"] == status:
        return False
    ledger["status"] = status
    return True


def _append_attempt(ledger: dict[str, Any], checkpoint_step: int, fields: dict[str, Any]) -> None:
    now = time.time()
    ledger["fence"] = int(ledger["fence"]) + 1
    ledger["attempts"].append(
        {
            "fence": ledger["fence"],
            "host": fields["host"],
            "pid": fields["pid"],
            "started_at": now,
            "ended_at": None,
            "last_seen": now,
            "exit_class": RUNNING,
            "step_start": checkpoint_step,
            "step_end": checkpoint_step,
            "checkpoint_step_at_start": checkpoint_step,
            # the newest checkpoint this attempt committed: its durable progress (steps past it are lost)
            "checkpoint_step_end": checkpoint_step,
            "cost_usd": 0.0,
            "instance_type": fields["instance_type"],
            "gpu_type": fields["gpu_type"],
            "gpus": fields["gpus"],
            "spot": fields["spot"],
            "extra": fields["extra"],
            "launched_by": fields["launched_by"],
        }
    )
    if fields["rdzv_id"]:  # one node of several: its launchers record the nodes in it by this id
        ledger["attempts"][-1]["rdzv_id"] = fields["rdzv_id"]
    for key in ZONE_FIELDS:  # where it landed (compute.zones), when known
        if fields.get(key) is not None:
            ledger["attempts"][-1][key] = fields[key]
    ledger["status"] = RUNNING
    ledger["step"] = checkpoint_step
    ledger["cost_usd"] = _total_cost(ledger)


def _add_checkpoint(
    ledger: dict[str, Any], attempt: dict[str, Any], record: dict[str, Any], *, keep: int, cost_usd: float | None
) -> None:
    """Record a commit: the newest ``keep`` records by step stay, every commit is counted; the attempt's progress."""
    now = time.time()
    records = ledger.get("checkpoints") or []
    committed = int(ledger.get("checkpoints_committed", len(records)))
    records.append(dict(record, time=now))
    records.sort(key=lambda c: (int(c.get("step") or 0), int(c.get("fence") or 0)))
    ledger["checkpoints"] = records[-keep:]
    ledger["checkpoints_committed"] = committed + 1
    step = record["step"]
    attempt["last_seen"] = now
    attempt["step_end"] = max(int(attempt["step_end"] or 0), step)
    attempt["checkpoint_step_end"] = max(int(attempt.get("checkpoint_step_end") or 0), step)
    if cost_usd is not None:
        attempt["cost_usd"] = float(cost_usd)
    ledger["step"] = max(int(ledger.get("step") or 0), step)


def _close_lost(ledger: dict[str, Any] | None, fence: int | None, exit_value: str, status: str | None) -> bool:
    """Close attempt ``fence`` at its last heartbeat, if it still holds the job and has not ended."""
    if not ledger or int(ledger.get("fence", 0)) != fence:
        return False
    attempt = next((a for a in ledger["attempts"] if a["fence"] == fence), None)
    if attempt is None or attempt["exit_class"] != RUNNING:
        return False
    attempt["exit_class"] = exit_value
    attempt["ended_at"] = attempt["last_seen"]
    if status:
        ledger["status"] = status
    return True


def require_fence(ledger: dict[str, Any] | None, fence: int | None, uri: str) -> dict[str, Any]:
    """``ledger`` when attempt ``fence`` still holds the job; raises Fenced when another took it (or it is gone)."""
    if fence is None:
        raise RuntimeError("Ledger.update called before begin_attempt (or without a fence)")
    if ledger is None:
        raise Fenced(f"the ledger {uri} was deleted; this attempt (fence {fence}) stops")
    stored = int(ledger.get("fence", 0))
    if stored != fence:
        newer: dict[str, Any] = next((a for a in ledger.get("attempts", []) if a["fence"] == stored), {})
        raise Fenced(
            f"another attempt (fence {stored}, host {newer.get('host', '?')}) took over this job; "
            f"this attempt (fence {fence}) stops"
        )
    return ledger
