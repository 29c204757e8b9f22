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
Every read is checked (``parse_index``): the index decodes into ``orchestrator.records.spend_record``'s types
(every amount a finite number in [0, $1e7], every month ``YYYY-MM``), or it is SpendIndexCorrupt naming the object,
the field and the fix; the writers build the next index from the decoded one and store its ``encode()``.

Shape (``SpendIndexRecord``)::

    {"jobs": {run_name: {"experiment": str, "months": {"YYYY-MM": settled_usd},
                         "open": {"<fence>": {"month", "base", "spent", "through", "updated_at"}}}},
     "alerts": {"<scope>/<alert name>": unix_time}}

An open entry charges ``max(spent, through) - base`` to its month: ``base`` is the
attempt's spend when the entry opened (an attempt that runs into a new month moves
what it spent so far into the old month and opens a new entry).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional, Union

from orchestrator.core.errors import BudgetExhausted
from orchestrator.money.spend_leases import dead_holds, released
from orchestrator.records.fields import MAX_USD, CorruptRecord, Fields
from orchestrator.records.spend_record import SpendEntry, SpendIndexRecord, SpendJob
from orchestrator.storage.base import ObjectStore
from orchestrator.storage.transact import record_once, transact

log = logging.getLogger(__name__)

INDEX_KEY = "_spend/index.json"
# a cap counts as reached within this of it: grants fill a cap exactly, and sums of floats land a hair short
CAP_TOLERANCE_USD = 1e-9


class SpendIndexCorrupt(BudgetExhausted):
    """The spend index cannot be read (not JSON, wrong types, an amount not finite or negative).

    A job under a cap stops on it (exit 3: a cap it cannot check is a cap it could overspend); a job
    with no cap runs on and says so once (``orchestrator.attempt.money.SpendWatch``).
    """


def repair_hint(store_uri: str) -> str:
    return (
        f"rebuild it from the jobs' ledgers with `orchestrator storage repair-spend {store_uri}` "
        "(add --endpoint-url for S3-compatible stores)"
    )


def decode_index(raw: bytes, where: str, store_uri: str) -> SpendIndexRecord:
    """The index stored at ``where``, decoded: raises SpendIndexCorrupt naming the object, the field and the fix."""
    try:
        return SpendIndexRecord.decode(json.loads(raw))
    except CorruptRecord as err:
        problem = f"{err.where}: {err.problem}"
    except (ValueError, UnicodeDecodeError) as err:
        problem = f"it is not JSON ({str(err)[:120]})"
    raise SpendIndexCorrupt(
        f"the spend index {where} is unreadable: {problem}. Caps on it "
        f"(budget.monthly_max_usd, budget.experiment_max_usd) cannot be checked; "
        f"{repair_hint(store_uri)}"
    )


def parse_index(raw: bytes, where: str, store_uri: str) -> dict:
    """The index stored at ``where``, decoded (``decode_index``) and given back in its stored shape, for the readers
    that print or hand it on as JSON (``orchestrator status --spend``, ``orchestrator ls``, a sweep)."""
    return decode_index(raw, where, store_uri).encode()


def month_of(ts: float) -> str:
    """The calendar month (UTC) of a unix time: ``2026-12``."""
    return time.strftime("%Y-%m", time.gmtime(ts))


Index = Union[SpendIndexRecord, dict]


def _record(index: Index) -> SpendIndexRecord:
    """The readers below take the decoded index, or its stored shape (``parse_index``'s) from the modules that
    hold that; a dict is decoded (CorruptRecord if it is not a spend index)."""
    return index if isinstance(index, SpendIndexRecord) else SpendIndexRecord.decode(index)


def _job_record(job: Union[SpendJob, dict]) -> SpendJob:
    return job if isinstance(job, SpendJob) else SpendJob.decode(Fields(job, "a job of the spend index"))


def job_month_usd(job: Union[SpendJob, dict], month: str, *, held: bool = True) -> float:
    """What one job has spent or holds reserved in ``month`` (``held=False``: spent only)."""
    return _job_record(job).month_usd(month, held=held)


def job_total_usd(job: Union[SpendJob, dict], *, held: bool = True) -> float:
    """What one job has spent or holds reserved, all months (``held=False``: spent only)."""
    return _job_record(job).total_usd(held=held)


def month_total_usd(index: Index, month: str, *, held: bool = True) -> float:
    return _record(index).month_usd(month, held=held)


def experiment_total_usd(index: Index, experiment: str, *, held: bool = True) -> float:
    return _record(index).experiment_usd(experiment, held=held)


