"""``orchestrator simulate --zones``: one job over the time-aligned traces of several zones, placed by a policy.

The traces of a set (``data/spot-traces/availability/1-node/aws-02-15-2023``: 9 zones, the same 195 s ticks from
the same instant) are read as a grid of zones x ticks. A job of ``work`` seconds is started at many points
(windows) and run tick by tick through one of:

- ``placement`` (``policy.placement.choose``): at every tick, the zone of least expected dollars per useful hour
  from what the job has seen (its own preemptions and held hours in each zone, and every zone's capacity it
  watched from its start: hours up and losses; blended with the prior), a zone
  that just preempted it avoided for the cooldown, on-demand when the deadline needs it;
- ``single-zone``: the same policy held to one zone (spot there, or on-demand), averaged over the zones; the
  best single zone is reported too (a choice only hindsight makes);
- ``oracle``: the hindsight-optimal schedule, a dynamic program over (tick, zone, progress in ticks) that knows
  every zone's future: a move (any start) loses one tick, paid; nothing else is lost (it leaves before a
  preemption); on-demand (the cheapest) is always there; the deadline is never missed (with no deadline, it
  looks among finishes within twice the work). The physical limit.

The replay's model (seconds, as ``planning.simulate``): a start costs the restart (plus the transfer of the
checkpoint when it lies in another zone, plus a checkpoint when it leaves capacity it trains on); a checkpoint
after every interval of training (Young/Daly at the zone's estimated rate) costs ``checkpoint_cost`` and commits
the work before it; a preemption loses the work since the last commit; waiting costs nothing. Prices: each
zone's own per-tick or flat price from its trace's metadata, else the catalog's (``--spot-price``).
``cost_vs_on_demand`` is against the whole job on on-demand in the cheapest zone (one start, checkpoints hourly).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, cast

from orchestrator.planning.spot_traces import Trace
from orchestrator.policy import placement as pl

ZONE_POLICIES = ("placement", "single-zone", "oracle")
SINGLE_ZONE_REVIEW_TICKS = 5  # held to one zone, holding capacity, far from the deadline: decide every 5 ticks


@dataclass(frozen=True)
class ZoneJob:
    work_seconds: float
    deadline_seconds: Optional[float] = None
    restart_seconds: float = 360.0
    transfer_seconds: float = 60.0
    checkpoint_cost_seconds: float = 30.0
    notice_share: float = 0.0
    prior_per_hour: float = 0.44
    cooldown_seconds: float = pl.DEFAULT_COOLDOWN_SECONDS
    restart_schedule: tuple[float, ...] = ()  # measured restarts of starts 1, 2, ... (a replay); then restart_seconds


@dataclass
class ZoneGrid:
    """Zones x ticks, aligned: ``available[z][i]``, ``spot_usd[z][i]`` per hour, one on-demand price per zone."""

    names: list[str]
    gap_seconds: float
    available: list[list[bool]]
    spot_usd: list[list[float]]
    on_demand_usd: list[float]

    @property
    def ticks(self) -> int:
        return len(self.available[0])

    @property
    def cheapest_on_demand(self) -> float:
        return min(self.on_demand_usd)


def zone_grid(traces: Sequence[Trace], spot_usd: float, on_demand_usd: float) -> ZoneGrid:
    """The traces as one grid; they must share a tick (the first ``min(length)`` ticks of each are used)."""
    if not traces:
        raise ValueError("no traces to place a job over")
    gaps = {t.gap_seconds for t in traces}
    if len(gaps) != 1:
        raise ValueError(
            f"--zones needs time-aligned traces with one tick length; these have {sorted(gaps)} s: "
            "point --traces at one set's folder (e.g. data/spot-traces/availability/1-node/"
            "aws-02-15-2023)."
        )
    n = min(t.ticks for t in traces)
    flags = [t.available_ticks()[:n] for t in traces]
    prices = [
        list(t.prices[:n]) if t.prices else [t.spot_usd if t.spot_usd is not None else spot_usd] * n for t in traces
    ]
    od = [t.on_demand_usd if t.on_demand_usd is not None else on_demand_usd for t in traces]
    names = [Path(t.name).stem for t in traces]
    return ZoneGrid(names, traces[0].gap_seconds, flags, prices, od)


def window_starts(ticks: int, windows: int) -> list[int]:
    step = max(1, ticks // max(1, windows))
    return list(range(0, ticks, step))[:windows]


@dataclass
class ZoneOutcome:
    finished_at: Optional[float]  # seconds from the start (None: never within the horizon)
    paid_seconds: float
    cost_usd: float
    preemptions: int = 0
    moves: int = 0
    on_demand_seconds: float = 0.0
    lost_seconds: float = 0.0


class _Replay:
    """One job from tick ``start`` of ``grid``, placed by ``policy.placement`` over the zones ``allowed``."""

    def __init__(self, grid: ZoneGrid, job: ZoneJob, start: int, allowed: Sequence[int]):
        self.g, self.job, self.start, self.allowed = grid, job, start, list(allowed)
        self.zone: Optional[int | str] = None  # a zone's index, pl.ON_DEMAND, or None (holding nothing)
        self.restart_left = self.ckpt_left = 0.0
        self.done = self.committed = self.pending = self.since = 0.0
        self.interval = pl.MAX_INTERVAL_SECONDS
        self.ckpt_zone: Optional[int | str] = None
        self.held = [0.0] * len(grid.names)
        self.hits = [0] * len(grid.names)
        self.last_hit: list[Optional[float]] = [None] * len(grid.names)
        self.starts = 0  # starts so far (each takes the next of restart_schedule)
        self.was_up = [False] * len(grid.names)  # each zone's capacity at the tick before, as watched
        self.seen_hours = [0.0] * len(grid.names)
        self.seen_losses = [0] * len(grid.names)
        self.out = ZoneOutcome(None, 0.0, 0.0)
        self.review_at = 0  # single zone: the tick of the next decision while the zone held stays up

    def _name(self, zone) -> Optional[str]:
        return self.g.names[zone] if isinstance(zone, int) else zone

    def _restart(self) -> float:
        """The next start's restart: the replay's measured one, else the job's."""
        n, schedule = self.starts, self.job.restart_schedule
        return schedule[n] if n < len(schedule) else self.job.restart_seconds

    def _state(self, now: float) -> pl.JobState:
        job = self.job
        return pl.JobState(
            work_left_seconds=job.work_seconds - self.done,
            restart_seconds=self._restart(),
            transfer_seconds=job.transfer_seconds,
            checkpoint_cost_seconds=job.checkpoint_cost_seconds,
            notice_share=job.notice_share,
            on_demand_usd=self.g.cheapest_on_demand,
            time_left_seconds=None if job.deadline_seconds is None else job.deadline_seconds - now,
            current=self._name(self.zone),
            checkpoint_zone=self._name(self.ckpt_zone),
            training=self.zone is not None and self.restart_left <= 0,
            at_risk_seconds=self.done - self.committed if isinstance(self.zone, int) else 0.0,
            decision_seconds=self.g.gap_seconds,
            cooldown_seconds=job.cooldown_seconds,
        )

    def _decide(self, i: int, now: float) -> None:
        zones = [
            pl.Zone(
                self.g.names[z],
                self.g.spot_usd[z][i],
                self.g.available[z][i],
                self.job.prior_per_hour,
                self.held[z] / 3600.0,
                self.hits[z],
                None if self.last_hit[z] is None else now - cast(float, self.last_hit[z]),
                seen_hours=self.seen_hours[z],
                seen_losses=self.seen_losses[z],
            )
            for z in self.allowed
        ]
        state = self._state(now)
        choice = pl.choose(zones, state)
        if len(self.allowed) == 1:  # nothing to compare: decide again at an event, before the deadline's margin
            # (which shrinks by at most two ticks a tick: one of time, one more at risk) could be crossed, and at
            # least every SINGLE_ZONE_REVIEW_TICKS (on-demand is safe to stay on that long)
            margin = (choice.slack_seconds - choice.reserve_seconds) / (2 * self.g.gap_seconds)
            self.review_at = int(now / self.g.gap_seconds) + max(1, int(min(SINGLE_ZONE_REVIEW_TICKS, margin)))
        self._go(choice.zone, choice.interval_seconds, state)

    def _go(self, zone: str, interval: float, state: pl.JobState) -> None:
        """Stay (at ``interval``), wait, or start in ``zone`` (a move when the job holds capacity)."""
        if zone == state.current:
            self.interval = interval
        if zone == pl.WAIT or zone == state.current:
            return
        target = pl.ON_DEMAND if zone == pl.ON_DEMAND else self.g.names.index(zone)
        self.restart_left = pl.move_seconds(zone, state)
        if state.training:  # the move's checkpoint commits the work done
            self.committed = self.pending = self.done
            self.ckpt_left = 0.0
        self.out.moves += self.zone is not None
        self.starts += 1
        self.zone, self.ckpt_zone, self.interval, self.since = target, target, interval, 0.0

    def _watch(self, i: int) -> None:
        """What the job sees at this tick of the zones it does not hold: their capacity's hours up and losses
        since the tick before (the one it holds counts as its own held hours and preemptions)."""
        for z in self.allowed:
            up = self.g.available[z][i]
            if self.was_up[z] and self.zone != z:
                self.seen_hours[z] += self.g.gap_seconds / 3600.0
                self.seen_losses[z] += not up
            self.was_up[z] = up

    def _preempted(self, now: float) -> None:
        z, n, share = cast(int, self.zone), self.out.preemptions, self.job.notice_share  # a zone: on spot
        self.out.preemptions += 1
        self.hits[z] += 1
        self.last_hit[z] = now
        if math.floor((n + 1) * share) > math.floor(n * share) and self.restart_left <= 0:
            self.committed = self.done  # an honoured notice: the emergency checkpoint saves the work
        self.out.lost_seconds += self.done - self.committed
        self.done, self.since, self.ckpt_left = self.committed, 0.0, 0.0
        self.zone = None

    def _train(self, seconds: float) -> float:
        """Run ``seconds`` on held capacity; the seconds used (less when the job finishes)."""
        job, used, eps = self.job, 0.0, 1e-9
        x = min(self.restart_left, seconds)
        self.restart_left -= x
        used += x
        while seconds - used > eps and self.done < job.work_seconds - eps:
            if self.ckpt_left > 0:
                x = min(self.ckpt_left, seconds - used)
                self.ckpt_left -= x
                if self.ckpt_left <= eps:
                    self.ckpt_left, self.committed = 0.0, self.pending
            else:
                x = min(seconds - used, self.interval - self.since, job.work_seconds - self.done)
                self.done += x
                self.since += x
                if self.since >= self.interval - eps and self.done < job.work_seconds - eps:
                    self.ckpt_left, self.pending, self.since = job.checkpoint_cost_seconds, self.done, 0.0
                    if self.ckpt_left <= eps:  # a checkpoint that costs nothing commits at once
                        self.ckpt_left, self.committed = 0.0, self.pending
            used += x
        return used

    def run(self) -> ZoneOutcome:
        g, job, out = self.g, self.job, self.out
        for k in range(g.ticks):
            i, now = (self.start + k) % g.ticks, k * g.gap_seconds
            self._watch(i)
            if isinstance(self.zone, int) and not g.available[self.zone][i]:
                self._preempted(now)
            if self.zone is None or k >= self.review_at:
                self._decide(i, now)
            if self.zone is None:
                continue
            used = self._train(g.gap_seconds)
            usd = g.cheapest_on_demand if self.zone == pl.ON_DEMAND else g.spot_usd[cast(int, self.zone)][i]
            out.paid_seconds += used
            out.cost_usd += used * usd / 3600.0
            if self.zone == pl.ON_DEMAND:
                out.on_demand_seconds += used
            else:
                self.held[cast(int, self.zone)] += used
            if self.done >= job.work_seconds - 1e-9:
                out.finished_at = now + used
                break
        return out


