"""Spot or on-demand under a deadline: the Uniform Progress policy of "Can't Be Late" (Wu et al., NSDI 2024).

Progress is measured in seconds of useful training (steps done x the steady
seconds per step), against a straight line from the job's start (0) to its
deadline (all the work). The paper's rules, in order: when the time left is less
than the work left plus two restarts, on-demand for good (safety net; here also
plus a reserve: the work since the last commit, which a hard kill on spot would
take back, the checkpoints still to write and the time to the next decision); a job
that holds spot capacity keeps it, behind the line or not (spot makes progress
as fast as on-demand, and leaving it costs a checkpoint and a restart); a job
waiting for spot waits while on or ahead of the line and takes on-demand once
behind it; a job on on-demand goes back to spot only when spot is there and the
job is ahead of the line by more than a restart (no flapping). The deadline is
at risk when even on-demand from now on would miss it.

A job waiting for spot also waits, behind the line or not, while the slack (time
left less work left) is more than ``WAIT_WHILE_SLACK_OVER`` of the work left:
waiting costs nothing, and the safety net still moves it in time. Over the
9-zone V100 traces (8 h job) this took the policy from 4% and 11% dearer than
spot-until-late at 16 h and 24 h deadlines to within 1%, with the same cost at
10 h and 12 h, where the slack is already below that share at the start.

The first version moved a job off running spot capacity whenever it was behind
the line; replayed over the public V100 traces (``orchestrator simulate``) that
cost more than staying on spot until late, since every such move paid a
checkpoint and a restart for capacity no faster than the one it left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SPOT = "spot"
ON_DEMAND = "on_demand"
CAPACITIES = (SPOT, ON_DEMAND)
# a job waiting for spot waits while (time left - work left) > this x work left (measured with orchestrator simulate)
WAIT_WHILE_SLACK_OVER = 0.5


@dataclass(frozen=True)
class DeadlineState:
    """Where a job stands, all in seconds from its first attempt's start."""

    elapsed_seconds: float  # wall time since the job's first attempt began
    deadline_seconds: float  # the deadline, from the same start
    work_done_seconds: float  # useful training done (steps done x steady seconds per step)
    work_total_seconds: float  # all the training the job needs (max_steps x steady seconds per step)
    restart_seconds: float  # one restart: start to first step after a restore
    current: str = SPOT  # the capacity the job is on now (SPOT also while it waits for spot)
    locked: bool = False  # on-demand for good (decided earlier)
    spot_available: bool = True  # spot capacity is there now (held, or offered); False while waiting for it
    reserve_seconds: float = 0.0  # kept in hand beyond the work left: work a hard kill would lose, checkpoints to
    # write, the time until the next decision


def reserve_seconds(
    *,
    at_risk_seconds: float,
    work_left_seconds: float,
    checkpoint_cost_seconds: float,
    on_demand_every_seconds: float,
    until_next_decision_seconds: float,
) -> float:
    """What the deadline policy keeps in hand beyond the work left (``DeadlineState.reserve_seconds``): the work a
    hard kill would take back while on spot, the checkpoints the work left will write on on-demand (one of
    ``checkpoint_cost_seconds`` every ``on_demand_every_seconds`` of training) and the time until it decides again.
    The runner's capacity watch and the simulator both keep this."""
    every = on_demand_every_seconds
    checkpoints = work_left_seconds * checkpoint_cost_seconds / every if 0 < every < math.inf else 0.0
    return max(0.0, at_risk_seconds) + max(0.0, checkpoints) + max(0.0, until_next_decision_seconds)


@dataclass(frozen=True)
class CapacityDecision:
    capacity: str  # SPOT | ON_DEMAND
    reason: str  # what the log, ledger, MLflow tag and webhook say
    locked: bool = False  # on-demand for good from here
    at_risk: bool = False  # even on-demand from now on misses the deadline


def _h(seconds: float) -> str:
    # a short job's figures in hours all read 0.00 h
    if abs(seconds) < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if abs(seconds) < 7200 else f"{seconds / 3600:.2f} h"


def decide_capacity(s: DeadlineState) -> CapacityDecision:
    """The capacity to take now, and why (pure: the runner and the simulator both call this)."""
    time_left = s.deadline_seconds - s.elapsed_seconds
    work_left = max(0.0, s.work_total_seconds - s.work_done_seconds)
    # on-demand from now: one restart if the job must move to it first
    on_demand_needs = work_left + (0.0 if s.current == ON_DEMAND else s.restart_seconds)
    at_risk = work_left > 0 and time_left < on_demand_needs
    line = (
        s.work_total_seconds * min(1.0, max(0.0, s.elapsed_seconds) / s.deadline_seconds)
        if s.deadline_seconds > 0
        else s.work_total_seconds
    )
    ahead = s.work_done_seconds - line
    status = (
        f"progress {_h(s.work_done_seconds)} of {_h(s.work_total_seconds)} at {_h(s.elapsed_seconds)} of "
        f"{_h(s.deadline_seconds)} (line {_h(line)}); {_h(time_left)} left for {_h(work_left)} of work"
    )
    if work_left <= 0:
        return CapacityDecision(s.current, f"work done; {status}", locked=s.locked)
    if s.locked:
        return CapacityDecision(ON_DEMAND, f"on-demand for good; {status}", locked=True, at_risk=at_risk)
    if time_left < work_left + 2 * s.restart_seconds + s.reserve_seconds:
        return CapacityDecision(
            ON_DEMAND,
            f"time left is less than the work left plus two restarts "
            f"({_h(2 * s.restart_seconds)}) and a reserve of {_h(s.reserve_seconds)}: "
            f"on-demand for good; {status}",
            locked=True,
            at_risk=at_risk,
        )
    if s.current == ON_DEMAND:
        if ahead > s.restart_seconds and s.spot_available:
            return CapacityDecision(
                SPOT,
                f"ahead of the line by {_h(ahead)} (more than a restart) and spot is there: back to spot; {status}",
                at_risk=at_risk,
            )
        why = (
            "no spot capacity"
            if s.spot_available is False and ahead > s.restart_seconds
            else "not yet ahead of the line by a restart"
        )
        return CapacityDecision(ON_DEMAND, f"{why}; {status}", at_risk=at_risk)
    if s.spot_available:
        where = "on or ahead of the line" if ahead >= 0 else f"behind the line by {_h(-ahead)}, but spot is held"
        return CapacityDecision(SPOT, f"{where}: spot; {status}", at_risk=at_risk)
    if ahead >= 0:
        return CapacityDecision(
            SPOT, f"no spot capacity, on or ahead of the line: wait for spot; {status}", at_risk=at_risk
        )
    if time_left - work_left > WAIT_WHILE_SLACK_OVER * work_left:
        return CapacityDecision(
            SPOT,
            f"no spot capacity, behind the line by {_h(-ahead)} but the slack is over "
            f"{WAIT_WHILE_SLACK_OVER:.0%} of the work left: wait for spot; {status}",
            at_risk=at_risk,
        )
    return CapacityDecision(
        ON_DEMAND, f"no spot capacity and behind the line by {_h(-ahead)}: on-demand; {status}", at_risk=at_risk
    )
