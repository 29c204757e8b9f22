"""Where to run next: the zone of least expected dollars per useful hour, or on-demand when spot can no longer
make the deadline. Pure: the caller says what it knows of each zone and of the job; nothing is read or written.

For a spot zone, with its estimated preemption rate r (what the job has seen of the zone: its own preemptions
and held hours there, and the losses of capacity and hours up it watched there while elsewhere; blended with the
prior, ``PRIOR_WEIGHT_HOURS`` of it; Gamma-Poisson as ``policy.interval``), checkpoint cost C, restart
R, the share n of preemptions with an honoured notice and Young/Daly's interval T = sqrt(2 C / (r (1 - n))):

- the share of held time that is useful: u = 1 - C/T - r (1 - n) T/2 - r R (checkpoints, the work a kill
  takes back, the restart after each preemption);
- a move costs m seconds paid before the first step: R when the job does not hold that zone now, plus the
  checkpoint's (and weights') transfer when its checkpoint is elsewhere (and a checkpoint C when it leaves held
  capacity while training), spread over the time it expects to hold the zone, H = min(1/r, work left / u);
- dollars per useful hour = price x (H + m) / (u H), plus the dollars a start there pays once (``Zone.move_usd``:
  moving the checkpoint out of the bucket's region) spread over the same u H useful hours.

On-demand is priced the same way with r = 0. A zone that preempted the job less than ``cooldown_seconds`` ago is
avoided while another zone has capacity. Under a deadline, spot is taken only while the slack (time left less
what on-demand needs to finish from here) covers the reserve (``reserve_seconds``); else on-demand, the
cheapest. With no spot capacity anywhere the job waits for free, which burns slack one for one, until the slack
is only what spot's expected waste on the work left will need; then on-demand, until spot is back.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass
from typing import Optional, Sequence

from orchestrator.policy.interval import PRIOR_WEIGHT_HOURS, young_daly_seconds

ON_DEMAND = "on-demand"
WAIT = "wait"
DEFAULT_COOLDOWN_SECONDS = 600.0
WAIT_WASTE_MULTIPLE = 3.0  # with no capacity anywhere, wait only while the slack is over reserve + 3 x spot's waste
MIN_INTERVAL_SECONDS, MAX_INTERVAL_SECONDS = 60.0, 3600.0  # the job's checkpoint.min_every / max_every defaults


@dataclass(frozen=True)
class Zone:
    """What the job knows of one zone now."""

    name: str
    spot_usd: float  # per hour
    available: bool  # spot capacity can be had now
    prior_per_hour: float  # the prior rate of preemptions per held hour
    held_hours: float = 0.0  # the job's own hours on spot here
    preemptions: int = 0  # the job's own preemptions here
    since_preempted_seconds: Optional[float] = None  # since this zone last preempted the job (None: never)
    _: KW_ONLY  # what the zone's callers add (the simulator's watch, the runner's egress): named, never placed
    seen_hours: float = 0.0  # hours the job watched its capacity up while not holding it (since the job began)
    seen_losses: int = 0  # losses of that capacity it watched there meanwhile
    move_usd: float = 0.0  # dollars a start here pays once (egress of the checkpoint from another region)


@dataclass(frozen=True)
class JobState:
    """The job, as the placement sees it: all durations in seconds."""

    work_left_seconds: float
    restart_seconds: float
    transfer_seconds: float = 0.0  # moving the checkpoint (and weights) to another zone
    checkpoint_cost_seconds: float = 30.0
    notice_share: float = 0.0  # share of preemptions with a notice the job honours (it loses no work)
    on_demand_usd: float = math.inf  # the cheapest on-demand price per hour
    time_left_seconds: Optional[float] = None  # to the deadline (None: no deadline)
    current: Optional[str] = None  # the zone (or ON_DEMAND) held now; None while holding nothing
    checkpoint_zone: Optional[str] = None  # where the latest checkpoint lies (None: nowhere yet, or everywhere)
    training: bool = False  # past its restart on the capacity it holds (leaving it writes a checkpoint first)
    at_risk_seconds: float = 0.0  # work done since the last commit, which a kill would take back
    decision_seconds: float = 0.0  # until the next decision (a trace tick)
    cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS


@dataclass(frozen=True)
class Placement:
    zone: str  # a zone's name, ON_DEMAND, or WAIT (no spot capacity anywhere and time to wait)
    usd_per_useful_hour: float
    interval_seconds: float  # the checkpoint interval to use there
    reason: str
    slack_seconds: float = math.inf  # the deadline's slack and reserve when decided
    reserve_seconds: float = 0.0


def preemption_rate(zone: Zone, prior_hours: float = PRIOR_WEIGHT_HOURS) -> float:
    """Preemptions per held hour: what the job has seen of the zone (its own preemptions and held hours there,
    and the losses and hours up of the capacity it watched there while elsewhere) blended with the prior."""
    losses = max(0, zone.preemptions) + max(0, zone.seen_losses)
    hours = max(0.0, zone.held_hours) + max(0.0, zone.seen_hours)
    return (max(0.0, zone.prior_per_hour) * prior_hours + losses) / (prior_hours + hours)


def interval_seconds(rate_per_hour: float, checkpoint_cost_seconds: float) -> float:
    """Young/Daly at the rate, within the job's default bounds."""
    mean = 3600.0 / rate_per_hour if rate_per_hour > 0 else math.inf
    t = young_daly_seconds(checkpoint_cost_seconds, mean)
    return min(MAX_INTERVAL_SECONDS, max(MIN_INTERVAL_SECONDS, t))


