"""The sweep's record: ``<storage.uri>/<sweep.name>/sweep.json``, moved only by the ledger's conditional write.

It holds what a driver on any machine needs to go on after a SIGKILL: the search space and the fixed
overrides (a relaunch that changes them is refused unless ``sweep.allow_changes``), the settings that
shape the decisions, every trial (number, run name, parameters, the rung it was launched to, its status
and its metric per rung) and every decision. Trial numbers are handed out by the same conditional write,
so two drivers never give one number twice. Every read is checked (``parse_state``): a document that is
not this shape, or holds a number that is not finite, is one SweepStateCorrupt error naming the object.

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

import re
from typing import Any, Callable, Optional, Union, cast

from orchestrator.core.errors import ConfigError, UserError
from orchestrator.core.exitcodes import ExitClass
from orchestrator.storage.base import ObjectStore, checked_json, finite_number
from orchestrator.storage.transact import transact
from orchestrator.sweep import lease, trust

VERSION = 1
STATUSES = ("running", "paused", "pruned", "completed", "failed", "stopped")
DECISIONS = ("promote", "prune", "complete")
LIVE = ("running", "paused")  # a trial that may still train
RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # an MLflow run id (it reaches the trials' command lines)


class SweepStateCorrupt(UserError):
    """The sweep's stored state cannot be read: one message naming the object and what is wrong."""

    exit_class = ExitClass.CONFIG_ERROR


def state_key(name: str) -> str:
    return f"{name}/sweep.json"


def trial_run_name(name: str, number: int) -> str:
    return f"{name}-t{number}"


def parse_state(raw: bytes, where: str) -> dict:
    doc, problem = checked_json(raw, state_problem)
    if problem:
        raise SweepStateCorrupt(f"the sweep state {where} is unreadable: {problem}. Restore it from a copy, or start "
                                "the sweep again under a new sweep.name (its trials' checkpoints are untouched).")
    return cast("dict[str, Any]", doc)


def state_problem(doc: Any) -> Optional[str]:
    if not isinstance(doc, dict):
        return "the document is not an object"
    if doc.get("version") != VERSION:
        return f"version is {doc.get('version')!r}, not {VERSION}"
    for field, kind in (("name", str), ("space", dict), ("fixed", list), ("settings", dict), ("trials", list),
                        ("decisions", list), ("usage", dict)):
        if not isinstance(doc.get(field), kind):
            return f"{field} is {doc.get(field)!r}, not a {kind.__name__}"
    for i, trial in enumerate(doc["trials"]):
        problem = _trial_problem(trial, i) or (None if trial["run_name"] == trial_run_name(doc["name"], i) else
                                               f"run_name is {trial['run_name']!r}, not {trial_run_name(doc['name'], i)!r}")
        if problem:
            return f"trials[{i}]: {problem}"
    for i, d in enumerate(doc["decisions"]):
        if not (isinstance(d, dict) and d.get("decision") in DECISIONS and isinstance(d.get("trial"), int)
                and isinstance(d.get("rung"), int) and finite_number(d.get("value"))):
            return f"decisions[{i}] is {d!r}, not a decision"
    if "mlflow_run_id" in doc and not (isinstance(doc["mlflow_run_id"], str) and RUN_ID.fullmatch(doc["mlflow_run_id"])):
        return f"mlflow_run_id is {doc['mlflow_run_id']!r}, not a run id"
    since = doc.get("space_since", 0)
    if not isinstance(since, int) or isinstance(since, bool) or not 0 <= since <= len(doc["trials"]):
        return f"space_since is {since!r}, not a trial number"
    if lease.lease_problem(doc):
        return lease.lease_problem(doc)
    if not all(finite_number(v) and v >= 0 for v in doc["usage"].values()):
        return f"usage holds {doc['usage']!r}, not finite non-negative numbers"
    return None


def _trial_problem(trial: Any, i: int) -> Optional[str]:
    if not isinstance(trial, dict):
        return "not an object"
    if trial.get("number") != i:
        return f"number is {trial.get('number')!r}, not {i}"
    if trial.get("status") not in STATUSES:
        return f"status is {trial.get('status')!r}, not one of {', '.join(STATUSES)}"
    if not isinstance(trial.get("rung"), int) or trial["rung"] < 0 or not isinstance(trial.get("launches"), int):
        return "rung or launches is not a non-negative integer"
    if not isinstance(trial.get("params"), dict) or not isinstance(trial.get("run_name"), str):
        return "params or run_name is missing"
    if not isinstance(trial.get("submitted"), (int, type(None))) or isinstance(trial.get("submitted"), bool):
        return f"submitted is {trial.get('submitted')!r}, not a count of attempts"
    if not all(finite_number(trial.get(k, 0)) and trial.get(k, 0) >= 0 for k in ("launched_at", "log_offset")):
        return f"launched_at or log_offset is not a non-negative number: {trial.get('launched_at')!r}, " \
               f"{trial.get('log_offset')!r}"
    who = trial.get("launcher")
    if who is not None and not (isinstance(who, dict) and isinstance(who.get("host"), str)
                                and isinstance(who.get("pid"), int) and finite_number(who.get("started"))):
        return f"launcher is {who!r}, not a host, pid and start time"
    values = trial.get("values")
    if not isinstance(values, dict) or not all(k.isdigit() and finite_number(v) for k, v in values.items()):
        return f"values is {values!r}, not rung -> finite number"
    return None


