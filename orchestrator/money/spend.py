"""The spend index: what every job under one ``storage.uri`` spends, by calendar month (UTC) and by experiment.

It backs ``budget.monthly_max_usd`` (all jobs under the store, one UTC month) and
``budget.experiment_max_usd`` (all jobs of one ``tracking.experiment`` under the
store, all time). It lives at ``_spend/index.json`` beside the jobs' folders (a run
name starts with a letter or digit, so no job is called ``_spend``) and moves only
by the ledger's conditional write (``orchestrator.storage.transact``).

Money is charged to the index *before* it is spent: an attempt holds a
reservation, the spend it may reach (``through``), and extends it
(``budget.reserve_ahead`` of its price at a time) only while the caps leave room. Its first reservation takes
over the start-up hold its supervisor took before the worker's process started (``spend_holds``).
A grant never takes a cap's total past the cap, and every grant is one conditional
write against the whole index, so two jobs racing for the last dollars cannot both
get them: the index's charged total never exceeds a cap. An attempt stops (final
checkpoint, exit 3) once its spend reaches its reservation and no more is granted.
At its end it settles its reservation to what it spent; an attempt that vanished
(SIGKILL, a lost machine) is settled by the job's next attempt at the cost its
ledger entry had at its last heartbeat (as the ledger itself counts it: known to
within one heartbeat), or at its full reservation when the ledger has no cost for it.
Another job's attempt that is gone and never comes back is settled the same way by
the next capped job to read the index (``spend_leases``).
Every read is checked (``parse_index``): an index that is not this shape, or holds an
amount that is not a finite non-negative number, is SpendIndexCorrupt.

Shape::

    {"jobs": {run_name: {"experiment": str, "months": {"YYYY-MM": settled_usd},
                         "open": {"<fence>": {"month", "base", "spent", "through", "updated_at"}}}},
     "alerts": {"<scope>/<alert name>": unix_time}}

An open entry charges ``max(spent, through) - base`` to its month: ``base`` is the
attempt's spend when the entry opened (an attempt that runs into a new month moves
what it spent so far into the old month and opens a new entry).
"""
from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, cast

from orchestrator.core.errors import BudgetExhausted
from orchestrator.money.spend_leases import dead_holds, release
from orchestrator.storage.base import ObjectStore, checked_json
from orchestrator.storage.transact import record_once, transact

log = logging.getLogger(__name__)

INDEX_KEY = "_spend/index.json"
_ENTRY_AMOUNTS = ("base", "spent", "through", "updated_at")
# a cap counts as reached within this of it: grants fill a cap exactly, and sums of floats land a hair short
CAP_TOLERANCE_USD = 1e-9


class SpendIndexCorrupt(BudgetExhausted):
    """The spend index cannot be read (not JSON, wrong types, an amount not finite or negative).

    A job under a cap stops on it (exit 3: a cap it cannot check is a cap it could overspend); a job
    with no cap runs on and says so once (``orchestrator.attempt.money.SpendWatch``).
    """


def repair_hint(store_uri: str) -> str:
    return (f"rebuild it from the jobs' ledgers with `orchestrator storage repair-spend {store_uri}` "
            "(add --endpoint-url for S3-compatible stores)")


def parse_index(raw: bytes, where: str, store_uri: str) -> dict:
    """The index stored at ``where``, checked: raises SpendIndexCorrupt naming the object, the problem and the fix."""
    index, problem = checked_json(raw, index_problem)
    if problem:
        raise SpendIndexCorrupt(f"the spend index {where} is unreadable: {problem}. Caps on it "
                                f"(budget.monthly_max_usd, budget.experiment_max_usd) cannot be checked; "
                                f"{repair_hint(store_uri)}")
    return cast("dict[str, Any]", index)


def _amount_problem(value, where: str) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{where} is {value!r}, not a number"
    if not math.isfinite(value) or value < 0:
        return f"{where} is {value!r}, not a finite non-negative amount"
    return None


def _dict_problem(value, where: str) -> Optional[str]:
    return None if isinstance(value, dict) else f"{where} is {type(value).__name__}, not an object"


def _first(problems: Iterator[Optional[str]]) -> Optional[str]:
    """The first problem a lazy run of checks finds: a later check runs only once the earlier ones passed (it
    may rely on the shape they checked)."""
    return next((problem for problem in problems if problem), None)