def useful_share(rate_per_hour: float, job: JobState) -> tuple[float, float]:
    """(useful share of held time, the checkpoint interval) at ``rate_per_hour``."""
    lossy = rate_per_hour * (1.0 - job.notice_share) / 3600.0
    t = interval_seconds(lossy * 3600.0, job.checkpoint_cost_seconds)
    return 1.0 - job.checkpoint_cost_seconds / t - lossy * t / 2.0 - rate_per_hour / 3600.0 * job.restart_seconds, t


def move_seconds(name: str, job: JobState) -> float:
    """Paid seconds before the first step in ``name`` (0: the job trains there now)."""
    if name == job.current:
        return 0.0 if job.training else job.restart_seconds / 2.0  # half its restart is still to come, on average
    leave = job.checkpoint_cost_seconds if job.training else 0.0
    transfer = job.transfer_seconds if job.checkpoint_zone not in (None, name) else 0.0
    return leave + job.restart_seconds + transfer


def usd_per_useful_hour(
    name: str, usd: float, rate_per_hour: float, job: JobState, move_usd: float = 0.0
) -> tuple[float, float]:
    """(expected dollars per useful hour in ``name`` from here, the checkpoint interval there); ``move_usd``: the
    dollars a start there pays once (none when the job trains there now)."""
    u, t = useful_share(rate_per_hour, job)
    if u <= 0:
        return math.inf, t
    expected_hold = 3600.0 / rate_per_hour if rate_per_hour > 0 else math.inf
    hold = max(1.0, min(expected_hold, job.work_left_seconds / u))
    once = 0.0 if name == job.current else max(0.0, move_usd) * 3600.0 / (u * hold)
    return usd * (hold + move_seconds(name, job)) / (u * hold) + once, t


def slack_seconds(job: JobState) -> float:
    """Time left less what on-demand needs to finish from here (its start and hourly checkpoints included)."""
    if job.time_left_seconds is None:
        return math.inf
    needs = job.work_left_seconds * (1 + job.checkpoint_cost_seconds / MAX_INTERVAL_SECONDS) + move_seconds(
        ON_DEMAND, job
    )
    return job.time_left_seconds - needs


