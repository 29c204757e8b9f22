"""A sweep's record (``<storage.uri>/<sweep.name>/sweep.json``) and what a sweep reads of its trials' ledgers, as
their readers see them: one decode into types, with types, finiteness and bounds checked (issue 41).

The record is written by the sweep's driver (``orchestrator.sweep.state``: its shape, its conditional writes, its
lease) and read back from storage, so whatever it holds is untrusted. ``SweepRecord.decode`` is the one reading:

- the signature first (with ``ORCH_MANIFEST_HMAC_KEY`` set: ``orchestrator.core.signing``), then every field;
- a record that is not an object, of another version, whose name, space, overrides, settings, decisions, usage,
  MLflow run id, lease or trial numbering is not sound is one ``CorruptRecord`` naming the object and the field
  (the sweep prints it as one error and exits 4: ``SweepStateCorrupt``);
- a trial entry whose own fields are not sound (a status that is no status, a rung result of NaN, a launch time
  of 1e300) refuses that trial only: it reads as ``failed`` with why (``refused``), and the next write keeps it so;
  the sweep's other trials go on;
- ``within`` bounds the trials by the sweep's space and schedule, handed in as plain data (``SweepBounds``: the
  sweep's floor is above this one): a parameter outside the space, or a rung (or a rung result) past the trial's
  schedule, marks that trial (``params_problem``, ``rung_problem``) and the driver refuses it when it would
  launch it.

``encode`` writes the stored shape back (an old record reads, and is written, the same). ``TrialLedger`` is what
the sweep reads of a trial's ledger: the ledger's own decode (``LedgerRecord``), its evaluations per step, and no
start-up over a week (``1e300`` once set ``compute.restart_seconds`` and ended a sweep silently).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

from orchestrator.core.signing import signature_problem
from orchestrator.records.fields import MAX_STEPS, MAX_TEXT, MAX_USD, CorruptRecord, Fields
from orchestrator.records.ledger_record import MAX_PID, LedgerRecord

VERSION = 1
STATUSES = ("running", "paused", "pruned", "completed", "failed", "stopped")
LIVE = ("running", "paused")  # a trial that may still train
DECISIONS = ("promote", "prune", "complete")
MAX_TRIALS = 100_000
MAX_RUNGS = 64
MAX_START_UP_S = 7 * 86400.0  # a start-up longer is a corrupt ledger, not a slow machine
MAX_SECONDS = 1e10  # slot seconds of a sweep: ~300 years
_RUN_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def trial_run_name(name: str, number: int) -> str:
    return f"{name}-t{number}"


def _scalar(value: Any, what: str, f: Fields) -> Any:
    """A parameter's value: a JSON scalar, a number finite, a text no longer than a field's."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise f.fail(what, f"is {value!r}, not a finite number")
        return value
    if isinstance(value, str) and len(value) <= MAX_TEXT:
        return value
    raise f.fail(what, f"is {str(value)[:40]!r}, not a parameter value (a number, a text, true or false)")


@dataclass(frozen=True)
class Launcher:
    """Who launched a trial (``sweep.backends.launcher_identity``), or who drives the sweep (``renewed_at`` set)."""

    host: str
    pid: int
    started: float
    renewed_at: Optional[float] = None

    @classmethod
    def decode(cls, f: Fields, *, lease: bool = False) -> "Launcher":
        return cls(
            host=f.text("host"),
            pid=f.whole("pid", low=0 if not lease else 1, high=MAX_PID),
            started=f.number("started", high=MAX_SECONDS),
            renewed_at=f.number("renewed_at", high=MAX_SECONDS) if lease else None,
        )

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host, "pid": self.pid, "started": self.started}
        return out if self.renewed_at is None else dict(out, renewed_at=self.renewed_at)


