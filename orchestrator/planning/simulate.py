"""``orchestrator simulate``: replay spot traces through the job's policies, with no training, in seconds.

A trace (``data/spot-traces/``: ``{"metadata": {"gap_seconds": G}, "data": [0, 1, ...]}``, read with its set's
declared convention, ``planning.spot_traces``: 1 = spot capacity at that tick in the public sets) is read as a
cycle of availability intervals. A job of ``work`` seconds of useful training is
started at many points (windows) of each trace and run through the decisions the runner makes:

- the checkpoint interval: a fixed one, or ``auto``: Young/Daly (``policy.interval``) re-derived at every
  attempt's start from the spot lifetimes seen so far, starting from the prior;
- the capacity: ``deadline`` (Uniform Progress, ``policy.deadline.decide_capacity``), ``late-switch`` (the
  baseline: stay on spot, wait while there is none, on-demand for good at the last tick where the work left,
  with its checkpoints, plus a restart still fits before the deadline), ``spot`` (always spot) or
  ``on-demand``;
- the requeue caps after each preemption (``requeue.RequeuePolicy``, the supervisor's own).

The job model (seconds): every start on new capacity costs ``restart`` before the first step; after every
``interval`` seconds of training a checkpoint costs ``checkpoint_cost`` and commits the work done before it;
a hard kill loses the work since the last commit (a checkpoint still being written included); a share
``notice_share`` of preemptions comes with a notice the job honours and loses nothing; a planned move
between capacities writes a checkpoint, then restarts. Waiting for spot costs nothing; on-demand is always
there. Decisions are taken at every event and at every trace tick.

Figures per window: goodput = useful work / paid seconds (what the paid time would have bought
uninterrupted); cost against on-demand = the window's cost / the same job on on-demand from the start;
lost work = work thrown away by hard kills; deadline missed = finished after the deadline (or never).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence, cast

from orchestrator.core.durations import parse_duration
from orchestrator.planning.spot_traces import Trace
from orchestrator.policy.deadline import ON_DEMAND, SPOT, DeadlineState, decide_capacity, reserve_seconds
from orchestrator.policy.interval import AUTO, MAX_EVERY, MIN_EVERY, Lifetime, checkpoint_interval, estimate_preemptions
from orchestrator.records.ledger_record import AttemptEntry

POLICIES = ("deadline", "late-switch", "spot", "on-demand")
DEADLINE_POLICIES = ("deadline", "late-switch")
# AWS p3.2xlarge (1x V100, the traces' instance), us-east-1 list price, and a typical spot price for it.
ON_DEMAND_USD = 3.06
SPOT_USD = 0.92
MAX_SIMULATED_PERIODS = 20  # a window that has not finished after this many trace lengths is given up
SWEEP_MINUTES = (2, 3, 5, 7, 10, 12, 15, 20, 25, 30, 45, 60, 90, 120)  # fixed intervals for the hindsight sweep


# ---------------------------------------------------------------- one job in one window


@dataclass(frozen=True)
class Job:
    """What is simulated: all durations in seconds."""

    work_seconds: float
    restart_seconds: float = 360.0
    checkpoint_cost_seconds: float = 30.0
    every: str | float = AUTO  # AUTO or a fixed interval in seconds of training between checkpoints
    deadline_seconds: Optional[float] = None
    notice_share: float = 0.0
    prior_per_hour: float = 0.44  # money.cost.DEFAULT_SPOT_PREEMPTIONS_PER_HOUR
    min_every_seconds: float = parse_duration(MIN_EVERY)  # auto's bounds, the job's defaults
    max_every_seconds: float = parse_duration(MAX_EVERY)
    spot_usd: float = SPOT_USD
    on_demand_usd: float = ON_DEMAND_USD
    max_preemptions: int = 20
    max_failures: int = 3
    restart_schedule: tuple[float, ...] = ()  # measured restarts of attempts 1, 2, ... (a replay); then restart_seconds


@dataclass
class Outcome:
    finished: bool
    elapsed_seconds: float
    paid_spot_seconds: float
    paid_on_demand_seconds: float
    work_seconds: float  # useful work committed or finished
    lost_seconds: float
    preemptions: int
    switches: int
    intervals: list[float] = field(default_factory=list)
    stopped: str = ""  # why the job stopped unfinished (requeue caps)

    @property
    def paid_seconds(self) -> float:
        return self.paid_spot_seconds + self.paid_on_demand_seconds

    @property
    def goodput(self) -> float:
        return self.work_seconds / self.paid_seconds if self.paid_seconds else 0.0

    def cost_usd(self, job: Job) -> float:
        return (self.paid_spot_seconds * job.spot_usd + self.paid_on_demand_seconds * job.on_demand_usd) / 3600.0


def _requeue_policy(job: Job):
    from orchestrator.config.schema import RequeueConfig
    from orchestrator.policy.requeue import RequeuePolicy

    return RequeuePolicy(RequeueConfig(max_preemptions=job.max_preemptions, max_failures=job.max_failures))


class _Run:
    """The state of one job replayed from ``start`` of ``trace`` under ``policy``."""

    def __init__(self, job: Job, trace: Optional[Trace], start: float, policy: str, requeue):
        self.job, self.trace, self.t0, self.t, self.policy = job, trace, start, start, policy
        self.requeue = requeue
        self.capacity: Optional[str] = None  # held capacity; None while waiting for spot
        self.phase, self.left = "wait", 0.0  # wait | restart | train | ckpt; seconds left in restart/ckpt
        self.switch_to: Optional[str] = None  # a planned move, done once the checkpoint being written commits
        self.done = self.committed = 0.0
        self.interval = math.inf
        self.paid = {SPOT: 0.0, ON_DEMAND: 0.0}
        self.lost, self.preemptions, self.switches = 0.0, 0, 0
        self.first_step_at: Optional[float] = None
        self.lifetimes: list[Lifetime] = []
        self.attempts: list[AttemptEntry] = []  # as the requeue policy reads them
        self.locked = False
        self.intervals: list[float] = []
        self.stopped = ""

    # -- the decisions (the runner's functions) ------------------------

    def _spot(self) -> tuple[bool, float]:
        return self.trace.spot_at(self.t) if self.trace is not None else (False, math.inf)

    def _choose(self) -> str:
        if self.policy == "spot":
            return SPOT
        if self.policy == "on-demand":
            return ON_DEMAND
        job, deadline = self.job, cast(float, self.job.deadline_seconds)  # set: the deadline policies require it
        elapsed, work_left = self.t - self.t0, job.work_seconds - self.done
        if self.policy == "late-switch":
            if not self.locked and deadline - elapsed < self._late_switch_needs(work_left):
                self.locked = True
            return ON_DEMAND if self.locked else SPOT
        decision = decide_capacity(
            DeadlineState(
                elapsed_seconds=elapsed,
                deadline_seconds=deadline,
                work_done_seconds=self.done,
                work_total_seconds=job.work_seconds,
                restart_seconds=job.restart_seconds,
                current=self.capacity or SPOT,
                locked=self.locked,
                spot_available=self._spot()[0],
                reserve_seconds=self._reserve(work_left),
            )
        )
        self.locked = decision.locked
        return decision.capacity

    def _reserve(self, work_left: float) -> float:
        """The deadline's reserve (``policy.deadline.reserve_seconds``), decided again at the next tick."""
        return reserve_seconds(
            at_risk_seconds=self.done - self.committed if self.capacity == SPOT else 0.0,
            work_left_seconds=work_left,
            checkpoint_cost_seconds=self.job.checkpoint_cost_seconds,
            on_demand_every_seconds=self._interval_for(ON_DEMAND),
            until_next_decision_seconds=cast(Trace, self.trace).gap_seconds,
        )

    def _late_switch_needs(self, work_left: float) -> float:
        """The baseline's latest safe move, to be fair to it: the work left with its checkpoints on on-demand,
        a restart, the checkpoint before the move when it is training, and the tick until it decides again."""
        job, od_every = self.job, self._interval_for(ON_DEMAND)
        overhead = job.checkpoint_cost_seconds / od_every if 0 < od_every < math.inf else 0.0
        move = job.checkpoint_cost_seconds if self.capacity == SPOT and self.phase == "train" else 0.0
        return work_left * (1 + overhead) + job.restart_seconds + move + cast(Trace, self.trace).gap_seconds

    def _interval_for(self, capacity: str) -> float:
        job = self.job
        if job.every != AUTO:
            return float(job.every)
        if capacity == ON_DEMAND:
            estimate = estimate_preemptions([], 0.0, override_per_hour=0.0)
        else:
            estimate = estimate_preemptions(self.lifetimes, job.prior_per_hour)
        return checkpoint_interval(
            job.checkpoint_cost_seconds,
            estimate,
            min_seconds=job.min_every_seconds,
            max_seconds=job.max_every_seconds,
            lifetimes=self.lifetimes if capacity == SPOT else None,
        ).seconds

    # -- moves -----------------------------------------------------------

    def _acquire(self, capacity: str) -> None:
        n, schedule = len(self.intervals), self.job.restart_schedule
        restart = schedule[n] if n < len(schedule) else self.job.restart_seconds
        self.capacity, self.phase, self.left = capacity, "restart", restart
        self.first_step_at, self.switch_to = None, None
        self.interval = self._interval_for(capacity)
        self.intervals.append(self.interval)

    def _lifetime(self, *, preempted: bool, noticed: bool = False) -> Lifetime:
        """What the interval's estimate learns from an attempt: its time from the first step to the end, and
        whether it was preempted after that step. A preemption during the restart can lose no work whatever the
        interval, so it does not count: on these traces many lifetimes are shorter than a restart, and counting
        them made ``auto`` checkpoint about twice as often as the best fixed interval in hindsight."""
        if self.first_step_at is None:
            return Lifetime(0.0, preempted=False)
        return Lifetime(self.t - self.first_step_at, preempted=preempted, noticed=noticed)

    def _release(self) -> None:
        if self.capacity == SPOT:
            self.lifetimes.append(self._lifetime(preempted=False))
        self.capacity, self.phase = None, "wait"

    def _apply(self, want: str, spot_now: bool) -> None:
        if self.capacity is None:
            if want == ON_DEMAND or spot_now:
                self._acquire(want)
            return
        if want == self.capacity or (want == SPOT and not spot_now):
            self.switch_to = None  # a move planned earlier is off; a checkpoint being written just commits
            return
        if self.phase == "restart":  # nothing to save yet: move now
            self._release()
            self.switches += 1
            self._acquire(want)
            return
        self.switch_to = want
        if self.phase == "train":
            self.phase, self.left = "ckpt", self.job.checkpoint_cost_seconds

    def _preempted(self) -> None:
        n = self.preemptions
        noticed = math.floor((n + 1) * self.job.notice_share) > math.floor(n * self.job.notice_share)
        self.preemptions += 1
        if noticed and self.phase in ("train", "ckpt"):
            self.committed = self.done  # the emergency checkpoint of an honoured notice
        else:
            self.lost += self.done - self.committed
            self.done = self.committed
        self.lifetimes.append(self._lifetime(preempted=True, noticed=noticed))
        self.capacity, self.phase, self.switch_to = None, "wait", None
        self.attempts.append(AttemptEntry.unrecorded("preempted" if noticed else "vanished"))
        decision = self.requeue.decide(self.attempts)
        if not decision.requeue:
            self.stopped = decision.reason

    # -- time ------------------------------------------------------------

    def _next_dt(self, spot_change: float) -> float:
        dt = spot_change - self.t if (self.capacity == SPOT or self.capacity is None) else math.inf
        if self.phase in ("restart", "ckpt"):
            dt = min(dt, self.left)
        elif self.phase == "train":
            dt = min(dt, self.interval - (self.done - self.committed), self.job.work_seconds - self.done)
        if self.policy in DEADLINE_POLICIES and self.trace is not None:
            gap = self.trace.gap_seconds
            dt = min(dt, (math.floor(self.t / gap) + 1) * gap - self.t)
        return max(dt, 0.0)

    def _advance(self, dt: float) -> None:
        self.t += dt
        if self.capacity is not None:
            self.paid[self.capacity] += dt
        if self.phase == "train":
            self.done += dt
        elif self.phase in ("restart", "ckpt"):
            self.left -= dt
        eps = 1e-6
        if self.phase == "restart" and self.left <= eps:
            self.phase, self.first_step_at = "train", self.t
        elif self.phase == "ckpt" and self.left <= eps:
            self.committed = self.done
            if self.switch_to is not None:
                target = self.switch_to
                if target == SPOT and not self._spot()[0]:
                    self.switch_to, self.phase = None, "train"
                else:
                    self._release()
                    self.switches += 1
                    self._acquire(target)
            else:
                self.phase = "train"
        elif (
            self.phase == "train"
            and self.done < self.job.work_seconds - eps
            and self.done - self.committed >= self.interval - eps
        ):
            self.phase, self.left = "ckpt", self.job.checkpoint_cost_seconds
            if self.left <= 0:
                self.committed, self.phase = self.done, "train"

    def run(self) -> Outcome:
        job, eps = self.job, 1e-6
        horizon = self.t0 + MAX_SIMULATED_PERIODS * (self.trace.period if self.trace else job.work_seconds * 2 + 1)
        while self.done < job.work_seconds - eps and not self.stopped and self.t < horizon:
            spot_now, change = self._spot()
            self._apply(self._choose(), spot_now)
            dt = self._next_dt(change)
            self._advance(dt)
            if self.capacity == SPOT and not self._spot()[0]:
                self._preempted()
        finished = self.done >= job.work_seconds - eps
        return Outcome(
            finished,
            self.t - self.t0,
            self.paid[SPOT],
            self.paid[ON_DEMAND],
            job.work_seconds if finished else self.committed,
            self.lost,
            self.preemptions,
            self.switches,
            self.intervals,
            self.stopped or ("" if finished else "not finished within the horizon"),
        )