@dataclass(frozen=True)
class Caps:
    """The caps one job is under (None: no cap) and where it sits in the index."""

    run_name: str
    experiment: str
    monthly_max_usd: Optional[float] = None
    experiment_max_usd: Optional[float] = None

    def room_usd(self, index: SpendIndexRecord, month: str) -> Optional[float]:
        """What the caps still allow in ``month`` (None: no cap)."""
        rooms = []
        if self.monthly_max_usd is not None:
            rooms.append(float(self.monthly_max_usd) - index.month_usd(month))
        if self.experiment_max_usd is not None:
            rooms.append(float(self.experiment_max_usd) - index.experiment_usd(self.experiment))
        return min(rooms) if rooms else None

    def refusal(self, index: SpendIndexRecord, month: str, where: str) -> Optional[str]:
        """Why a job under these caps may spend nothing more, with the numbers; None while there is room."""
        if self.monthly_max_usd is not None:
            total = index.month_usd(month)
            if total >= self.monthly_max_usd - CAP_TOLERANCE_USD:
                return (
                    f"monthly spend cap reached: jobs under {where} have spent ${total:.4f} in {month} (UTC) of "
                    f"budget.monthly_max_usd=${self.monthly_max_usd:g} ({index.by_job(month=month)}). Raise "
                    "budget.monthly_max_usd, or relaunch next month; the job goes on from its last checkpoint"
                )
        if self.experiment_max_usd is not None:
            total = index.experiment_usd(self.experiment)
            if total >= self.experiment_max_usd - CAP_TOLERANCE_USD:
                return (
                    f"experiment spend cap reached: jobs of experiment {self.experiment!r} under {where} have spent "
                    f"${total:.4f} of budget.experiment_max_usd=${self.experiment_max_usd:g} "
                    f"({index.by_job(experiment=self.experiment)}). Raise budget.experiment_max_usd to go on "
                    "from the last checkpoint"
                )
        return None


def by_job(index: Index, *, month: Optional[str] = None, experiment: Optional[str] = None) -> str:
    """``a $1.2000, b $0.3000``: the jobs' shares of a month's or an experiment's spend."""
    return _record(index).by_job(month=month, experiment=experiment)


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
        """The index, decoded (SpendIndexCorrupt), in its stored shape; {} when no job has written one yet."""
        try:
            return self._decode(self.store.get_bytes(INDEX_KEY))
        except FileNotFoundError:
            return {}

    def record(self) -> SpendIndexRecord:
        """The index, decoded (SpendIndexCorrupt); empty when no job has written one yet."""
        try:
            return decode_index(self.store.get_bytes(INDEX_KEY), self.store.get_uri(INDEX_KEY), self.store.uri)
        except FileNotFoundError:
            return SpendIndexRecord.decode(None)

    def _decode(self, raw: bytes) -> dict:
        return parse_index(raw, self.store.get_uri(INDEX_KEY), self.store.uri)

    def _transact(self, mutate) -> dict:
        return transact(self.store, INDEX_KEY, mutate, decode=self._decode)

    def write(self, change: Callable[[SpendIndexRecord], Optional[SpendIndexRecord]]) -> None:
        """One conditional write: ``change`` gets the index as it is now (decoded; again on each retry) and gives
        the index to store, or None to store nothing."""

        def mutate(doc: Optional[dict]) -> Optional[dict]:
            after = change(SpendIndexRecord.decode(doc))  # ``doc``: parse_index's, decoded once already
            return None if after is None else after.encode()

        self._transact(mutate)

    def refusal(self, vanished_usd: Optional[dict] = None, hold: Optional[str] = None) -> Optional[str]:
        """Read only: why this job may not start (a cap already spent), with the numbers; None when it may.

        This job's own open entries belong to attempts that ended without settling (the new attempt fences
        them): they count as the first reservation will settle them (``vanished_usd``: fence -> the ledger's
        cost at each one's last heartbeat), not at their whole reservation, which would let a SIGKILLed
        attempt's unspent hold stop its own job's restart at the cap. ``hold``: this attempt's start-up hold
        (``spend_holds``), which its first reservation takes over: not counted here, or a hold that took the last
        room would refuse the very attempt it was taken for."""
        index = self.record()
        job = index.jobs.get(self.caps.run_name)
        if job is not None:
            job = job.with_entry(hold, None) if hold else job
            index = index.with_job(self.caps.run_name, _settle_vanished(job, keep="", known=vanished_usd or {}))
        index, _ = released(index, self.dead_holds(index))
        return self.caps.refusal(index, month_of(self.clock()), self.where)

    def dead_holds(self, index: Optional[SpendIndexRecord] = None) -> dict:
        """Other jobs' reservations whose attempt is gone (``spend_leases``), when a cap makes them matter."""
        if self.caps.monthly_max_usd is None and self.caps.experiment_max_usd is None:
            return {}
        return dead_holds(
            self.store, self.record() if index is None else index, own_run=self.caps.run_name, now=self.clock()
        )

    def reserve(
        self,
        fence: int,
        spent: float,
        want_through: float,
        *,
        vanished_usd: Optional[dict] = None,
        hold: Optional[str] = None,
    ) -> Grant:
        """Record that attempt ``fence`` has spent ``spent`` and ask to spend up to ``want_through``.

        One conditional write. Grants what the caps leave room for, never more (at least ``spent``:
        what is spent is charged whatever the caps say; never past ``MAX_USD``, the most a stored amount may
        be). Settles this job's older open entries (attempts that vanished) at their cost in ``vanished_usd``
        (fence -> the ledger's cost at the attempt's last heartbeat), or at their reservation when the ledger
        has none. ``hold``: the start-up hold its supervisor took (``spend_holds``), taken over in this write:
        it becomes this attempt's entry.
        """
        now = self.clock()
        month = month_of(now)
        out: list[Grant] = []
        dead = self.dead_holds()
        freed: list[str] = []
        key, caps = str(fence), self.caps

        def change(index: SpendIndexRecord) -> SpendIndexRecord:
            index, freed[:] = released(index, dead)
            job = take_over(index.job(caps.run_name, caps.experiment), hold, key)
            job, entry = _entry(_settle_vanished(job, keep=key, known=vanished_usd or {}), key, month, spent, now)
            entry = replace(entry, spent=min(MAX_USD, max(entry.spent, float(spent))))
            # room counts this entry's own charge; what it may add is the room left beyond that
            room = caps.room_usd(index.with_job(caps.run_name, job.with_entry(key, entry)), month)
            limit = (
                float(want_through)
                if room is None
                else min(float(want_through), max(entry.through, entry.spent) + room)
            )
            entry = replace(entry, through=min(MAX_USD, max(entry.spent, entry.through, limit)), updated_at=now)
            index = index.with_job(caps.run_name, job.with_entry(key, entry))
            out[:] = [
                Grant(
                    entry.through,
                    month,
                    index.month_usd(month),
                    index.experiment_usd(caps.experiment),
                    caps.refusal(index, month, self.where),
                    index.month_usd(month, held=False),
                    index.experiment_usd(caps.experiment, held=False),
                )
            ]
            return index

        self.write(change)
        if freed:
            log.info("spend index %s: released the holds of attempts that are gone: %s", self.where, "; ".join(freed))
        return out[0]

    def settle(self, fence: int, spent: float) -> None:
        """Attempt ``fence`` ended having spent ``spent``: its reservation becomes what it spent."""

        def change(index: SpendIndexRecord) -> Optional[SpendIndexRecord]:
            job = index.job(self.caps.run_name, self.caps.experiment)
            entry = job.open.get(str(fence))
            if entry is None:
                return None
            return index.with_job(self.caps.run_name, job.close(str(fence), min(MAX_USD, float(spent)) - entry.base))

        self.write(change)

    def record_alert(self, scope: str, name: str) -> bool:
        """Mark alert ``name`` of ``scope`` (a month, an experiment) sent; True only the first time, for every job."""
        return record_once(self._transact, _fresh, f"{scope}/{name}", self.clock)


