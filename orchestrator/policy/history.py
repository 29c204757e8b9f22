"""What the policies learn from a job's ledger: its spot lifetimes, its measured restarts, its steady pace.

One reading for every caller (the checkpoint schedule, the deadline's capacity
watch, the planner), with the simulator's conventions: a lifetime is training
time, from the end of the first step to the attempt's end; an attempt that lost
its machine before its first step could lose no work whatever the interval, so
it counts as no lifetime at all.

An attempt's start to the end of its first step is its restart split's total
(``extra.restart.total_s``); ledgers written before the split was the one record
have it as ``extra.start_to_first_step_s``, read when the split is absent.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Mapping, Optional

from orchestrator.exitcodes import INTERRUPTED_CLASSES, RUNNING, ExitClass
from orchestrator.policy.interval import Lifetime


def start_to_first_step_seconds(attempt: Mapping) -> Optional[float]:
    """The attempt's start to the end of its first step (None: it never got that far, or nothing was recorded)."""
    extra = attempt.get("extra") or {}
    total = (extra.get("restart") or {}).get("total_s")
    if total is None:
        total = extra.get("start_to_first_step_s")  # ledgers written before the restart split was the one record
    return float(total) if total is not None else None


def restart_seconds_measured(attempts: Iterable[Mapping]) -> list[float]:
    """Each attempt's start to the end of its first step, where it got that far."""
    return [s for a in attempts if (s := start_to_first_step_seconds(a))]


def last_restart_seconds(attempts: Iterable[Mapping]) -> float:
    """The newest measured start to first step, 0 when none was measured."""
    measured = restart_seconds_measured(attempts)
    return measured[-1] if measured else 0.0


def measured_cost_seconds(attempts: Iterable[Mapping]) -> Optional[float]:
    """The checkpoint cost C the newest earlier attempt measured (None: none measured one)."""
    for a in reversed(list(attempts)):
        chosen = (a.get("extra") or {}).get("checkpoint_interval") or {}
        if chosen.get("cost_source") == "measured" and chosen.get("checkpoint_cost_s") is not None:
            return float(chosen["checkpoint_cost_s"])
    return None


def spot_lifetimes(attempts: Iterable[Mapping]) -> Iterator[Lifetime]:
    """The job's ended spot attempts as the rate estimate sees them.

    Noticed: ended ``preempted`` (the worker exits so only after committing its emergency checkpoint) with
    nothing past that checkpoint; ``vanished`` is a hard kill. An attempt that stopped to move to other
    capacity (``extra.capacity_switch``) lost no machine; on-demand attempts say nothing of spot's rate.
    """
    for a in attempts:
        start, end = a.get("started_at"), a.get("ended_at") or a.get("last_seen")
        if a.get("exit_class") == RUNNING or not a.get("spot") or start is None or end is None:
            continue
        extra = a.get("extra") or {}
        first = start_to_first_step_seconds(a)
        if not first:
            yield Lifetime(0.0, preempted=False)
            continue
        switched = bool(extra.get("capacity_switch"))
        preempted = a.get("exit_class") in INTERRUPTED_CLASSES and not switched
        noticed = (a.get("exit_class") == ExitClass.PREEMPTED.value
                   and int(a.get("checkpoint_step_end") or 0) >= int(a.get("step_end") or 0))
        yield Lifetime(seconds=max(0.0, float(end) - float(start) - float(first)), preempted=preempted,
                       noticed=preempted and noticed)


def steady_seconds_per_step(attempts: Iterable[Mapping]) -> Optional[float]:
    """Seconds per optimizer step over the earlier attempts, start-up excluded (None: nothing to go on)."""
    seconds = steps = 0.0
    for a in attempts:
        start, end = a.get("started_at"), a.get("ended_at") or a.get("last_seen")
        done = int(a.get("step_end") or 0) - int(a.get("step_start") or 0)
        startup = start_to_first_step_seconds(a)
        if start is not None and end is not None and done > 1 and startup is not None:
            seconds += max(0.0, float(end) - float(start) - float(startup))
            steps += done - 1
    return seconds / steps if steps else None
