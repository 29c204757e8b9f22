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
     "usage": {"slot_seconds": float, "idle_seconds": float}, "mlflow_run_id": str (once MLflow has the parent run)}
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from orchestrator.core.errors import ConfigError, UserError
from orchestrator.core.exitcodes import ExitClass
from orchestrator.storage.transact import transact
from orchestrator.storage.base import ObjectStore, checked_json, finite_number

VERSION = 1
STATUSES = ("running", "paused", "pruned", "completed", "failed", "stopped")
DECISIONS = ("promote", "prune", "complete")
LIVE = ("running", "paused")  # a trial that may still train


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
    return doc


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
        problem = _trial_problem(trial, i)
        if problem:
            return f"trials[{i}]: {problem}"
    for i, d in enumerate(doc["decisions"]):
        if not (isinstance(d, dict) and d.get("decision") in DECISIONS and isinstance(d.get("trial"), int)
                and isinstance(d.get("rung"), int) and finite_number(d.get("value"))):
            return f"decisions[{i}] is {d!r}, not a decision"
    if not isinstance(doc.get("mlflow_run_id", ""), str):
        return f"mlflow_run_id is {doc['mlflow_run_id']!r}, not a run id"
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
    """The stored record of sweep ``name`` under ``store``; every change is one conditional write."""

    def __init__(self, store: ObjectStore, name: str):
        self.store, self.name = store, name
        self.key = state_key(name)
        self.uri = store.get_uri(self.key)

    def _decode(self, raw: bytes) -> dict:
        return parse_state(raw, self.uri)

    def load(self) -> Optional[dict]:
        try:
            return self._decode(self.store.get_bytes(self.key))
        except FileNotFoundError:
            return None

    def update(self, fn: Callable[[dict], Any]) -> dict:
        """Apply ``fn`` to the stored record (it must exist) and write it back conditionally."""
        def mutate(doc: Optional[dict]) -> dict:
            if doc is None:
                raise SweepStateCorrupt(f"the sweep state {self.uri} vanished while the sweep ran")
            fn(doc)
            return doc

        return transact(self.store, self.key, mutate, decode=self._decode)

    def open(self, *, space: dict, fixed: list[str], settings: dict, allow_changes: bool) -> dict:
        """The record, created on the first launch; a relaunch whose space, overrides or settings differ is
        refused with the difference (ConfigError, exit 4) unless ``allow_changes``, which records the new ones."""
        def mutate(doc: Optional[dict]) -> Optional[dict]:
            if doc is None:
                return {"version": VERSION, "name": self.name, "space": space, "fixed": fixed, "settings": settings,
                        "trials": [], "decisions": [], "usage": {"slot_seconds": 0.0, "idle_seconds": 0.0}}
            changes = describe_changes(doc, space=space, fixed=fixed, settings=settings)
            if not changes:
                return None
            if not allow_changes:
                raise ConfigError(f"sweep {self.name!r} ({self.uri}) was started with another search space or "
                                  f"overrides: {'; '.join(changes)}. Rerun it as it was, give a new sweep.name, or "
                                  "add sweep.allow_changes=true to go on with the new ones (past trials keep theirs).")
            doc.update(space=space, fixed=fixed, settings=settings)
            return doc

        return transact(self.store, self.key, mutate, decode=self._decode)

    def new_trial(self, params: dict) -> dict:
        """Number the next trial (one conditional write: numbering continues across drivers)."""
        made: dict = {}

        def fn(doc: dict) -> None:
            number = len(doc["trials"])
            made.clear()
            made.update(number=number, run_name=trial_run_name(self.name, number), params=params, rung=0,
                        status="running", values={}, launches=0)
            doc["trials"].append(dict(made))

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