def _fresh(index: Optional[dict]) -> dict:
    """The stored shape of the index (``parse_index``'s), or of an empty one when there is none yet."""
    return SpendIndexRecord.decode(index).encode()


def _settle_vanished(job: SpendJob, *, keep: str, known: dict) -> SpendJob:
    """Open entries of other attempts of this job are attempts that ended without settling: charge what the
    ledger says each spent by its last heartbeat (``known``, by fence), else its whole reservation."""
    for fence in [e for e in job.open if e != keep]:
        entry, cost = job.open[fence], known.get(fence)
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost) and cost >= 0:
            charge = max(0.0, max(min(MAX_USD, float(cost)), entry.spent) - entry.base)
        else:
            charge = entry.charge()
        job = job.close(fence, charge)
    return job


def take_over(job: SpendJob, hold: Optional[str], fence: str) -> SpendJob:
    """Attempt ``fence``'s first write: its supervisor's start-up hold (``spend_holds``), if still open, becomes its
    entry (the hold's charge moves over, counted once)."""
    if not hold or hold not in job.open or fence in job.open:
        return job
    return job.with_entry(hold, None).with_entry(fence, replace(job.open[hold], base=0.0))


def _entry(job: SpendJob, fence: str, month: str, spent: float, now: float) -> tuple[SpendJob, SpendEntry]:
    """This attempt's open entry for ``month`` (and the job holding it); an entry of an earlier month is closed into
    that month first."""
    entry = job.open.get(fence)
    base = 0.0  # an attempt's first entry: all it spent is charged
    if entry is not None and entry.month != month:
        base = min(MAX_USD, max(entry.spent, float(spent)))
        job, entry = job.close(fence, base - entry.base), None
    if entry is None:
        entry = SpendEntry(month=month, base=base, spent=min(MAX_USD, float(spent)), through=base, updated_at=now)
        job = job.with_entry(fence, entry)
    return job, entry
