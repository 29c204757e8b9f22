"""The price catalog and the cost meter.

``load_catalog`` reads ``conf/pricing.yaml`` (or ``$ORCH_PRICING_FILE``);
``price_for`` turns a ``compute`` config into a :class:`Price`; a
:class:`CostMeter` says what the running attempt has cost so far. The summary
helpers at the bottom are pure arithmetic over numbers the ledger and the
trainer already hold, so the report, the budget guard and the tests share them.

Nothing here talks to storage, MLflow or the trainer.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

import yaml

from orchestrator.core.gpus import (  # CPU_TYPES: gpu_type values that mean "no GPU" (priced per node)
    CPU_TYPES,
    gpu_memory_gb,
)

PRICING_FILE_ENV = "ORCH_PRICING_FILE"
SECONDS_PER_HOUR = 3600.0

ANY_CLOUD = "any"


def default_catalog_path() -> Path:
    """``$ORCH_PRICING_FILE`` if set, else ``<repo>/conf/pricing.yaml`` (never the working dir)."""
    override = os.environ.get(PRICING_FILE_ENV)
    if override:
        return Path(override).expanduser()
    import orchestrator

    return Path(orchestrator.__file__).resolve().parents[1] / "conf" / "pricing.yaml"


def load_catalog(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """Read a price catalog: ``{gpu_type: {memory_gb, clouds: {cloud: {on_demand, spot}}}}``.

    Raises FileNotFoundError / ValueError with the path and the fix when the
    file is missing or not a catalog.
    """
    catalog_path = Path(path) if path is not None else default_catalog_path()
    if not catalog_path.is_file():
        raise FileNotFoundError(
            f"price catalog {catalog_path} does not exist. Point {PRICING_FILE_ENV} at a catalog "
            "laid out like conf/pricing.yaml, or set compute.price_per_hour."
        )
    data = yaml.safe_load(catalog_path.read_text())
    if not isinstance(data, dict) or not all(isinstance(v, dict) and "clouds" in v for v in data.values()):
        raise ValueError(
            f"{catalog_path} is not a price catalog: every top-level key must be a GPU type "
            "with a `clouds:` mapping (see conf/pricing.yaml)."
        )
    return data


@dataclass(frozen=True)
class Price:
    """What the whole allocation (all nodes, all GPUs) costs per hour.

    ``usd_per_gpu_hour`` is the per-unit price (per node-hour for CPU jobs);
    ``on_demand_usd_per_hour_total`` is the same allocation at on-demand prices,
    the baseline for spot savings. ``gpus`` is 0 for CPU jobs.
    """

    usd_per_hour_total: float
    usd_per_gpu_hour: float
    on_demand_usd_per_hour_total: float
    source: str
    gpus: int = 0
    cloud: str = ANY_CLOUD
    spot: bool = False

    @property
    def usd_per_second(self) -> float:
        """The whole allocation's price per second: what every meter, hold and reservation charges time at."""
        return self.usd_per_hour_total / SECONDS_PER_HOUR


def _cheapest_cloud(clouds: Mapping[str, Any], mode: str) -> str:
    offered = {name: entry[mode]["usd"] for name, entry in clouds.items() if mode in entry}
    return min(offered, key=offered.__getitem__)


def price_for(compute_cfg: Any, catalog: Mapping[str, Any]) -> Price:
    """Price a ``compute`` config (see ``orchestrator.config.schema.ComputeConfig``).

    total = per-unit price x gpus_per_node x nodes (CPU jobs: per-node price x nodes).
    ``compute.price_per_hour`` replaces the per-unit price and may name a GPU type
    the catalog lacks (its on-demand baseline is then the override itself); on an
    on-demand job it is the on-demand baseline too (the catalog's list price is not
    what that job pays, nor what it would pay on demand).
    ``cloud: any`` takes the cheapest cloud the catalog lists for that mode.

    Raises ValueError for an unknown gpu_type (listing the known ones) or a cloud
    that does not offer it (listing the ones that do).
    """
    gpu_type = str(compute_cfg.gpu_type).lower()
    nodes = int(compute_cfg.nodes)
    gpus_per_node = int(compute_cfg.gpus_per_node)
    spot = bool(compute_cfg.spot)
    cloud = str(compute_cfg.cloud).lower()
    override = compute_cfg.price_per_hour

    is_cpu = gpu_type in CPU_TYPES or gpus_per_node == 0
    key = "cpu" if is_cpu else gpu_type
    # CPU jobs are priced per node; GPU jobs per GPU.
    units = nodes if is_cpu else gpus_per_node * nodes
    gpus = 0 if is_cpu else units
    mode = "spot" if spot else "on_demand"

    entry = catalog.get(key)
    if entry is None:
        if override is not None:
            per_unit = float(override)
            return Price(
                per_unit * units, per_unit, per_unit * units, "compute.price_per_hour override", gpus, cloud, spot
            )
        known = ", ".join(sorted(catalog))
        raise ValueError(
            f"compute.gpu_type={gpu_type!r} is not in the price catalog (known: {known}). "
            f"Use one of those, add it to conf/pricing.yaml (or ${PRICING_FILE_ENV}), "
            "or set compute.price_per_hour=<USD per GPU-hour>."
        )

    clouds = entry["clouds"]
    if cloud == ANY_CLOUD or (is_cpu and cloud not in clouds):
        cloud = _cheapest_cloud(clouds, mode)
    elif cloud not in clouds:
        raise ValueError(
            f"compute.cloud={cloud!r} has no price for {key!r} in the catalog (listed: "
            f"{', '.join(sorted(clouds))}). Pick one of those, cloud=any, or set compute.price_per_hour."
        )
    figures = clouds[cloud]
    on_demand_per_unit = float(figures["on_demand"]["usd"])
    if override is not None:
        per_unit = float(override)
        source = "compute.price_per_hour override"
        if not spot:  # an on-demand job's override is its on-demand price: the catalog's is not what it pays
            on_demand_per_unit = per_unit
    else:
        quoted = figures.get(mode) or figures["on_demand"]
        per_unit = float(quoted["usd"])
        source = f"{quoted.get('source', 'catalog')} (as of {quoted.get('as_of', '?')})"
    return Price(per_unit * units, per_unit, on_demand_per_unit * units, source, gpus, cloud, spot)


