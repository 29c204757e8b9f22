"""The spend index (``<storage.uri>/_spend/index.json``) as its readers and writers see it: one decode into types.

The index is read from storage, so whatever it holds is untrusted: ``SpendIndexRecord.decode`` checks every
field (an amount that is not a finite number in [0, ``MAX_USD``]: a dollar figure above any budget is corrupt; a
month that is not ``YYYY-MM``; a time outside 1970-2100) and raises ``CorruptRecord`` naming the field's path
(``jobs.<run>.open.<fence>``) and the problem. ``encode`` gives back the stored shape, so a document written by
an older version reads the same and a decoded one writes the same::

    {"jobs": {run_name: {"experiment": str, "months": {"YYYY-MM": settled_usd},
                         "open": {"<fence>": {"month", "base", "spent", "through", "updated_at"}}}},
     "alerts": {"<scope>/<alert name>": unix_time}}

The records are frozen: a writer (``orchestrator.money.spend``, ``spend_holds``, ``spend_leases``) builds the next
index from the last with the ``with_*`` methods inside its conditional write and stores its ``encode()``. The
index is one document that every cap sums over, so one field that does not decode makes the whole index
unreadable (``money.spend.SpendIndexCorrupt``: a cap it cannot sum is a cap it could overspend); other jobs'
ledgers, read to settle their dead holds, are each their own record (``spend_leases``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

from orchestrator.records.fields import LATEST_TIME, MAX_USD, CorruptRecord, Fields

MONTH = re.compile(r"(19[7-9]\d|20\d\d)-(0[1-9]|1[0-2])")
_SHOWN = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shown(name: object) -> str:
    """A stored name as an error may print it: control characters as ``?``, at most 80 characters."""
    return _SHOWN.sub("?", str(name))[:80]


def _month(f: Fields, key: str) -> str:
    value = f.text(key, limit=32)
    if not MONTH.fullmatch(value):
        raise f.fail(key, f"is {value!r}, not a month (YYYY-MM)")
    return str(value)


def _amounts(f: Fields, key: str, where: str, *, high: float) -> dict[str, float]:
    """A JSON object of month (or name) -> a finite number in [0, high] (absent: empty); errors name ``where``."""
    doc = f.mapping(key)
    inner = Fields(doc, where)
    return {str(k): float(inner.number(k, high=high)) for k in doc}


@dataclass(frozen=True)
class SpendEntry:
    """One open reservation: an attempt's (keyed by its fence), a start-up hold's, an evaluation's.

    It charges ``max(spent, through) - base`` to ``month`` (``base``: what the attempt had spent when the entry
    opened; an attempt that runs into a new month closes its old entry into that month)."""

    month: str
    base: float
    spent: float
    through: float
    updated_at: float

    @classmethod
    def decode(cls, f: Fields) -> "SpendEntry":
        return cls(
            month=_month(f, "month"),
            base=f.number("base", high=MAX_USD),
            spent=f.number("spent", high=MAX_USD),
            through=f.number("through", high=MAX_USD),
            updated_at=f.number("updated_at", high=LATEST_TIME),
        )

    def encode(self) -> dict[str, Any]:
        return {
            "month": self.month,
            "base": self.base,
            "spent": self.spent,
            "through": self.through,
            "updated_at": self.updated_at,
        }

    def charge(self, held: bool = True) -> float:
        """What it charges its month: what it holds (its reservation, or its spend when that is more), else
        (``held=False``) only what it has spent as of its last write."""
        top = max(self.spent, self.through) if held else self.spent
        return max(0.0, top - self.base)


@dataclass(frozen=True)
class SpendJob:
    """One job's part of the index: its experiment, what it settled by month, its open reservations."""

    experiment: str
    months: Mapping[str, float]
    open: Mapping[str, SpendEntry]

    @classmethod
    def decode(cls, f: Fields) -> "SpendJob":
        months = _amounts(f, "months", f"{f.where}.months", high=MAX_USD)
        for month in months:
            if not MONTH.fullmatch(month):
                raise CorruptRecord(f"{f.where}.months", f"{shown(month)!r} is not a month (YYYY-MM)")
        entries = f.mapping("open")
        return cls(
            experiment=f.text("experiment"),
            months=months,
            open={str(k): SpendEntry.decode(Fields(v, f"{f.where}.open.{shown(k)}")) for k, v in entries.items()},
        )

    @classmethod
    def empty(cls, experiment: str) -> "SpendJob":
        return cls(experiment=experiment, months={}, open={})

    def encode(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "months": dict(self.months),
            "open": {k: e.encode() for k, e in self.open.items()},
        }

    def month_usd(self, month: str, *, held: bool = True) -> float:
        """What it has spent or holds reserved in ``month`` (``held=False``: spent only)."""
        return self.months.get(month, 0.0) + sum(e.charge(held) for e in self.open.values() if e.month == month)

    def total_usd(self, *, held: bool = True) -> float:
        """What it has spent or holds reserved, all months (``held=False``: spent only)."""
        return sum(self.months.values()) + sum(e.charge(held) for e in self.open.values())

    def settled(self, month: str, usd: float) -> "SpendJob":
        """``usd`` (at least 0) settled into ``month``."""
        return replace(self, months={**self.months, month: self.months.get(month, 0.0) + max(0.0, usd)})

    def with_entry(self, key: str, entry: Optional[SpendEntry]) -> "SpendJob":
        """Entry ``key`` set to ``entry`` (None: removed)."""
        entries = {k: e for k, e in self.open.items() if k != key}
        if entry is not None:
            entries[key] = entry
        return replace(self, open=entries)

    def close(self, key: str, charge: float) -> "SpendJob":
        """Entry ``key`` (which it holds) removed and ``charge`` settled into its month."""
        return self.with_entry(key, None).settled(self.open[key].month, charge)


