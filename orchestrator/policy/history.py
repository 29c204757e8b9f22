"""What the policies learn from a job's ledger: its spot lifetimes, its measured restarts, its steady pace.

One reading for every caller (the checkpoint schedule, the deadline's capacity
watch, the planner, the spend reservation): ``read_attempts`` turns the ledger's
attempt entries into ``AttemptHistory`` values, checked (the ledger is read from
storage: a number that is not finite counts as not recorded), and every figure
below is computed from those. The simulator's conventions hold: a lifetime is
training time, from the end of the first step to the attempt's end; an attempt
that lost its machine before its first step could lose no work whatever the
interval, so it counts as no lifetime at all.

An attempt's start to the end of its first step is its restart split's total
(``extra.restart.total_s``); ledgers written before the split was the one record
have it as ``extra.start_to_first_step_s``, read when the split is absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, cast

from orchestrator.core.exitcodes import INTERRUPTED_CLASSES, RUNNING, ExitClass
from orchestrator.policy.interval import Lifetime
from orchestrator.records.ledger_record import AttemptEntry

# Physical bounds of what an attempt can have measured: a figure past them is corrupt (storage is not trusted),
# read as not recorded. A restart (process start to the end of the first step) longer than a week, a checkpoint
# stall longer than a day did not happen; each would reach a timeout, an interval or a
# reservation (2 x a restart of 1e300 s is a collective timeout no ``timedelta`` holds: every rank crashed). An
# attempt held longer than a year is read as not ended.
MAX_RESTART_SECONDS = 7 * 86400.0
MAX_CHECKPOINT_COST_SECONDS = 86400.0
MAX_HELD_SECONDS = 366 * 86400.0


def _within(value: Optional[float], low: float, high: float) -> Optional[float]:
    return value if value is not None and low <= value <= high else None


def _number(value: Any) -> Optional[float]:
    """A finite float, or None (absent, not a number, NaN or infinite: storage is not trusted)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        out = float(value)
    except ValueError:
        return None
    return out if math.isfinite(out) else None


def _count(value: Any) -> int:
    out = _number(value)
    return int(out) if out is not None and out >= 0 else 0


@dataclass(frozen=True)
class AttemptHistory:
    """One attempt of the job as the policies read it from the ledger."""

    fence: int
    exit_class: str  # ``RUNNING`` while it lives
    spot: bool
    started_at: Optional[float]  # unix time
    ended_at: Optional[float]  # its end, else the last heartbeat
    step_start: int
    step_end: int
    checkpoint_step_end: int  # the newest step it committed
    restart_seconds: Optional[float]  # its start to the end of its first step (None: it never got that far)
    checkpoint_cost_seconds: Optional[float]  # the C it measured (None: it measured none)
    capacity_switch: bool  # it stopped to move to other capacity (it lost no machine)

    @classmethod
    def from_ledger(cls, entry: Mapping[str, Any]) -> "AttemptHistory":
        """A raw ledger entry (a JSON object), each field checked here (a reader that has not decoded the ledger)."""
        restart, cost, switch = _measured(entry.get("extra"))
        return cls(
            fence=_count(entry.get("fence")),
            exit_class=str(entry.get("exit_class") or ""),
            spot=bool(entry.get("spot")),
            started_at=_number(entry.get("started_at")),
            ended_at=_number(entry.get("ended_at")) or _number(entry.get("last_seen")),
            step_start=_count(entry.get("step_start")),
            step_end=_count(entry.get("step_end")),
            checkpoint_step_end=_count(entry.get("checkpoint_step_end")),
            restart_seconds=restart,
            checkpoint_cost_seconds=cost,
            capacity_switch=switch,
        )

    @classmethod
    def from_entry(cls, entry: AttemptEntry) -> "AttemptHistory":
        """A decoded ledger entry (``LedgerRecord.decode``); its ``extra`` is still checked field by field here."""
        restart, cost, switch = _measured(entry.extra)
        return cls(
            fence=entry.fence,
            exit_class=entry.exit_class,
            spot=entry.spot,
            started_at=entry.started_at,
            ended_at=entry.end,
            step_start=entry.step_start,
            step_end=entry.step_end,
            checkpoint_step_end=entry.checkpoint_step_end or 0,
            restart_seconds=restart,
            checkpoint_cost_seconds=cost,
            capacity_switch=switch,
        )

    @property
    def ended(self) -> bool:
        """It ended, at a time it held (an attempt held longer than ``MAX_HELD_SECONDS`` is read as not ended)."""
        return self.exit_class != RUNNING and self.held_seconds is not None

    @property
    def held_seconds(self) -> Optional[float]:
        """Wall seconds from its start to its end (or last heartbeat)."""
        if self.started_at is None or self.ended_at is None or self.ended_at - self.started_at > MAX_HELD_SECONDS:
            return None
        return max(0.0, self.ended_at - self.started_at)

    @property
    def lifetime(self) -> Optional[Lifetime]:
        """Its spot lifetime as the rate estimate sees it (None: not an ended spot attempt).

        Noticed: ended ``preempted`` (the worker exits so only after committing its emergency checkpoint) with
        nothing past that checkpoint; ``vanished`` is a hard kill. A move to other capacity lost no machine."""
        if not (self.spot and self.ended):
            return None
        if not self.restart_seconds:
            return Lifetime(0.0, preempted=False)
        preempted = self.exit_class in INTERRUPTED_CLASSES and not self.capacity_switch
        noticed = self.exit_class == ExitClass.PREEMPTED.value and self.checkpoint_step_end >= self.step_end
        return Lifetime(
            seconds=max(0.0, cast(float, self.held_seconds) - self.restart_seconds),
            preempted=preempted,
            noticed=preempted and noticed,
        )