def _job_problems(name: str, job) -> Iterator[Optional[str]]:
    where = f"jobs.{name}"
    yield _dict_problem(job, where)
    if not isinstance(job.get("experiment"), str):
        yield f"{where}.experiment is {job.get('experiment')!r}, not a name"
    for key in ("months", "open"):
        yield _dict_problem(job.get(key, {}), f"{where}.{key}")
    for month, usd in job.get("months", {}).items():
        yield _amount_problem(usd, f"{where}.months.{month}")
    for fence, entry in job.get("open", {}).items():
        yield _dict_problem(entry, f"{where}.open.{fence}")
        if not isinstance(entry.get("month"), str):
            yield f"{where}.open.{fence}.month is {entry.get('month')!r}, not a month"
        for key in _ENTRY_AMOUNTS:
            yield _amount_problem(entry.get(key), f"{where}.open.{fence}.{key}")


def _index_problems(index) -> Iterator[Optional[str]]:
    yield _dict_problem(index, "the index")
    for key in ("jobs", "alerts"):
        yield _dict_problem(index.get(key, {}), key)
    for name, job in index.get("jobs", {}).items():
        yield _first(_job_problems(name, job))
    for name, when in index.get("alerts", {}).items():
        yield _amount_problem(when, f"alerts.{name}")


def index_problem(index) -> Optional[str]:
    """What makes ``index`` (parsed JSON) not a spend index, or None: the shapes above, every amount finite, >= 0."""
    return _first(_index_problems(index))


def month_of(ts: float) -> str:
    """The calendar month (UTC) of a unix time: ``2026-12``."""
    return time.strftime("%Y-%m", time.gmtime(ts))


def _open_charge(entry: dict, held: bool = True) -> float:
    """An open entry's charge: what it holds (``held``: its reservation, or its spend when that is more),
    else only what it has spent (as of its last write)."""
    top = max(float(entry["spent"]), float(entry["through"])) if held else float(entry["spent"])
    return max(0.0, top - float(entry["base"]))


def job_month_usd(job: dict, month: str, *, held: bool = True) -> float:
    """What one job has spent or holds reserved in ``month`` (``held=False``: spent only)."""
    settled = float((job.get("months") or {}).get(month, 0.0))
    return settled + sum(_open_charge(e, held) for e in (job.get("open") or {}).values() if e["month"] == month)


def job_total_usd(job: dict, *, held: bool = True) -> float:
    """What one job has spent or holds reserved, all months (``held=False``: spent only)."""
    return sum(float(v) for v in (job.get("months") or {}).values()) + sum(
        _open_charge(e, held) for e in (job.get("open") or {}).values())


def month_total_usd(index: dict, month: str, *, held: bool = True) -> float:
    return sum(job_month_usd(job, month, held=held) for job in (index.get("jobs") or {}).values())


def experiment_total_usd(index: dict, experiment: str, *, held: bool = True) -> float:
    return sum(job_total_usd(job, held=held) for job in (index.get("jobs") or {}).values()
               if job.get("experiment") == experiment)


@dataclass(frozen=True)
class Caps:
    """The caps one job is under (None: no cap) and where it sits in the index."""

    run_name: str
    experiment: str
    monthly_max_usd: Optional[float] = None
    experiment_max_usd: Optional[float] = None

    def room_usd(self, index: dict, month: str) -> Optional[float]:
        """What the caps still allow in ``month`` (None: no cap)."""
        rooms = []
        if self.monthly_max_usd is not None:
            rooms.append(float(self.monthly_max_usd) - month_total_usd(index, month))
        if self.experiment_max_usd is not None:
            rooms.append(float(self.experiment_max_usd) - experiment_total_usd(index, self.experiment))
        return min(rooms) if rooms else None

    def refusal(self, index: dict, month: str, where: str) -> Optional[str]:
        """Why a job under these caps may spend nothing more, with the numbers; None while there is room."""
        if self.monthly_max_usd is not None:
            total = month_total_usd(index, month)
            if total >= self.monthly_max_usd - CAP_TOLERANCE_USD:
                return (f"monthly spend cap reached: jobs under {where} have spent ${total:.4f} in {month} (UTC) of "
                        f"budget.monthly_max_usd=${self.monthly_max_usd:g} ({by_job(index, month=month)}). Raise "
                        "budget.monthly_max_usd, or relaunch next month; the job goes on from its last checkpoint")
        if self.experiment_max_usd is not None:
            total = experiment_total_usd(index, self.experiment)
            if total >= self.experiment_max_usd - CAP_TOLERANCE_USD:
                return (f"experiment spend cap reached: jobs of experiment {self.experiment!r} under {where} have spent "
                        f"${total:.4f} of budget.experiment_max_usd=${self.experiment_max_usd:g} "
                        f"({by_job(index, experiment=self.experiment)}). Raise budget.experiment_max_usd to go on "
                        "from the last checkpoint")
        return None


