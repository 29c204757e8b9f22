"""How often to checkpoint: Young/Daly, from the measured cost of a checkpoint and the observed preemptions.

Young (1974) and Daly (2006): with a checkpoint costing C seconds of training and
work lost at a mean interval of M seconds, the interval that minimises the
expected waste is T = sqrt(2 C M) (to first order, for C << M). Only preemptions
that come without an honoured notice lose work: one with a notice the job
honoured ends in an emergency checkpoint, so the share of noticed preemptions
stretches M, and hard kills shrink it.

The rate of preemptions is a Gamma-Poisson blend: the catalog's prior rate
counts as ``prior_hours`` of observation, the job's own attempts as what they
were, so a job with no history follows the prior and one with many hours
follows itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from orchestrator.core.durations import AUTO as AUTO  # checkpoint.every=auto (``core.durations.Every``), re-exported
from orchestrator.core.durations import MAX_EVERY as MAX_EVERY  # auto's bounds, this policy's (re-exported)
from orchestrator.core.durations import MIN_EVERY as MIN_EVERY

PRIOR_WEIGHT_HOURS = 4.0  # how many hours of the job's own history weigh as much as the catalog's prior

# C before any checkpoint is measured: the Trainer's save stall, a snapshot of the trainable state written to
# local disk or /dev/shm (the upload goes on behind training). Round figures, replaced by the first measurement.
SNAPSHOT_WRITE_BYTES_PER_SECOND = 200e6
SNAPSHOT_BASE_SECONDS = 0.25


def estimated_checkpoint_seconds(state_bytes: float) -> float:
    """C before it is measured (the runner's schedule and the planner): a snapshot of ``state_bytes``."""
    return SNAPSHOT_BASE_SECONDS + max(0.0, state_bytes) / SNAPSHOT_WRITE_BYTES_PER_SECOND


@dataclass(frozen=True)
class Lifetime:
    """One attempt as the rate estimate sees it: how long it held its machine and how it ended.

    ``preempted``: the attempt ended by losing its machine (a notice, a signal or a vanished worker);
    ``noticed``: that loss came with a notice the job honoured (an emergency checkpoint was committed).
    """

    seconds: float
    preempted: bool
    noticed: bool = False


@dataclass(frozen=True)
class PreemptionEstimate:
    per_hour: float  # expected preemptions per hour of held capacity
    notice_share: float  # share of preemptions that come with a notice the job honours
    observed_hours: float  # hours of this job's own attempts in the estimate
    observed_preemptions: int
    prior_per_hour: float

    @property
    def lossy_per_hour(self) -> float:
        """Preemptions per hour that lose the work since the last checkpoint (no honoured notice)."""
        return self.per_hour * (1.0 - self.notice_share)


def estimate_preemptions(
    lifetimes: Iterable[Lifetime],
    prior_per_hour: float,
    *,
    prior_hours: float = PRIOR_WEIGHT_HOURS,
    prior_notice_share: float = 0.0,
    override_per_hour: Optional[float] = None,
) -> PreemptionEstimate:
    """Blend the job's own attempt lifetimes with the catalog's prior (``override_per_hour`` wins outright)."""
    lifetimes = list(lifetimes)
    hours = sum(max(0.0, lt.seconds) for lt in lifetimes) / 3600.0
    preempted = [lt for lt in lifetimes if lt.preempted]
    noticed = sum(1 for lt in preempted if lt.noticed)
    if override_per_hour is not None:
        rate = max(0.0, float(override_per_hour))
    else:
        rate = (max(0.0, prior_per_hour) * prior_hours + len(preempted)) / (prior_hours + hours)
    # the notice share: the prior's share weighs as one preemption, so one observation moves it but doesn't own it
    share = (prior_notice_share + noticed) / (1 + len(preempted))
    return PreemptionEstimate(
        per_hour=rate,
        notice_share=min(1.0, max(0.0, share)),
        observed_hours=hours,
        observed_preemptions=len(preempted),
        prior_per_hour=prior_per_hour,
    )


def young_daly_seconds(checkpoint_cost_seconds: float, mean_seconds_between_losses: float) -> float:
    """T = sqrt(2 C M); infinite when nothing is ever lost, 0 when a checkpoint costs nothing."""
    if mean_seconds_between_losses == math.inf:
        return math.inf
    return math.sqrt(2.0 * max(0.0, checkpoint_cost_seconds) * max(0.0, mean_seconds_between_losses))


@dataclass(frozen=True)
class IntervalDecision:
    seconds: float  # the interval to use, bounded
    unbounded_seconds: float  # Young/Daly's T before the bounds (inf: no lossy preemptions expected)
    checkpoint_cost_seconds: float  # C
    mean_seconds_between_losses: float  # M (inf: none expected)
    estimate: PreemptionEstimate
    bound: Optional[str] = None  # "min_every" | "max_every" when a bound decided
    basis: str = "young-daly"  # "young-daly" | "lifetimes" (the least waste over the job's own lifetimes and the prior)

    def explain(self) -> str:
        m = (
            "never"
            if self.mean_seconds_between_losses == math.inf
            else f"{self.mean_seconds_between_losses / 3600:.2f} h"
        )
        why = f" (held at checkpoint.{self.bound})" if self.bound else ""
        if self.basis == "lifetimes":
            return (
                f"checkpoint every {self.seconds:.0f}s{why}: the least expected waste over this job's "
                f"{self.estimate.observed_preemptions} preemptions in {self.estimate.observed_hours:.2f} h of "
                f"training, blended with the prior ({self.estimate.prior_per_hour:.2f}/h); Young/Daly alone: "
                f"{self.unbounded_seconds:.0f}s (C = {self.checkpoint_cost_seconds:.2f}s, M = {m})"
            )
        return (
            f"checkpoint every {self.seconds:.0f}s{why}: T = sqrt(2 x C x M) with C = "
            f"{self.checkpoint_cost_seconds:.2f}s per checkpoint, M = {m} between lossy preemptions "
            f"({self.estimate.per_hour:.2f}/h, {self.estimate.notice_share:.0%} with an honoured notice; "
            f"{self.estimate.observed_preemptions} seen in {self.estimate.observed_hours:.2f} h of this job)"
        )


def checkpoint_interval(
    checkpoint_cost_seconds: float,
    estimate: PreemptionEstimate,
    *,
    min_seconds: float,
    max_seconds: float,
    lifetimes: Optional[Sequence[Lifetime]] = None,
    prior_hours: float = PRIOR_WEIGHT_HOURS,
) -> IntervalDecision:
    """The interval from Young/Daly, bounded by ``[min_seconds, max_seconds]``.

    With ``lifetimes`` (the job's attempts, each from its first step to its end), the interval is instead the one
    of least expected waste over those lifetimes replayed exactly, blended with Young/Daly's first-order waste at
    the prior rate weighing as ``prior_hours``: real spot lifetimes are far from exponential (most end young, a
    few run for many hours), so kills land early in a lifetime more often than Young/Daly assumes, and the best
    interval is longer. Pass none when ``compute.preemptions_per_hour`` overrides the rate.
    """
    lossy = estimate.lossy_per_hour
    m = 3600.0 / lossy if lossy > 0 else math.inf
    t = young_daly_seconds(checkpoint_cost_seconds, m)
    basis = "young-daly"
    seconds = t
    trained = [lt for lt in (lifetimes or ()) if lt.seconds > 0]
    if trained and checkpoint_cost_seconds > 0 and max_seconds > min_seconds > 0:
        seconds, basis = (
            _least_waste_interval(checkpoint_cost_seconds, trained, estimate, min_seconds, max_seconds, prior_hours),
            "lifetimes",
        )
    bound = None
    if seconds <= min_seconds:
        seconds, bound = min_seconds, "min_every"
    elif seconds >= max_seconds:
        seconds, bound = max_seconds, "max_every"
    return IntervalDecision(
        seconds=float(seconds),
        unbounded_seconds=t,
        checkpoint_cost_seconds=checkpoint_cost_seconds,
        mean_seconds_between_losses=m,
        estimate=estimate,
        bound=bound,
        basis=basis,
    )


def lifetime_waste_seconds(interval_seconds: float, checkpoint_cost_seconds: float, lifetime: Lifetime) -> float:
    """Seconds of one lifetime (first step to end) not spent on kept work, checkpointing every ``interval``:
    the checkpoints written (one cut short included) and, at a kill without an honoured notice, the work since the
    last commit."""
    cycle = interval_seconds + checkpoint_cost_seconds
    full = math.floor(lifetime.seconds / cycle)
    rest = lifetime.seconds - full * cycle
    waste = full * checkpoint_cost_seconds + max(0.0, rest - interval_seconds)
    if lifetime.preempted and not lifetime.noticed:
        waste += min(rest, interval_seconds)
    return waste


def _least_waste_interval(
    c: float,
    lifetimes: Sequence[Lifetime],
    estimate: PreemptionEstimate,
    lo: float,
    hi: float,
    prior_hours: float,
    points: int = 48,
) -> float:
    prior_lossy = estimate.prior_per_hour * (1.0 - estimate.notice_share) / 3600.0
    prior_seconds = prior_hours * 3600.0
    seen = sum(lt.seconds for lt in lifetimes)

    def waste(t: float) -> float:
        own = sum(lifetime_waste_seconds(t, c, lt) for lt in lifetimes)
        return (own + prior_seconds * (c / t + prior_lossy * t / 2.0)) / (seen + prior_seconds)

    grid: list[float] = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]
    return min(grid, key=waste)


def expected_waste_fraction(
    interval_seconds: float, checkpoint_cost_seconds: float, estimate: PreemptionEstimate, restart_seconds: float = 0.0
) -> float:
    """First-order share of paid time not spent on useful steps (the planner's and the simulator's model):
    C/T for checkpoints; per lossy preemption, half an interval of lost work; per preemption, one restart."""
    ckpt = checkpoint_cost_seconds / interval_seconds if 0 < interval_seconds < math.inf else 0.0
    lossy = estimate.lossy_per_hour / 3600.0
    if interval_seconds == math.inf:
        lost = math.inf if lossy > 0 else 0.0
    else:
        lost = lossy * interval_seconds / 2.0
    return min(1.0, ckpt + lost + estimate.per_hour / 3600.0 * restart_seconds)
