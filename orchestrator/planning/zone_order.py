"""``compute.zones``: the zones a job may run in, in the order the placement policy prefers them now.

A thin adapter: it gathers what is known of each zone and of the job, and ``orchestrator.policy.placement.choose``
decides. ``ranked_zones`` asks it for the best zone, takes that zone out, asks again, and so on: the order a
backend renders (SkyPilot's ``any_of``, a Kubernetes node affinity, Slurm partitions) and the local backend's
requeue loop uses (its first zone).

What each zone is given:

- price: the zone's newest fetched spot price (``orchestrator prices refresh``: ``<storage.uri>/_prices/catalog.json``,
  whatever its age) for the job's GPU type and cloud, per GPU x the job's GPUs; else the catalog's spot price
  (``money.price_refresh.current_catalog``, cached prices while fresh, else ``conf/pricing.yaml``);
- preemption rate: the catalog's prior (``money.cost.preemption_prior_per_hour``) blended with the job's own spot
  attempts in that zone (``policy.history.zone_history``: its preemptions and held hours there, from the ledger);
- the cooldown: a zone that preempted the job less than ``compute.zone_cooldown`` ago comes after every other;
- a start: the restart (``policy.restart.restart_seconds``: measured, else estimated) and, in a region other than
  the bucket's (``storage.region``), the egress of the newest checkpoint (its size in the ledger) and of base
  weights kept in the bucket (an ``s3://`` model), at the bucket's cloud's inter-region price
  (``money.egress``, its source named in the reason);
- ``run.deadline``: the work left (steps left x the job's measured seconds per step, else the planner's estimate)
  against the time left; when spot can no longer make it, every zone is ranked for on-demand (``capacity``).

``compute.zones=auto`` ranks every zone the price cache holds a spot price for (GPU type and cloud); with none,
one ConfigError says to run ``orchestrator prices refresh`` or to list the zones.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

from orchestrator.config.zones import AUTO, configured_zones, zone_cooldown_seconds
from orchestrator.core.errors import ConfigError
from orchestrator.money.prices import FetchedPrice, read_cache
from orchestrator.planning.zone_inputs import job_inputs, region_of, zone_inputs  # noqa: F401 - region_of: a caller's
from orchestrator.policy import placement as pl
from orchestrator.records.ledger_record import LedgerRecord

SPOT, ON_DEMAND = "spot", "on_demand"


@dataclass(frozen=True)
class RankedZone:
    """One zone, as the placement ranks it now."""

    zone: str
    region: Optional[str]
    usd_per_hour: float  # the job's whole allocation there, per hour (spot, or on-demand when ``capacity`` says)
    usd_per_useful_hour: float  # expected, restarts, lost work, checkpoints and the start's egress included
    reason: str  # one short sentence
    capacity: str = SPOT  # spot | on_demand (run.deadline: spot can no longer make it)


def zone_prices(cfg: Any, store: Any, now: float) -> list[FetchedPrice]:
    """The cache's spot prices per zone for the job's GPU type (and cloud unless ``compute.cloud=any``), newest
    first."""
    gpu, cloud = str(cfg.compute.gpu_type).lower(), str(cfg.compute.cloud).lower()
    found = [
        p
        for p in read_cache(store, now=now)
        if p.capacity == "spot" and p.zone and p.gpu_type.lower() == gpu and (cloud == "any" or p.cloud == cloud)
    ]
    return sorted(found, key=lambda p: -p.fetched_at)


def zone_names(cfg: Any, prices: Sequence[FetchedPrice]) -> tuple[str, ...]:
    """``compute.zones`` as names: the list, or (auto) every zone with a cached price; ConfigError when auto finds
    none."""
    zones = configured_zones(cfg.compute.zones)
    if zones != AUTO:
        return tuple(zones or ())
    names = tuple(sorted({str(p.zone) for p in prices}))
    if not names:
        raise ConfigError(
            f"compute.zones=auto found no fetched spot price for {cfg.compute.gpu_type} on {cfg.compute.cloud} in "
            f"{cfg.storage.uri}: run `orchestrator prices refresh --storage-uri {cfg.storage.uri}`, or list the "
            "zones (compute.zones=[us-east-1a,us-west-2b])."
        )
    return names


def ranked_zones(
    cfg: Any, store: Any, ledger_record: Optional[LedgerRecord] = None, now: Optional[float] = None
) -> list[RankedZone]:
    """``compute.zones`` best first (``policy.placement``); [] when it is unset. ``store``: the job's storage (the
    price cache); ``ledger_record``: the job's ledger, decoded (its attempts' zones steer the order; None: no
    history). Raises ConfigError (auto with no prices, a bad zone list)."""
    now = time.time() if now is None else now
    prices = zone_prices(cfg, store, now)
    names = zone_names(cfg, prices)
    if not names:
        return []
    job, facts = job_inputs(cfg, store, ledger_record, now, cooldown=zone_cooldown_seconds(cfg.compute.zone_cooldown))
    zones = zone_inputs(cfg, names, prices, ledger_record, facts, now)
    first = pl.choose([z.zone for z in zones], job)
    order = _order(zones, replace(job, on_demand_usd=math.inf, time_left_seconds=None))
    if first.zone == pl.ON_DEMAND:
        return [
            RankedZone(
                z.zone.name,
                z.region,
                facts.on_demand_usd,
                first.usd_per_useful_hour,
                f"on-demand: {first.reason}",
                ON_DEMAND,
            )
            for z in order
        ]
    return [
        RankedZone(z.zone.name, z.region, z.zone.spot_usd, cost, z.describe(cost, job))
        for z, cost in _costs(order, job)
    ]


def _order(zones: Sequence[Any], job: pl.JobState) -> list[Any]:
    """The zones in the placement's order: its choice, then its choice among the rest, ..."""
    left, out = list(zones), []
    while left:
        chosen = pl.choose([z.zone for z in left], job).zone
        pick = next((z for z in left if z.zone.name == chosen), left[0])
        out.append(pick)
        left.remove(pick)
    return out


def _costs(order: Sequence[Any], job: pl.JobState) -> list[tuple[Any, float]]:
    return [
        (z, pl.usd_per_useful_hour(z.zone.name, z.zone.spot_usd, pl.preemption_rate(z.zone), job, z.zone.move_usd)[0])
        for z in order
    ]