def by_job(index: dict, *, month: Optional[str] = None, experiment: Optional[str] = None) -> str:
    """``a $1.2000, b $0.3000``: the jobs' shares of a month's or an experiment's spend."""
    parts = []
    for name, job in sorted((index.get("jobs") or {}).items()):
        if experiment is not None and job.get("experiment") != experiment:
            continue
        usd = job_month_usd(job, month) if month is not None else job_total_usd(job)
        if usd > 0:
            parts.append(f"{name} ${usd:.4f}")
    return ", ".join(parts) or "no job"


@dataclass(frozen=True)
class Grant:
    """A reservation's outcome: the attempt may spend up to ``through``; the index's totals after the write
    (charged: reservations included, what the caps count; spent: money spent, what the alerts count)."""

    through: float
    month: str
    month_usd: float
    experiment_usd: float
    refusal: Optional[str] = None
    month_spent_usd: float = 0.0
    experiment_spent_usd: float = 0.0


class SpendIndex:
    """The spend index of one store, for one job.

    Args:
        store: the jobs' store (``storage.uri``), where ``_spend/index.json`` lives.
        caps: the job's caps and names.
        clock: unix time (tests move it across a month).
    """

    def __init__(self, store: ObjectStore, caps: Caps, *, clock: Callable[[], float] = time.time):
        self.store = store
        self.caps = caps
        self.clock = clock

    @property
    def where(self) -> str:
        return self.store.uri

    def load(self) -> dict:
        """The index, validated (SpendIndexCorrupt); {} when no job has written one yet."""
        try:
            return self._decode(self.store.get_bytes(INDEX_KEY))
        except FileNotFoundError:
            return {}

    def _decode(self, raw: bytes) -> dict:
        return parse_index(raw, self.store.get_uri(INDEX_KEY), self.store.uri)

    def _transact(self, mutate) -> dict:
        return transact(self.store, INDEX_KEY, mutate, decode=self._decode)

    def refusal(self, vanished_usd: Optional[dict] = None, hold: Optional[str] = None) -> Optional[str]:
        """Read only: why this job may not start (a cap already spent), with the numbers; None when it may.

        This job's own open entries belong to attempts that ended without settling (the new attempt fences
        them): they count as the first reservation will settle them (``vanished_usd``: fence -> the ledger's
        cost at each one's last heartbeat), not at their whole reservation, which would let a SIGKILLed
        attempt's unspent hold stop its own job's restart at the cap. ``hold``: this attempt's start-up hold
        (``spend_holds``), which its first reservation takes over: not counted here, or a hold that took the last
        room would refuse the very attempt it was taken for."""
        index = copy.deepcopy(_fresh(self.load()))
        job = index["jobs"].get(self.caps.run_name)
        if job and hold:
            job.get("open", {}).pop(hold, None)
        if job and job.get("open"):
            _settle_vanished(index["jobs"][self.caps.run_name], keep="", known=vanished_usd or {})
        release(index, self.dead_holds(index))
        return self.caps.refusal(index, month_of(self.clock()), self.where)

    def dead_holds(self, index: Optional[dict] = None) -> dict:
        """Other jobs' reservations whose attempt is gone (``spend_leases``), when a cap makes them matter."""
        if self.caps.monthly_max_usd is None and self.caps.experiment_max_usd is None:
            return {}
        return dead_holds(self.store, self.load() if index is None else index, own_run=self.caps.run_name,
                          now=self.clock())

    def reserve(self, fence: int, spent: float, want_through: float, *,
                vanished_usd: Optional[dict] = None, hold: Optional[str] = None) -> Grant:
        """Record that attempt ``fence`` has spent ``spent`` and ask to spend up to ``want_through``.

        One conditional write. Grants what the caps leave room for, never more (at least ``spent``:
        what is spent is charged whatever the caps say). Settles this job's older open entries
        (attempts that vanished) at their cost in ``vanished_usd`` (fence -> the ledger's cost at the
        attempt's last heartbeat), or at their reservation when the ledger has none. ``hold``: the start-up hold
        its supervisor took (``spend_holds``), taken over in this write: it becomes this attempt's entry.
        """
        now = self.clock()
        month = month_of(now)
        out: list[Grant] = []
        dead = self.dead_holds()
        released: list[str] = []

        def mutate(index: Optional[dict]) -> dict:
            index = _fresh(index)
            released[:] = release(index, dead)
            job = self._job(index)
            take_over(job, hold, str(fence))
            _settle_vanished(job, keep=str(fence), known=vanished_usd or {})
            entry = _entry(job, str(fence), month, spent, now)
            entry["spent"] = max(float(entry["spent"]), float(spent))
            room = self.caps.room_usd(index, month)
            # room counts this entry's own charge; what it may add is the room left beyond that
            limit = float(want_through) if room is None else min(
                float(want_through), max(float(entry["through"]), float(entry["spent"])) + room)
            entry["through"] = max(float(entry["spent"]), float(entry["through"]), limit)
            entry["updated_at"] = now
            experiment = self.caps.experiment
            out[:] = [Grant(entry["through"], month, month_total_usd(index, month),
                            experiment_total_usd(index, experiment), self.caps.refusal(index, month, self.where),
                            month_total_usd(index, month, held=False),
                            experiment_total_usd(index, experiment, held=False))]
            return index

        self._transact(mutate)
        if released:
            log.info("spend index %s: released the holds of attempts that are gone: %s", self.where,
                     "; ".join(released))
        return out[0]

    def settle(self, fence: int, spent: float) -> None:
        """Attempt ``fence`` ended having spent ``spent``: its reservation becomes what it spent."""

        def mutate(index: Optional[dict]) -> Optional[dict]:
            index = _fresh(index)
            job = self._job(index)
            entry = (job.get("open") or {}).pop(str(fence), None)
            if entry is None:
                return None
            months = job.setdefault("months", {})
            months[entry["month"]] = float(months.get(entry["month"], 0.0)) + max(0.0, float(spent) - float(entry["base"]))
            return index

        self._transact(mutate)

    def record_alert(self, scope: str, name: str) -> bool:
        """Mark alert ``name`` of ``scope`` (a month, an experiment) sent; True only the first time, for every job."""
        return record_once(self._transact, _fresh, f"{scope}/{name}", self.clock)

    def _job(self, index: dict) -> dict:
        job = index["jobs"].setdefault(self.caps.run_name, {"experiment": self.caps.experiment, "months": {}, "open": {}})
        job["experiment"] = self.caps.experiment
        job.setdefault("months", {})
        job.setdefault("open", {})
        return job


