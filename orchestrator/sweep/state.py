"""The sweep's record: ``<storage.uri>/<sweep.name>/sweep.json``, moved only by the ledger's conditional write.

It holds what a driver on any machine needs to go on after a SIGKILL: the search space and the fixed
overrides (a relaunch that changes them is refused unless ``sweep.allow_changes``), the settings that
shape the decisions, every trial (number, run name, parameters, the rung it was launched to, its status
and its metric per rung) and every decision. Trial numbers are handed out by the same conditional write,
so two drivers never give one number twice. Every read is decoded once, in the records floor
(``orchestrator.records.sweep_record.SweepRecord``: the signature first, then types, finiteness and bounds): a
record that is not sound as a whole is one SweepStateCorrupt error naming the object (exit 4); a trial entry that
is not sound refuses that trial only (it reads as failed, with why).

Shape::

    {"version": 1, "name": str, "space": {key: [kind, ...]}, "fixed": [override, ...], "settings": {...},
     "trials": [{"number": k, "run_name": "<name>-t<k>", "params": {key: value}, "rung": r,
                 "status": "running" | "paused" | "pruned" | "completed" | "failed" | "stopped",
                 "values": {"<rung>": float}, "launches": n, "submitted": attempts at submission (a scheduler's
                 backend; None: local), "launched_at": wall time of the last launch (written before it),
                 "log_offset": the trial log's size then, "launcher": {"host": str, "pid": int, "started": float}
                 or None (sweep/backends.py: how a relaunched driver adopts it)}],
     "decisions": [{"trial": k, "rung": r, "value": float, "decision": "promote" | "prune" | "complete"}],
     "usage": {"slot_seconds": float, "idle_seconds": float}, "mlflow_run_id": str (once MLflow has the parent run),
     "space_since": the first trial sampled under the current space and sampler (``trust.launch_params``),
     "fence": int, "driver": {"host", "pid", "started", "renewed_at"} or None (``lease``: one driver at a time),
     "signature": HMAC-SHA256 (with ``ORCH_MANIFEST_HMAC_KEY`` set; ``trust.sign``)}

The record names its sweep (``name``) and every trial's run name is ``<name>-t<number>``: a record copied under
another name is refused. A swept secret is stored redacted (``trust.stored_params``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any, Callable, Optional, Union, cast

from orchestrator.core.errors import ConfigError, UserError
from orchestrator.core.exitcodes import ExitClass
from orchestrator.records.fields import CorruptRecord
from orchestrator.records.sweep_record import DECISIONS, LIVE, STATUSES, VERSION, SweepRecord, TrialEntry
from orchestrator.records.sweep_record import trial_run_name as trial_run_name
from orchestrator.storage.base import ObjectStore
from orchestrator.storage.transact import transact
from orchestrator.sweep import lease, trust

log = logging.getLogger(__name__)
__all__ = [
    "DECISIONS",
    "LIVE",
    "STATUSES",
    "VERSION",
    "SweepState",
    "SweepStateCorrupt",
    "decode_state",
    "parse_state",
    "state_key",
    "trial_run_name",
]
_FIX = (
    "Restore it from a copy, or start the sweep again under a new sweep.name (its trials' checkpoints are untouched)."
)


class SweepStateCorrupt(UserError):
    """The sweep's stored state cannot be read: one message naming the object and what is wrong."""

    exit_class = ExitClass.CONFIG_ERROR


def state_key(name: str) -> str:
    return f"{name}/sweep.json"