class SweepState:
    """The stored record of sweep ``name`` under ``store``; every change is one conditional write, and once this
    driver holds the sweep's lease (``open``) every write checks and renews it (``lease``)."""

    def __init__(self, store: ObjectStore, name: str):
        self.store, self.name = store, name
        self.key = state_key(name)
        self.uri = store.get_uri(self.key)
        self.fence: Optional[int] = None  # the lease's fence while this driver holds it
        self.holder: Optional[dict] = None

    def _decode(self, raw: bytes) -> dict:
        doc = parse_state(raw, self.uri)
        problem = (f"it names the sweep {doc['name']!r}, not {self.name!r} (a record copied from another sweep)"
                   if doc["name"] != self.name else trust.signature_problem(doc))
        if problem:
            raise SweepStateCorrupt(f"the sweep state {self.uri} is refused: {problem}. Restore it from a copy, or "
                                    "start the sweep again under a new sweep.name (its trials' checkpoints are "
                                    "untouched).")
        return doc

    def load(self) -> Optional[dict]:
        try:
            return self._decode(self.store.get_bytes(self.key))
        except FileNotFoundError:
            return None

    def _write(self, mutate: Callable[[Optional[dict]], Optional[dict]]) -> dict:
        def signed(doc: Optional[dict]) -> Optional[dict]:
            out = mutate(doc)
            return None if out is None else trust.sign(out)

        return transact(self.store, self.key, signed, decode=self._decode)

    def update(self, fn: Callable[[dict], Any]) -> dict:
        """Apply ``fn`` to the stored record (it must exist) and write it back conditionally; SweepLeaseLost,
        nothing written, when this driver held the lease and another driver has taken it over."""
        def mutate(doc: Optional[dict]) -> dict:
            if doc is None:
                raise SweepStateCorrupt(f"the sweep state {self.uri} vanished while the sweep ran")
            if self.fence is not None:
                lease.renew(doc, cast("dict[str, Any]", self.holder), self.fence, self.uri)  # set with the fence
            fn(doc)
            return doc

        return self._write(mutate)

    def open(self, *, space: dict, fixed: list[str], settings: dict, allow_changes: bool) -> dict:
        """The record, created on the first launch, and this driver's lease on it (``lease.take``: SweepBusy,
        exit 6, while another driver lives); a relaunch whose space, overrides or settings differ is refused with
        the difference (ConfigError, exit 4) unless ``allow_changes``, which records the new ones (trials sampled
        before keep theirs: ``space_since``)."""
        space = trust.stored_space(space)
        holder = lease.me()

        def mutate(doc: Optional[dict]) -> dict:
            if doc is None:
                doc = {"version": VERSION, "name": self.name, "space": space, "fixed": fixed, "settings": settings,
                       "trials": [], "decisions": [], "usage": {"slot_seconds": 0.0, "idle_seconds": 0.0},
                       "space_since": 0}
            fence.clear()
            fence.append(lease.take(doc, holder, self.uri))
            changes = describe_changes(doc, space=space, fixed=fixed, settings=settings)
            if changes and not allow_changes:
                raise ConfigError(f"sweep {self.name!r} ({self.uri}) was started with another search space or "
                                  f"overrides: {'; '.join(changes)}. Rerun it as it was, give a new sweep.name, or "
                                  "add sweep.allow_changes=true to go on with the new ones (past trials keep theirs).")
            if any(not line.startswith("override ") for line in changes):  # the space or the sampler changed
                doc["space_since"] = len(doc["trials"])
            doc.update(space=space, fixed=fixed, settings=settings)
            return doc

        fence: list[int] = []
        doc = self._write(mutate)
        self.fence, self.holder = fence[0], holder
        return doc

    def release(self) -> None:
        """Give this driver's lease up (at its end), so the next driver takes the sweep at once."""
        if self.fence is not None:
            fence, holder, self.fence = self.fence, cast("dict[str, Any]", self.holder), None  # set with the fence
            self._write(lambda doc: doc if doc is not None and lease.release(doc, holder, fence) else None)

    def new_trial(self, params: Union[dict, Callable[[list], dict]]) -> dict:
        """Number the next trial (one conditional write: numbering continues across drivers). ``params``: its
        parameters, or a function of the stored trials that gives them (the sampler, asked inside the write)."""
        made: dict = {}

        def fn(doc: dict) -> None:
            number = len(doc["trials"])
            values = params(doc["trials"]) if callable(params) else params
            made.clear()
            made.update(number=number, run_name=trial_run_name(self.name, number), params=values, rung=0,
                        status="running", values={}, launches=0)
            doc["trials"].append(dict(made, params=trust.stored_params(values)))

        self.update(fn)
        return made


def describe_changes(doc: dict, *, space: dict, fixed: list[str], settings: dict) -> list[str]:
    from orchestrator.sweep.space import SearchSpace

    lines = SearchSpace.from_specs(space).difference(SearchSpace.from_specs(doc["space"]))
    old_fixed, new_fixed = set(doc["fixed"]), set(fixed)
    lines += [f"override {o} dropped" for o in sorted(old_fixed - new_fixed)]
    lines += [f"override {o} added" for o in sorted(new_fixed - old_fixed)]
    lines += [f"sweep.{k}: {doc['settings'].get(k)!r} -> {settings.get(k)!r}"
              for k in sorted(set(settings) | set(doc["settings"])) if settings.get(k) != doc["settings"].get(k)]
    return lines