@dataclass(frozen=True)
class SpendIndexRecord:
    """The spend index, decoded: every job's part and the caps' alert marks (alert scope/name -> when sent)."""

    jobs: Mapping[str, SpendJob]
    alerts: Mapping[str, float]

    @classmethod
    def decode(cls, doc: Any) -> "SpendIndexRecord":
        """``doc`` (the parsed index.json, or None when there is none yet) into types; raises CorruptRecord whose
        ``where`` is the field's path in the index."""
        if doc is None:
            return cls(jobs={}, alerts={})
        f = Fields(doc, "the index")
        jobs = f.mapping("jobs")
        return cls(
            jobs={str(k): SpendJob.decode(Fields(v, f"jobs.{shown(k)}")) for k, v in jobs.items()},
            alerts=_amounts(f, "alerts", "alerts", high=LATEST_TIME),
        )

    def encode(self) -> dict[str, Any]:
        return {"jobs": {k: j.encode() for k, j in self.jobs.items()}, "alerts": dict(self.alerts)}

    def with_job(self, name: str, job: SpendJob) -> "SpendIndexRecord":
        return replace(self, jobs={**self.jobs, name: job})

    def job(self, name: str, experiment: str) -> SpendJob:
        """Job ``name``'s part, charged to ``experiment`` (a new, empty one when it has none yet)."""
        found = self.jobs.get(name)
        return SpendJob.empty(experiment) if found is None else replace(found, experiment=experiment)

    def month_usd(self, month: str, *, held: bool = True) -> float:
        return sum(job.month_usd(month, held=held) for job in self.jobs.values())

    def experiment_usd(self, experiment: str, *, held: bool = True) -> float:
        return sum(job.total_usd(held=held) for job in self.jobs.values() if job.experiment == experiment)

    def by_job(self, *, month: Optional[str] = None, experiment: Optional[str] = None) -> str:
        """``a $1.2000, b $0.3000``: the jobs' shares of a month's or an experiment's spend."""
        parts = []
        for name, job in sorted(self.jobs.items()):
            if experiment is not None and job.experiment != experiment:
                continue
            usd = job.month_usd(month) if month is not None else job.total_usd()
            if usd > 0:
                parts.append(f"{name} ${usd:.4f}")
        return ", ".join(parts) or "no job"