@dataclass(frozen=True)
class TrialEntry:
    """One trial: its number and run name, parameters (as stored: a secret redacted), rung, status, its metric
    per rung it reached, and how it was launched."""

    number: int
    run_name: str
    params: Mapping[str, Any]
    rung: int
    status: str
    values: Mapping[int, float]  # rung -> the trial's metric there
    launches: int
    submitted: Optional[int] = None  # attempts in its ledger at submission (a scheduler's backend)
    launched_at: Optional[float] = None  # wall time of its last launch, written before it
    log_offset: Optional[int] = None  # its log's size then
    launcher: Optional[Launcher] = None
    refused: Optional[str] = None  # why it was refused (never launched again)
    rung_problem: Optional[str] = None  # not stored: its rung or a result past its schedule (``within``)
    params_problem: Optional[str] = None  # not stored: a parameter outside the sweep's space (``within``)

    @classmethod
    def decode(cls, f: Fields, number: int, name: str) -> "TrialEntry":
        params = f.mapping("params")
        pf = Fields(params, f"{f.where} params")
        if "params" not in f.doc:
            raise f.fail("params", "is missing")
        values = f.mapping("values")
        vf = Fields(values, f"{f.where} values")
        rungs: dict[int, float] = {}
        for key in values:
            if not (isinstance(key, str) and key.isdigit() and int(key) < MAX_RUNGS):
                raise f.fail("values", f"holds {str(key)[:20]!r}, not a rung number")
            rungs[int(key)] = float(vf.number(key, low=-math.inf, high=math.inf))
        launcher = f.mapping("launcher") if f.doc.get("launcher") is not None else None
        return cls(
            number=number,
            run_name=name,
            params={str(k): _scalar(v, str(k), pf) for k, v in params.items()},
            rung=f.whole("rung", high=MAX_RUNGS),
            status=f.choice("status", STATUSES),
            values=rungs,
            launches=f.whole("launches", high=MAX_STEPS),
            submitted=f.whole("submitted", high=MAX_STEPS, default=None),
            launched_at=f.time("launched_at"),
            log_offset=f.whole("log_offset", high=2**62, default=None),
            launcher=None if launcher is None else Launcher.decode(Fields(launcher, f"{f.where} launcher")),
            refused=f.text("refused", None),
        )

    @classmethod
    def broken(cls, number: int, name: str, problem: str) -> "TrialEntry":
        """A trial whose entry does not decode: failed, with why; the sweep's other trials go on."""
        return cls(
            number=number,
            run_name=name,
            params={},
            rung=0,
            status="failed",
            values={},
            launches=0,
            refused=f"its entry in the sweep's record is corrupt: {problem}"[:500],
        )

    @property
    def live(self) -> bool:
        return self.status in LIVE

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "number": self.number,
            "run_name": self.run_name,
            "params": dict(self.params),
            "rung": self.rung,
            "status": self.status,
            "values": {str(r): v for r, v in sorted(self.values.items())},
            "launches": self.launches,
        }
        for key, value in (
            ("submitted", self.submitted),
            ("launched_at", self.launched_at),
            ("log_offset", self.log_offset),
            ("refused", self.refused),
        ):
            if value is not None:
                out[key] = value
        if self.launcher is not None or self.launched_at is not None:
            out["launcher"] = None if self.launcher is None else self.launcher.encode()
        return out


@dataclass(frozen=True)
class Decision:
    trial: int
    rung: int
    value: float
    decision: str
    at: Optional[float] = None

    @classmethod
    def decode(cls, f: Fields) -> "Decision":
        return cls(
            trial=f.whole("trial", high=MAX_TRIALS),
            rung=f.whole("rung", high=MAX_RUNGS),
            value=f.number("value", low=-math.inf, high=math.inf),
            decision=f.choice("decision", DECISIONS),
            at=f.time("at"),
        )

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"trial": self.trial, "rung": self.rung, "value": self.value, "decision": self.decision}
        return out if self.at is None else dict(out, at=self.at)


@dataclass(frozen=True)
class SweepBounds:
    """The sweep's space and schedule as plain data, for ``SweepRecord.within``.

    ``domains``: key -> ``("interval", low, high, whole)`` (``whole``: an int interval) or ``("choice", values)``
    (the values a categorical or a range gives, as the record stores them: a secret redacted); ``rungs``: trial
    number -> how many rungs its schedule has (a trial not named is not bounded by rung)."""

    domains: Mapping[str, tuple[Any, ...]]
    rungs: Mapping[int, int]

    def params_problem(self, params: Mapping[str, Any]) -> Optional[str]:
        if set(params) != set(self.domains):
            extra, missing = sorted(set(params) - set(self.domains)), sorted(set(self.domains) - set(params))
            return (
                f"its stored parameters name keys outside the sweep's space ({', '.join(extra) or '-'}) or lack "
                f"some of it ({', '.join(missing) or '-'})"
            )
        for key, value in sorted(params.items()):
            if not _in(self.domains[key], value):
                return f"its stored {key}={value!r} is outside the sweep's space"
        return None

    def rung_problem(self, trial: TrialEntry) -> Optional[str]:
        n = self.rungs.get(trial.number)
        if n is None:
            return None
        if trial.rung >= n:
            return f"its rung is {trial.rung}, past its schedule of {n} rung(s)"
        late = sorted(r for r in trial.values if r >= n)
        return f"it holds results at rung(s) {', '.join(map(str, late))}, past its schedule of {n}" if late else None


def _in(domain: tuple[Any, ...], value: Any) -> bool:
    """``value`` in ``domain`` (``SweepBounds``): a choice of its own type, or a number within its interval."""
    if domain[0] != "interval":
        return any(type(value) is type(c) and value == c for c in domain[1])
    _, low, high, whole = domain
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (not whole or isinstance(value, int)) and low <= value <= high