def _measured(extra: Any) -> tuple[Optional[float], Optional[float], bool]:
    """(restart seconds, measured checkpoint cost C, a capacity switch) from an attempt's ``extra``, each checked
    (it stays a JSON object after the ledger's decode: a figure that is not finite or past its bound is not recorded)."""
    extra = extra if isinstance(extra, Mapping) else {}
    split = extra.get("restart") if isinstance(extra.get("restart"), Mapping) else {}
    restart = _number(split.get("total_s"))
    if restart is None:  # ledgers written before the restart split was the one record
        restart = _number(extra.get("start_to_first_step_s"))
    chosen = extra.get("checkpoint_interval") if isinstance(extra.get("checkpoint_interval"), Mapping) else {}
    cost = _number(chosen.get("checkpoint_cost_s")) if chosen.get("cost_source") == "measured" else None
    return (
        _within(restart, 0.0, MAX_RESTART_SECONDS),
        _within(cost, 0.0, MAX_CHECKPOINT_COST_SECONDS),
        bool(extra.get("capacity_switch")),
    )


def read_attempts(attempts: Iterable[Any]) -> list[AttemptHistory]:
    """The ledger's attempt entries, typed: decoded ones (``AttemptEntry``) or raw JSON objects (entries that are
    neither are left out)."""
    out = []
    for a in attempts:
        if isinstance(a, AttemptHistory):
            out.append(a)
        elif isinstance(a, AttemptEntry):
            out.append(AttemptHistory.from_entry(a))
        elif isinstance(a, Mapping):
            out.append(AttemptHistory.from_ledger(a))
    return out


def claimed_restart_seconds(attempts: Iterable[Any]) -> list[float]:
    """Each attempt's restart figure as its ledger claims it (finite numbers only), before the physical bound that
    ``restart_seconds_measured`` applies: what a reader that refuses a corrupt ledger outright (a sweep's trial)
    checks against ``MAX_RESTART_SECONDS``."""
    claimed = []
    for entry in attempts:
        extra: Any = (
            entry.get("extra") if isinstance(entry, Mapping) and isinstance(entry.get("extra"), Mapping) else {}
        )
        split: Any = extra.get("restart") if isinstance(extra.get("restart"), Mapping) else {}
        value = _number(split.get("total_s"))
        if value is None:
            value = _number(extra.get("start_to_first_step_s"))
        if value is not None:
            claimed.append(value)
    return claimed


def restart_seconds_measured(attempts: Iterable[Any]) -> list[float]:
    """Each attempt's start to the end of its first step, where it got that far."""
    return [a.restart_seconds for a in read_attempts(attempts) if a.restart_seconds]


def last_restart_seconds(attempts: Iterable[Any]) -> float:
    """The newest measured start to first step, 0 when none was measured."""
    measured = restart_seconds_measured(attempts)
    return measured[-1] if measured else 0.0


def measured_cost_seconds(attempts: Iterable[Any]) -> Optional[float]:
    """The checkpoint cost C the newest earlier attempt measured (None: none measured one)."""
    costs = [a.checkpoint_cost_seconds for a in read_attempts(attempts) if a.checkpoint_cost_seconds is not None]
    return costs[-1] if costs else None


def spot_lifetimes(attempts: Iterable[Any]) -> Iterator[Lifetime]:
    """The job's ended spot attempts as the rate estimate sees them (``AttemptHistory.lifetime``); on-demand
    attempts say nothing of spot's rate."""
    for a in read_attempts(attempts):
        if a.lifetime is not None:
            yield a.lifetime


def steady_seconds_per_step(attempts: Iterable[Any]) -> Optional[float]:
    """Seconds per optimizer step over the earlier attempts, start-up excluded (None: nothing to go on)."""
    seconds = steps = 0.0
    for a in read_attempts(attempts):
        done = a.step_end - a.step_start
        if a.held_seconds is not None and done > 1 and a.restart_seconds is not None:
            seconds += max(0.0, a.held_seconds - a.restart_seconds)
            steps += done - 1
    return seconds / steps if steps else None


def first_start(attempts: Sequence[Any]) -> Optional[float]:
    """When the job's first attempt started (unix time; None: no attempt says)."""
    starts = [a.started_at for a in read_attempts(attempts) if a.started_at is not None]
    return min(starts) if starts else None


@dataclass(frozen=True)
class ZoneHistory:
    """The job's own experience of one zone on spot (``policy.placement.Zone``'s history fields)."""

    held_hours: float = 0.0
    preemptions: int = 0
    since_preempted_seconds: Optional[float] = None  # since its newest preemption there ended (None: never)


def zone_history(attempts: Iterable[AttemptEntry], now: float) -> dict[str, ZoneHistory]:
    """Per zone the ledger's attempts name (``AttemptEntry.zone``): the spot hours the job held there, its
    preemptions there (an interrupted spot attempt that did not stop to move capacity) and the seconds since the
    newest one. Attempts with no zone, and on-demand ones, say nothing of a zone's spot."""
    held: dict[str, float] = {}
    lost: dict[str, int] = {}
    newest: dict[str, float] = {}
    for entry in attempts:
        a = AttemptHistory.from_entry(entry)
        if entry.zone is None or not a.spot:
            continue
        held[entry.zone] = held.get(entry.zone, 0.0) + (a.held_seconds or 0.0) / 3600.0
        if a.ended and a.exit_class in INTERRUPTED_CLASSES and not a.capacity_switch:
            lost[entry.zone] = lost.get(entry.zone, 0) + 1
            if a.ended_at is not None:
                newest[entry.zone] = max(newest.get(entry.zone, a.ended_at), a.ended_at)
    return {
        zone: ZoneHistory(hours, lost.get(zone, 0), max(0.0, now - newest[zone]) if zone in newest else None)
        for zone, hours in held.items()
    }