def _fresh(index: Optional[dict]) -> dict:
    index = dict(index or {})
    index.setdefault("jobs", {})
    index.setdefault("alerts", {})
    return index


def _settle_vanished(job: dict, *, keep: str, known: dict) -> None:
    """Open entries of other attempts of this job are attempts that ended without settling: charge what the
    ledger says each spent by its last heartbeat (``known``, by fence), else its whole reservation."""
    months = job["months"]
    for fence in [e for e in job["open"] if e != keep]:
        entry = job["open"].pop(fence)
        cost = known.get(fence)
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost) and cost >= 0:
            charge = max(0.0, max(float(cost), float(entry["spent"])) - float(entry["base"]))
        else:
            charge = _open_charge(entry)
        months[entry["month"]] = float(months.get(entry["month"], 0.0)) + charge


def take_over(job: dict, hold: Optional[str], fence: str) -> None:
    """Attempt ``fence``'s first write: its supervisor's start-up hold (``spend_holds``), if still open, becomes its
    entry, in place (the hold's charge moves over, counted once)."""
    if not hold or hold not in job["open"] or fence in job["open"]:
        return
    entry = job["open"].pop(hold)
    job["open"][fence] = {"month": entry["month"], "base": 0.0, "spent": float(entry["spent"]),
                          "through": float(entry["through"]), "updated_at": float(entry["updated_at"])}


def _entry(job: dict, fence: str, month: str, spent: float, now: float) -> dict:
    """This attempt's open entry for ``month``; an entry of an earlier month is closed into that month first."""
    entry = job["open"].get(fence)
    base = 0.0  # an attempt's first entry: all it spent is charged
    if entry is not None and entry["month"] != month:
        months = job["months"]
        base = max(float(entry["spent"]), float(spent))
        months[entry["month"]] = float(months.get(entry["month"], 0.0)) + base - float(entry["base"])
        entry = None
    if entry is None:
        entry = {"month": month, "base": base, "spent": float(spent), "through": base, "updated_at": now}
        job["open"][fence] = entry
    return entry