# Spot preemptions per hour of held capacity when neither the catalog's spot entry (`preemptions_per_hour`)
# nor compute.preemptions_per_hour says: the median over the 13 public 1x V100 AWS traces in data/spot-traces/
# (the 9 zones of availability/1-node/aws-02-15-2023 and the 4 of preemption/1-node/aws-04-22-2023), each read
# with its declared convention (1 = available): `available -> not` edges per available hour, 0.10-1.39 per zone,
# median 0.439. Measured with (docs/spot-economics.md):
#   python -c "import statistics as s; from orchestrator.planning.spot_traces import load_traces as L; print(s.median(
#   t.preemptions_per_available_hour for d in ('availability/1-node/aws-02-15-2023', 'preemption/1-node/aws-04-22-2023')
#   for t in L('data/spot-traces/' + d)))"
# (0.64 before issue 43 was the same median with every trace read upside down, 0 = available.)
DEFAULT_SPOT_PREEMPTIONS_PER_HOUR = 0.44


def preemption_prior_per_hour(compute_cfg: Any, catalog: Mapping[str, Any]) -> tuple[float, str]:
    """The prior rate of preemptions for a ``compute`` config, and where it came from.

    ``compute.preemptions_per_hour`` wins (the whole job's rate, like its ledger's attempts); on-demand capacity
    is taken as never preempted; else the catalog's spot entry for the GPU type and cloud (``spot: {usd: ...,
    preemptions_per_hour: ...}``), else the traces' median: one machine's rate, times ``compute.nodes``.
    """
    override = compute_cfg.preemptions_per_hour
    if override is not None:
        return float(override), "compute.preemptions_per_hour"
    if not bool(compute_cfg.spot):
        return 0.0, "on-demand"
    gpu_type = str(compute_cfg.gpu_type).lower()
    clouds = (catalog.get("cpu" if gpu_type in CPU_TYPES else gpu_type) or {}).get("clouds", {})
    cloud = str(compute_cfg.cloud).lower()
    entries = [clouds[cloud]] if cloud in clouds else list(clouds.values())
    rates = [float(e["spot"]["preemptions_per_hour"]) for e in entries if "preemptions_per_hour" in e.get("spot", {})]
    if rates:
        rate, source = min(rates) if cloud not in clouds else rates[0], "price catalog"
    else:
        rate, source = DEFAULT_SPOT_PREEMPTIONS_PER_HOUR, "median of the public V100 spot traces"
    nodes = int(compute_cfg.nodes)  # at least 1: checked at launch
    if nodes == 1:
        return rate, source
    # a node's rate: the preemption of any one of the job's nodes ends the attempt of all of them
    return rate * nodes, f"{source}, x {nodes} nodes (any one's preemption ends the attempt)"