def simulate_window(job: Job, trace: Optional[Trace], start: float, policy: str) -> Outcome:
    """One job started at ``start`` seconds into ``trace`` (None: no spot at all) under ``policy``."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if policy in DEADLINE_POLICIES and not job.deadline_seconds:
        raise ValueError(f"policy {policy!r} needs a deadline (--deadline-hours)")
    return _Run(job, trace, start, policy, _requeue_policy(job)).run()


# ---------------------------------------------------------------- many windows


@dataclass
class Summary:
    policy: str
    windows: int
    deadline_misses: int
    cost_vs_on_demand: float
    goodput: float
    lost_work_hours: float  # mean per window
    preemptions: float  # mean per window
    unfinished: int
    every: str

    def as_json(self) -> dict:
        return {
            "policy": self.policy,
            "windows": self.windows,
            "deadline_misses": self.deadline_misses,
            "cost_vs_on_demand": round(self.cost_vs_on_demand, 4),
            "goodput": round(self.goodput, 4),
            "lost_work_hours": round(self.lost_work_hours, 4),
            "preemptions": round(self.preemptions, 3),
            "unfinished": self.unfinished,
            "checkpoint_every": self.every,
        }


def window_starts(trace: Trace, windows: int) -> list[float]:
    """``windows`` start points spread evenly over the trace, on tick boundaries."""
    ticks = int(round(trace.period / trace.gap_seconds))
    step = max(1, ticks // max(1, windows))
    return [i * trace.gap_seconds for i in range(0, ticks, step)][:windows]


def summarise(job: Job, policy: str, outcomes: Sequence[Outcome]) -> Summary:
    baseline = simulate_window(job, None, 0.0, "on-demand").cost_usd(job)
    misses = sum(
        1
        for o in outcomes
        if not o.finished or (job.deadline_seconds is not None and o.elapsed_seconds > job.deadline_seconds + 1e-6)
    )
    n = len(outcomes)
    every = AUTO if job.every == AUTO else f"{float(job.every):g}s"
    return Summary(
        policy,
        n,
        misses,
        statistics.fmean(o.cost_usd(job) / baseline for o in outcomes),
        statistics.fmean(o.goodput for o in outcomes),
        statistics.fmean(o.lost_seconds for o in outcomes) / 3600,
        statistics.fmean(o.preemptions for o in outcomes),
        sum(not o.finished for o in outcomes),
        every,
    )


def simulate(job: Job, traces: Iterable[Trace], policy: str, windows: int = 40) -> Summary:
    """``policy`` over ``windows`` start points of every trace."""
    outcomes = [simulate_window(job, tr, s, policy) for tr in traces for s in window_starts(tr, windows)]
    return summarise(job, policy, outcomes)


def interval_sweep(job: Job, trace: Trace, windows: int = 40, minutes: Sequence[float] = SWEEP_MINUTES) -> dict:
    """Goodput on one trace (spot policy) with ``auto`` and with each fixed interval: the hindsight check."""

    def goodput(every) -> float:
        one = Job(**{**job.__dict__, "every": every, "deadline_seconds": None})
        return simulate(one, [trace], "spot", windows).goodput

    fixed = {m: goodput(m * 60.0) for m in minutes}
    best = max(fixed, key=fixed.__getitem__)
    return {
        "trace": trace.name,
        "auto": goodput(AUTO),
        "fixed": fixed,
        "best_minutes": best,
        "best": fixed[best],
        "fixed_30m": fixed.get(30) if 30 in fixed else goodput(1800.0),
    }