def decode_state(raw: bytes, where: str) -> SweepRecord:
    """The stored bytes decoded (``SweepRecord.decode``: signature, shape, types, bounds); SweepStateCorrupt
    (exit 4) naming the object and what is wrong. A trial entry that does not decode is that trial's only."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise SweepStateCorrupt(
            f"the sweep state {where} is unreadable: it is not JSON ({str(err)[:120]}). {_FIX}"
        ) from None
    try:
        return SweepRecord.decode(doc, where)
    except CorruptRecord as err:
        field = err.where[len(where) :].strip()
        raise SweepStateCorrupt(
            f"the sweep state {where} is unreadable: {field + ' ' if field else ''}{err.problem}. {_FIX}"
        ) from None


def parse_state(raw: bytes, where: str) -> dict[str, Any]:
    """The record as stored, decoded first (``decode_state``): for a reader of its raw shape (``orchestrator ls``)."""
    return decode_state(raw, where).encode()


_WARNED: set[tuple[str, int]] = set()


class SweepState:
    """The stored record of sweep ``name`` under ``store``; every change is one conditional write, and once this
    driver holds the sweep's lease (``open``) every write checks and renews it (``lease``). Reads give the record
    decoded (``SweepRecord``, its trials bounded by its space and schedule: ``trust.bounds``); a write's function
    gets the record as stored (``SweepRecord.encode``) and changes it in place."""

    def __init__(self, store: ObjectStore, name: str):
        self.store, self.name = store, name
        self.key = state_key(name)
        self.uri = store.get_uri(self.key)
        self.fence: Optional[int] = None  # the lease's fence while this driver holds it
        self.holder: Optional[dict] = None
        self._read: Optional[SweepRecord] = None

    def _decode(self, raw: bytes) -> SweepRecord:
        return self._checked(decode_state(raw, self.uri))

    def _checked(self, record: SweepRecord) -> SweepRecord:
        if record.name != self.name:
            raise SweepStateCorrupt(
                f"the sweep state {self.uri} is refused: it names the sweep {record.name!r}, not "
                f"{self.name!r} (a record copied from another sweep). {_FIX}"
            )
        for number in record.broken:
            if (self.uri, number) not in _WARNED:
                _WARNED.add((self.uri, number))
                log.warning(
                    "sweep %s: trial %d (%s) is refused: %s. It is not launched again; the sweep's other trials go on.",
                    self.name,
                    number,
                    record.trials[number].run_name,
                    record.trials[number].refused,
                )
        try:
            return record.within(trust.bounds(record))
        except (UserError, ValueError, KeyError, TypeError) as err:
            raise SweepStateCorrupt(
                f"the sweep state {self.uri} is unreadable: its space is not one ({str(err)[:200]}). {_FIX}"
            ) from None

    def load(self) -> Optional[SweepRecord]:
        try:
            return self._decode(self.store.get_bytes(self.key))
        except FileNotFoundError:
            return None

    def loaded(self) -> SweepRecord:
        """The record, which must exist (a driver's, after ``open``)."""
        record = self.load()
        if record is None:
            raise SweepStateCorrupt(f"the sweep state {self.uri} vanished while the sweep ran")
        return record

    def _write(self, mutate: Callable[[Optional[dict]], Optional[dict]]) -> Optional[SweepRecord]:
        def signed(doc: Optional[dict]) -> Optional[dict]:
            out = mutate(doc)
            if out is None:
                return None
            out = trust.sign(out)
            self._checked(decode_state(json.dumps(out).encode(), self.uri))  # nothing unsound is written
            return out

        def decode(raw: bytes) -> dict:
            self._read = self._decode(raw)  # what this round's ``mutate`` changes, decoded
            return self._read.encode()

        written = transact(self.store, self.key, signed, decode=decode)
        return self._checked(decode_state(json.dumps(written).encode(), self.uri)) if written else None

    def update(self, fn: Callable[[dict], Any]) -> SweepRecord:
        """Apply ``fn`` to the stored record (it must exist) and write it back conditionally; SweepLeaseLost,
        nothing written, when this driver held the lease and another driver has taken it over."""

        def mutate(doc: Optional[dict]) -> dict:
            if doc is None:
                raise SweepStateCorrupt(f"the sweep state {self.uri} vanished while the sweep ran")
            if self.fence is not None:
                lease.renew(doc, cast("dict[str, Any]", self.holder), self.fence, self.uri)  # set with the fence
            fn(doc)
            return doc

        return cast(SweepRecord, self._write(mutate))

    def open(self, *, space: dict, fixed: list[str], settings: dict, allow_changes: bool) -> SweepRecord:
        """The record, created on the first launch, and this driver's lease on it (``lease.take``: SweepBusy,
        exit 6, while another driver lives); a relaunch whose space, overrides or settings differ is refused with
        the difference (ConfigError, exit 4) unless ``allow_changes``, which records the new ones (trials sampled
        before keep theirs: ``space_since``)."""
        space = trust.stored_space(space)
        holder = lease.me()

        def mutate(doc: Optional[dict]) -> dict:
            if doc is None:
                doc = {
                    "version": VERSION,
                    "name": self.name,
                    "space": space,
                    "fixed": fixed,
                    "settings": settings,
                    "trials": [],
                    "decisions": [],
                    "usage": {"slot_seconds": 0.0, "idle_seconds": 0.0},
                    "space_since": 0,
                }
            fence.clear()
            fence.append(lease.take(doc, holder, self.uri))
            changes = describe_changes(
                doc["space"], doc["fixed"], doc["settings"], space=space, fixed=fixed, settings=settings
            )
            if changes and not allow_changes:
                raise ConfigError(
                    f"sweep {self.name!r} ({self.uri}) was started with another search space or "
                    f"overrides: {'; '.join(changes)}. Rerun it as it was, give a new sweep.name, or "
                    "add sweep.allow_changes=true to go on with the new ones (past trials keep theirs)."
                )
            if any(not line.startswith("override ") for line in changes):  # the space or the sampler changed
                doc["space_since"] = len(doc["trials"])
            doc.update(space=space, fixed=fixed, settings=settings)
            return doc

        fence: list[int] = []
        record = cast(SweepRecord, self._write(mutate))
        self.fence, self.holder = fence[0], holder
        return record

    def release(self) -> None:
        """Give this driver's lease up (at its end), so the next driver takes the sweep at once."""
        if self.fence is not None:
            fence, holder, self.fence = self.fence, cast("dict[str, Any]", self.holder), None  # set with the fence
            self._write(lambda doc: doc if doc is not None and lease.release(doc, holder, fence) else None)

    def new_trial(self, params: Union[dict, Callable[[tuple[TrialEntry, ...]], dict]]) -> TrialEntry:
        """Number the next trial (one conditional write: numbering continues across drivers). ``params``: its
        parameters, or a function of the stored trials (decoded) that gives them (the sampler, asked inside the
        write). Returns the trial with its parameters as given (the record keeps a secret redacted)."""
        made: list[tuple[int, dict]] = []  # this write's trial number and parameters (its last round's)

        def fn(doc: dict) -> None:
            number = len(doc["trials"])
            values = params(cast(SweepRecord, self._read).trials) if callable(params) else params
            made.append((number, values))
            doc["trials"].append(
                dict(
                    number=number,
                    run_name=trial_run_name(self.name, number),
                    params=trust.stored_params(values),
                    rung=0,
                    status="running",
                    values={},
                    launches=0,
                )
            )

        record = self.update(fn)
        number, values = made[-1]
        return replace(record.trials[number], params=values)


def describe_changes(
    old_space: dict, old_fixed: list[str], old_settings: dict, *, space: dict, fixed: list[str], settings: dict
) -> list[str]:
    from orchestrator.sweep.space import SearchSpace

    lines = SearchSpace.from_specs(space).difference(SearchSpace.from_specs(old_space))
    old, new = set(old_fixed), set(fixed)
    lines += [f"override {o} dropped" for o in sorted(old - new)]
    lines += [f"override {o} added" for o in sorted(new - old)]
    lines += [
        f"sweep.{k}: {old_settings.get(k)!r} -> {settings.get(k)!r}"
        for k in sorted(set(settings) | set(old_settings))
        if settings.get(k) != old_settings.get(k)
    ]
    return lines