class CostMeter:
    """Cost of the current attempt so far: wall seconds since it started x price.

    The clock starts when the attempt starts, so set-up, download and restore
    are paid for too -- they are on the bill. ``clock`` is injectable for tests.
    """

    def __init__(self, price: Price, *, started_at: Optional[float] = None, clock: Callable[[], float] = time.time):
        self.price = price
        self._clock = clock
        self.started_at = clock() if started_at is None else float(started_at)

    def attempt_seconds(self) -> float:
        return max(0.0, self._clock() - self.started_at)

    def attempt_cost_usd(self) -> float:
        return self.attempt_seconds() / SECONDS_PER_HOUR * self.price.usd_per_hour_total

    def cost_usd(self, seconds: Optional[float]) -> Optional[float]:
        """What ``seconds`` of this allocation cost (None stays None)."""
        return None if seconds is None else seconds / SECONDS_PER_HOUR * self.price.usd_per_hour_total

    def gpu_hours(self) -> float:
        return self.attempt_seconds() / SECONDS_PER_HOUR * self.price.gpus

    def on_demand_cost_usd(self) -> float:
        """What this attempt would have cost at on-demand prices."""
        return self.attempt_seconds() / SECONDS_PER_HOUR * self.price.on_demand_usd_per_hour_total


# ---- summary helpers: pure arithmetic, None where the ratio has no meaning ----


def usd_per_million_tokens(cost_usd: float, tokens: int) -> Optional[float]:
    return cost_usd / tokens * 1e6 if tokens > 0 else None


def usd_per_step(cost_usd: float, steps: int) -> Optional[float]:
    return cost_usd / steps if steps > 0 else None


def spot_savings_usd(on_demand_cost_usd: float, actual_cost_usd: float) -> float:
    """Money saved against an on-demand baseline (negative if spot cost more)."""
    return on_demand_cost_usd - actual_cost_usd


def uninterrupted_on_demand_usd(
    *, attempt_seconds: float, step_at_start: int, seconds_per_step: Optional[float], on_demand_usd_per_hour: float
) -> Optional[float]:
    """What one uninterrupted on-demand run to the current step would have cost: the spot baseline.

    seconds = this attempt's wall time + step_at_start x seconds_per_step, at the on-demand rate.

    This attempt stands for the one start-up (and its checkpoints and end) such a run pays; the
    steps earlier attempts made, up to the checkpoint this one restored, are charged once at the
    steady step time. Restarts, lost work, back-off and earlier start-ups are not in it, so a
    job whose interruptions cost more than the spot discount saved shows negative savings.

    Args:
        attempt_seconds: the current attempt's wall seconds so far.
        step_at_start: the step it restored (0 for a fresh job: the attempt is the whole run).
        seconds_per_step: the steady step time (None: unknown).
        on_demand_usd_per_hour: the whole allocation at on-demand prices.

    Returns None when earlier steps exist but no step time is known yet.
    """
    prior_seconds = 0.0
    if step_at_start > 0:
        if not seconds_per_step:
            return None
        prior_seconds = step_at_start * seconds_per_step
    return (attempt_seconds + prior_seconds) / SECONDS_PER_HOUR * on_demand_usd_per_hour


@dataclass(frozen=True)
class LostWork:
    """Training redone because an interruption came after the last checkpoint."""

    steps: int
    seconds: float
    usd: float


def lost_work(attempts: Iterable[Mapping[str, Any]], *, seconds_per_step: float, usd_per_hour: float) -> LostWork:
    """Steps computed twice across attempts, and their time and money.

    Each attempt is a mapping with ``checkpoint_step_at_start`` (the step it
    restored; falls back to ``step_start``, then 0) and ``step_end`` (the last
    step it reached; None when it vanished without saying, taken as no
    progress). An attempt redoes the steps between its restore point and the
    furthest step any earlier attempt had reached, up to where it got itself.
    Attempts must be in the order they ran.
    """
    furthest = 0
    redone = 0
    for attempt in attempts:
        start = attempt.get("checkpoint_step_at_start")
        if start is None:
            start = attempt.get("step_start") or 0
        end = attempt.get("step_end")
        end = start if end is None else end
        redone += max(0, min(end, furthest) - start)
        furthest = max(furthest, end)
    seconds = redone * seconds_per_step
    return LostWork(redone, seconds, seconds / SECONDS_PER_HOUR * usd_per_hour)


def bigger_gpus(cfg: Any, limit: int = 3) -> list[str]:
    """Catalog GPU types with more memory per device than ``cfg``'s, smallest first (best effort: advice for an
    out-of-memory stop, ``orchestrator.core.errors.out_of_memory_fix``)."""
    try:
        catalog = load_catalog()
        current = str(cfg.compute.gpu_type).lower()
        have = float(cfg.compute.memory_gb) if cfg.compute.memory_gb else gpu_memory_gb(current, catalog)
        sizes = []
        for gpu_type in catalog:
            memory = gpu_memory_gb(gpu_type, catalog)
            if memory is None or str(gpu_type).lower() in CPU_TYPES:
                continue
            if have is None or memory > have:
                sizes.append((memory, str(gpu_type)))
        return [f"{name} {memory:g} GB" for memory, name in sorted(sizes)[:limit]]
    except Exception:  # noqa: BLE001 - advice only
        return []