def reserve_seconds(job: JobState) -> float:
    """The slack spot must leave: what a kill could take back by the next decision (the work at risk, unless
    every preemption comes with a notice, and a decision period), a checkpoint, and from on-demand the trip back
    to it and another round trip's margin (no going back and forth for a few minutes of spot)."""
    at_risk = job.at_risk_seconds if job.notice_share < 1.0 else 0.0
    trip = job.restart_seconds + job.transfer_seconds + job.checkpoint_cost_seconds
    back = 3 * trip if job.current == ON_DEMAND else 0.0
    return at_risk + job.decision_seconds + job.checkpoint_cost_seconds + back


def deadline_interval(interval: float, job: JobState) -> float:
    """The interval, shortened so that the work at risk stays within half the slack beyond the reserve."""
    room = slack_seconds(job) - reserve_seconds(job) + job.at_risk_seconds
    return interval if not math.isfinite(room) else max(MIN_INTERVAL_SECONDS, min(interval, room / 2.0))


def _candidates(zones: Sequence[Zone], job: JobState) -> list[Zone]:
    """Zones with capacity now; one that just preempted the job only when no other has capacity."""
    up = [z for z in zones if z.available]
    cool = [z for z in up if z.since_preempted_seconds is None or z.since_preempted_seconds >= job.cooldown_seconds]
    return cool or up


def choose(zones: Sequence[Zone], job: JobState) -> Placement:
    """The placement of least expected dollars per useful hour (ties: the zone held now, then by name)."""
    od_usd, od_t = usd_per_useful_hour(ON_DEMAND, job.on_demand_usd, 0.0, job)
    priced: list[tuple[float, bool, str, float]] = []
    for z in _candidates(zones, job):
        cost, t = usd_per_useful_hour(z.name, z.spot_usd, preemption_rate(z), job, z.move_usd)
        priced.append((cost, z.name != job.current, z.name, t))
    slack, reserve = slack_seconds(job), reserve_seconds(job)
    decided = _decide(zones, job, priced, od_usd, od_t, slack, reserve)
    return Placement(
        decided.zone, decided.usd_per_useful_hour, decided.interval_seconds, decided.reason, slack, reserve
    )


def _decide(
    zones: Sequence[Zone],
    job: JobState,
    priced: list[tuple[float, bool, str, float]],
    od_usd: float,
    od_t: float,
    slack: float,
    reserve: float,
) -> Placement:
    if slack < reserve:
        return Placement(
            ON_DEMAND,
            od_usd,
            od_t,
            f"the deadline: {slack / 60:.0f} min of slack left, under the {reserve / 60:.0f} min spot needs in reserve",
        )
    if not priced:
        best_spot = min(
            (usd_per_useful_hour(z.name, z.spot_usd, preemption_rate(z), job, z.move_usd)[0] for z in zones),
            default=math.inf,
        )
        if od_usd < best_spot:
            return Placement(
                ON_DEMAND,
                od_usd,
                od_t,
                "no spot capacity, and on-demand is cheaper per useful hour than spot would be anyway",
            )
        # waiting burns slack one for one: keep what spot's expected waste on the work left will need
        rate = min((preemption_rate(z) for z in zones), default=0.0)
        u, _ = useful_share(rate, job)
        waste = job.work_left_seconds * (1.0 / u - 1.0) if u > 0 else math.inf
        if slack < reserve + WAIT_WASTE_MULTIPLE * waste:
            return Placement(
                ON_DEMAND,
                od_usd,
                od_t,
                f"no spot capacity, and the slack ({slack / 60:.0f} min) is "
                f"what spot's waste on the work left will need",
            )
        return Placement(WAIT, math.inf, od_t, "no spot capacity in any zone, and time to wait for it")
    cost, _, name, t = min(priced)
    t = deadline_interval(t, job)
    if od_usd < cost:
        return Placement(
            ON_DEMAND, od_usd, od_t, f"on-demand ${od_usd:.3f} per useful hour against spot's best ${cost:.3f} ({name})"
        )
    return Placement(name, cost, t, f"{name}: ${cost:.3f} per useful hour expected")