@dataclass(frozen=True)
class SweepRecord:
    """The sweep's record, decoded. ``where``: its URI (what an error names)."""

    where: str
    name: str
    space: Mapping[str, Any]  # key -> spec, as stored (``orchestrator.sweep.space``'s JSON, a secret redacted)
    fixed: tuple[str, ...]
    settings: Mapping[str, Any]
    trials: tuple[TrialEntry, ...]
    decisions: tuple[Decision, ...]
    slot_seconds: float
    idle_seconds: float
    space_since: int  # the first trial sampled under the current space and sampler
    fence: int
    driver: Optional[Launcher]  # the lease's holder (``renewed_at`` set)
    mlflow_run_id: Optional[str] = None
    broken: tuple[int, ...] = ()  # trials whose entry did not decode (read as failed)

    @classmethod
    def decode(cls, doc: Any, where: str) -> "SweepRecord":
        """``doc`` (the parsed sweep.json) into types; CorruptRecord naming ``where`` and the field. The signature
        is checked first (``ORCH_MANIFEST_HMAC_KEY`` set)."""
        f = Fields(doc, where)
        problem = signature_problem(dict(f.doc), "the record")
        if problem:
            raise CorruptRecord(where, problem)
        version = f.doc.get("version")
        if version != VERSION or isinstance(version, bool):
            raise f.fail("version", f"is {str(version)[:20]!r}, not {VERSION}")
        name = f.text("name", limit=200)
        space = f.mapping("space")
        if "space" not in f.doc or not all(isinstance(s, list) and s for s in space.values()):
            raise f.fail("space", "is not a table of keys and their specs")
        fixed = f.doc.get("fixed")
        if not isinstance(fixed, list) or not all(isinstance(o, str) and len(o) <= MAX_TEXT for o in fixed):
            raise f.fail("fixed", "is not a list of overrides")
        trials, broken = cls._trials(f, name)
        usage = Fields(f.mapping("usage"), f"{where} usage")
        since = f.whole("space_since", high=len(trials), default=0)
        driver = f.mapping("driver") if f.doc.get("driver") is not None else None
        run_id = f.text("mlflow_run_id", None, limit=64)
        if run_id is not None and (not run_id or set(run_id) - _RUN_ID_CHARS):
            raise f.fail("mlflow_run_id", f"is {run_id!r}, not a run id")
        return cls(
            where=where,
            name=name,
            space=dict(space),
            fixed=tuple(fixed),
            settings=_settings(f),
            trials=trials,
            decisions=tuple(Decision.decode(d) for d in f.objects("decisions")),
            slot_seconds=usage.number("slot_seconds", high=MAX_SECONDS, default=0.0),
            idle_seconds=usage.number("idle_seconds", high=MAX_SECONDS, default=0.0),
            space_since=since,
            fence=f.whole("fence", default=0),
            driver=None if driver is None else Launcher.decode(Fields(driver, f"{where} driver"), lease=True),
            mlflow_run_id=run_id,
            broken=broken,
        )

    @staticmethod
    def _trials(f: Fields, name: str) -> tuple[tuple[TrialEntry, ...], tuple[int, ...]]:
        """The trials in number order; one whose entry does not decode is read as failed (``TrialEntry.broken``).
        Its number and run name are the record's own (``<name>-t<k>``): another is a copied record, refused."""
        if not isinstance(f.doc.get("trials"), list):
            raise f.fail("trials", f"is {str(f.doc.get('trials'))[:40]!r}, not a list")
        if len(f.doc["trials"]) > MAX_TRIALS:
            raise f.fail("trials", f"holds {len(f.doc['trials'])} trials (at most {MAX_TRIALS})")
        out: list[TrialEntry] = []
        broken: list[int] = []
        for k, item in enumerate(f.doc["trials"]):
            run_name = trial_run_name(name, k)
            if not isinstance(item, Mapping):
                out.append(TrialEntry.broken(k, run_name, f"it is a JSON {type(item).__name__}, not an object"))
                broken.append(k)
                continue
            entry = Fields(item, f"{f.where} trials[{k}]")
            if entry.doc.get("number") != k or isinstance(entry.doc.get("number"), bool):
                raise entry.fail("number", f"is {str(entry.doc.get('number'))[:20]!r}, not {k}")
            if entry.doc.get("run_name") != run_name:
                raise CorruptRecord(
                    entry.where,
                    f"run_name is {str(entry.doc.get('run_name'))[:80]!r}, not "
                    f"{run_name!r} (a record copied from another sweep)",
                )
            try:
                out.append(TrialEntry.decode(entry, k, run_name))
            except CorruptRecord as err:
                out.append(
                    TrialEntry.broken(k, run_name, f"{err.where[len(entry.where) :].strip()} {err.problem}".strip())
                )
                broken.append(k)
        return tuple(out), tuple(broken)

    def within(self, bounds: SweepBounds) -> "SweepRecord":
        """The record with each trial outside ``bounds`` marked (``params_problem``, ``rung_problem``)."""
        return replace(
            self,
            trials=tuple(
                replace(t, params_problem=bounds.params_problem(t.params), rung_problem=bounds.rung_problem(t))
                if t.number not in self.broken
                else t
                for t in self.trials
            ),
        )

    def encode(self) -> dict[str, Any]:
        """The record as stored (without its signature: ``sweep.trust.sign`` adds it)."""
        out: dict[str, Any] = {
            "version": VERSION,
            "name": self.name,
            "space": dict(self.space),
            "fixed": list(self.fixed),
            "settings": dict(self.settings),
            "trials": [t.encode() for t in self.trials],
            "decisions": [d.encode() for d in self.decisions],
            "usage": {"slot_seconds": self.slot_seconds, "idle_seconds": self.idle_seconds},
            "space_since": self.space_since,
            "fence": self.fence,
            "driver": None if self.driver is None else self.driver.encode(),
        }
        if self.mlflow_run_id is not None:
            out["mlflow_run_id"] = self.mlflow_run_id
        return out

    def trial(self, number: int) -> TrialEntry:
        return self.trials[number]