class _Scheduled(_Replay):
    """The same model on a given schedule: ``(tick, zone, interval)`` starts (a real replay's), no policy."""

    def __init__(self, grid: ZoneGrid, job: ZoneJob, start: int, schedule: Sequence[tuple[int, str, float]]):
        super().__init__(grid, job, start, range(len(grid.names)))
        self.schedule = sorted(schedule)

    def _decide(self, i: int, now: float) -> None:
        k = int(round(now / self.g.gap_seconds))
        while self.schedule and self.schedule[0][0] <= k:
            _, zone, interval = self.schedule.pop(0)
            self._go(zone, interval, self._state(now))


def replay_schedule(
    grid: ZoneGrid, job: ZoneJob, start: int, schedule: Sequence[tuple[int, str, float]]
) -> ZoneOutcome:
    """The job from tick ``start`` started where and when ``schedule`` says (ticks from ``start``, a zone's name
    or ``policy.placement.ON_DEMAND``, the checkpoint interval in seconds), preempted as the traces say."""
    return _Scheduled(grid, job, start, schedule).run()


def replay(grid: ZoneGrid, job: ZoneJob, start: int, allowed: Optional[Sequence[int]] = None) -> ZoneOutcome:
    """``placement`` over ``allowed`` zones (default: all) from tick ``start``."""
    return _Replay(grid, job, start, range(len(grid.names)) if allowed is None else allowed).run()