_SETTING_NUMBERS = {
    "seed": (0, 2**32),
    "max_steps": (1, MAX_STEPS),
    "reduction_factor": (1, 1000),
    "n_trials": (0, MAX_TRIALS),
    "max_parallel": (1, MAX_TRIALS),
}


def _settings(f: Fields) -> dict[str, Any]:
    """The settings that shaped the decisions, kept as a table (the sweep's own config has the same keys); those
    a reader does arithmetic with are bounded: whole numbers, the first rung's fraction, the budget in dollars."""
    settings = f.mapping("settings")
    if "settings" not in f.doc:
        raise f.fail("settings", "is missing")
    s = Fields(settings, f"{f.where} settings")
    for key, (low, high) in _SETTING_NUMBERS.items():
        s.whole(key, low=low, high=high, default=None)
    s.number("min_fraction", high=1.0, default=None)
    s.number("budget_usd", high=MAX_USD, default=None)
    for key in ("metric", "direction", "sampler", "pruner"):
        s.text(key, None, limit=200)
    return dict(settings)


@dataclass(frozen=True)
class TrialLedger:
    """What a sweep reads of a trial's ledger: the ledger decoded (``LedgerRecord``), its evaluations per step
    (``quality.evals``: step -> metric -> value; a value that is no finite number, a diverged loss, is NaN here:
    no result at that rung) and the start-ups its attempts measured (none over ``MAX_START_UP_S``)."""

    record: LedgerRecord
    evals: Mapping[int, Mapping[str, float]]

    @classmethod
    def decode(cls, doc: Any, where: str) -> "TrialLedger":
        record = LedgerRecord.decode(doc, where)  # not an object, a bad attempt: CorruptRecord naming it
        quality = Fields(Fields(doc, where).mapping("quality"), f"{where} quality")
        evals = quality.mapping("evals")
        out: dict[int, dict[str, float]] = {}
        for step in evals:
            if not (isinstance(step, str) and step.isdigit() and int(step) <= MAX_STEPS):
                raise CorruptRecord(f"{where} quality.evals", f"{str(step)[:20]!r} is not a step")
            at = Fields(evals, f"{where} quality.evals").mapping(step)
            out[int(step)] = {
                str(k): float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
                for k, v in at.items()
            }
        for n, a in enumerate(record.attempts):
            claimed = _claimed_start_up(a.extra)
            if claimed is not None and claimed > MAX_START_UP_S:
                raise CorruptRecord(
                    f"{where} attempts[{n}]",
                    f"it says an attempt's start-up (extra.restart.total_s) took {claimed:g} s, more than a week",
                )
        return cls(record=record, evals=out)

    @property
    def status(self) -> str:
        return self.record.status

    def value(self, step: int, metric: str) -> Optional[float]:
        """The trial's ``metric`` at ``step`` (None when absent; NaN when it is no finite number)."""
        return self.evals.get(step, {}).get(metric)

    def evaluated_at(self, step: int) -> bool:
        return step in self.evals


def _claimed_start_up(extra: Mapping[str, Any]) -> Optional[float]:
    """An attempt's start-up as its ledger claims it (``extra.restart.total_s``, else the older
    ``extra.start_to_first_step_s``), where it is a finite number."""
    split = extra.get("restart")
    for value in ((split.get("total_s") if isinstance(split, Mapping) else None), extra.get("start_to_first_step_s")):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number):
            return number
    return None