def oracle(grid: ZoneGrid, job: ZoneJob, starts: Sequence[int]) -> list[ZoneOutcome]:
    """The hindsight-optimal cost of each window: a dynamic program over (tick, zone, progress), all the windows
    at once. Progress is kept as the lag d = ticks elapsed - ticks trained (a finish by the deadline allows
    ``horizon - need`` of them): ``hold[w, z, d]`` is the least cost of training in zone z (the last one is
    on-demand), ``idle[w, d]`` of holding nothing. A tick in a zone is paid; a move (any start) trains nothing."""
    import numpy as np

    gap, zones, w = grid.gap_seconds, len(grid.names), len(starts)
    need = int(math.ceil(job.work_seconds / gap - 1e-9))
    # no deadline: the optimum is looked for among finishes within twice the work (or the trace's length)
    horizon = min(grid.ticks, 2 * need + 1) if job.deadline_seconds is None else int(job.deadline_seconds // gap)
    if horizon < need + 1:
        raise ValueError(f"the deadline leaves {horizon} ticks of {gap:g} s for {need} ticks of work and a start")
    lags = horizon - need + 1
    up = np.vstack([np.array(grid.available, dtype=bool), np.ones((1, grid.ticks), dtype=bool)])  # (Z+1, N)
    usd = np.vstack([np.array(grid.spot_usd, dtype=float), np.full((1, grid.ticks), grid.cheapest_on_demand)])
    hold = np.full((w, zones + 1, lags), np.inf)
    held = np.zeros_like(hold)  # paid ticks along each state's cheapest path
    idle = np.full((w, lags), np.inf)
    idle[:, 0] = 0.0
    idle_paid = np.zeros_like(idle)
    best, best_paid, best_at, rows = np.full(w, np.inf), np.zeros(w), np.zeros(w), np.arange(w)
    for k in range(horizon):
        cols = (np.asarray(starts) + k) % grid.ticks
        cost = (usd[:, cols] * gap / 3600.0).T[:, :, None]  # (W, Z+1, 1)
        pick = hold.argmin(axis=1)[:, None, :]
        least = np.take_along_axis(hold, pick, axis=1)[:, 0, :]
        from_idle = idle <= least
        rest = np.where(from_idle, idle, least)  # (W, lags): holding nothing, or any zone, before this tick
        rest_paid = np.where(from_idle, idle_paid, np.take_along_axis(held, pick, axis=1)[:, 0, :])
        enter = np.full_like(hold, np.inf)  # a start: this tick is paid and trains nothing (the lag grows)
        enter[:, :, 1:] = rest[:, None, :-1] + cost
        enter_paid = np.zeros_like(held)
        enter_paid[:, :, 1:] = rest_paid[:, None, :-1] + 1
        stay = hold + cost
        take_stay = stay <= enter
        hold = np.where(take_stay, stay, enter)
        held = np.where(take_stay, held + 1, enter_paid)
        hold[~up[:, cols].T] = np.inf
        idle, idle_paid = np.full_like(idle, np.inf), np.zeros_like(idle_paid)
        idle[:, 1:], idle_paid[:, 1:] = rest[:, :-1], rest_paid[:, :-1]
        lag = k + 1 - need  # the states that have just trained their last tick
        if 0 <= lag < lags:
            pick1 = hold[:, :, lag].argmin(axis=1)
            finish = hold[rows, pick1, lag]
            better = finish < best
            best = np.where(better, finish, best)
            best_paid = np.where(better, held[rows, pick1, lag], best_paid)
            best_at = np.where(better, (k + 1) * gap, best_at)
    return [
        ZoneOutcome(float(t) if math.isfinite(c) else None, p * gap, c, moves=max(0, int(round(p)) - need - 1))
        for c, p, t in zip(best, best_paid, best_at)
    ]


def on_demand_baseline_usd(grid: ZoneGrid, job: ZoneJob) -> float:
    """The whole job on on-demand in the cheapest zone: one start, a checkpoint every hour of training."""
    checkpoints = max(0, math.ceil(job.work_seconds / pl.MAX_INTERVAL_SECONDS) - 1)
    paid = job.restart_seconds + job.work_seconds + checkpoints * job.checkpoint_cost_seconds
    return paid * grid.cheapest_on_demand / 3600.0


def summary(policy: str, grid: ZoneGrid, job: ZoneJob, outcomes: Sequence[ZoneOutcome]) -> dict:
    """``{"policy", "windows", "deadline_misses", "cost_vs_on_demand", "goodput", ...}`` over the outcomes."""
    base = on_demand_baseline_usd(grid, job)
    due = job.deadline_seconds if job.deadline_seconds is not None else math.inf
    misses = sum(1 for o in outcomes if o.finished_at is None or o.finished_at > due + 1e-6)
    paid = sum(o.paid_seconds for o in outcomes)
    finished = sum(1 for o in outcomes if o.finished_at is not None)
    return {
        "policy": policy,
        "windows": len(outcomes),
        "deadline_misses": misses,
        "cost_vs_on_demand": round(statistics.fmean(o.cost_usd for o in outcomes) / base, 4),
        "goodput": round(finished * job.work_seconds / paid, 4) if paid else 0.0,
        "usd": round(statistics.fmean(o.cost_usd for o in outcomes), 2),
        "preemptions": round(statistics.fmean(o.preemptions for o in outcomes), 2),
        "moves": round(statistics.fmean(o.moves for o in outcomes), 2),
        "on_demand_hours": round(statistics.fmean(o.on_demand_seconds for o in outcomes) / 3600, 2),
        "lost_work_hours": round(statistics.fmean(o.lost_seconds for o in outcomes) / 3600, 3),
    }


def simulate_zones(grid: ZoneGrid, job: ZoneJob, policies: Sequence[str], windows: int = 40) -> list[dict]:
    """Each policy over the same ``windows`` start ticks; ``single-zone`` over every zone of the grid (its
    ``windows`` counts zones x windows), with each zone's figure and the best; ``vs_oracle`` when it ran."""
    starts = window_starts(grid.ticks, windows)
    rows = []
    for policy in policies:
        if policy == "placement":
            rows.append(summary(policy, grid, job, [replay(grid, job, s) for s in starts]))
        elif policy == "oracle":
            rows.append(summary(policy, grid, job, oracle(grid, job, starts)))
        elif policy == "single-zone":
            per_zone = {name: [replay(grid, job, s, [z]) for s in starts] for z, name in enumerate(grid.names)}
            row = summary(policy, grid, job, [o for runs in per_zone.values() for o in runs])
            zones = {name: summary(name, grid, job, runs) for name, runs in per_zone.items()}
            best = min(zones.values(), key=lambda r: r["cost_vs_on_demand"])
            row.update(
                zones={k: v["cost_vs_on_demand"] for k, v in zones.items()},
                best_zone=best["policy"],
                best_zone_cost_vs_on_demand=best["cost_vs_on_demand"],
                best_zone_deadline_misses=best["deadline_misses"],
            )
            rows.append(row)
        else:
            raise ValueError(f"unknown zone policy {policy!r}; choose from {', '.join(ZONE_POLICIES)}")
    limit = next((r["cost_vs_on_demand"] for r in rows if r["policy"] == "oracle"), None)
    for r in rows:
        if limit:
            r["vs_oracle"] = round(r["cost_vs_on_demand"] / limit, 4)
    return rows
