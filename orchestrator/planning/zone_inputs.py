"""What ``planning.zone_order`` tells the placement policy: the job (``policy.placement.JobState``) and each zone
(``policy.placement.Zone``), gathered from the config, the price cache, the catalog and the job's ledger.
Nothing is decided here; the sources of each figure are in ``planning.zone_order``'s docstring."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from orchestrator.core.durations import parse_deadline
from orchestrator.money.egress import BYTES_PER_GB, egress_price, egress_usd
from orchestrator.money.prices import FetchedPrice, ago
from orchestrator.policy import placement as pl
from orchestrator.policy.history import (
    ZoneHistory,
    first_start,
    measured_cost_seconds,
    restart_seconds_measured,
    steady_seconds_per_step,
    zone_history,
)
from orchestrator.policy.interval import estimated_checkpoint_seconds
from orchestrator.policy.restart import restart_seconds
from orchestrator.records.ledger_record import LedgerRecord

UNKNOWN_WORK_SECONDS = 3600.0  # the work left when neither the job's pace nor the planner's estimate is known
_AWS_ZONE = re.compile(r"^([a-z]{2}(-[a-z]+)+-\d+)[a-z]$")  # us-east-1a -> us-east-1
_SUFFIXED_ZONE = re.compile(r"^(.+)-[a-z0-9]$")  # europe-west4-b -> europe-west4, eastus-1 -> eastus


@dataclass(frozen=True)
class JobFacts:
    """What the reasons name, beside the policy's inputs."""

    spot_usd: float  # the catalog's spot price of the allocation per hour
    spot_source: str
    on_demand_usd: float
    gpus: int  # GPUs the allocation bills (per-GPU prices x this)
    prior_per_hour: float
    moved_bytes: float  # what a start in another region than the bucket's downloads across regions
    bucket_region: Optional[str]
    cloud: str
    cooldown_seconds: float


@dataclass(frozen=True)
class ZoneInput:
    zone: pl.Zone
    region: Optional[str]
    price_source: str  # "fetched 12 min ago" | "the catalog's"
    history: ZoneHistory
    facts: JobFacts

    def describe(self, usd_per_useful_hour: float, job: pl.JobState) -> str:
        """One sentence: the price, the rate, the egress, the cooldown."""
        z, h = self.zone, self.history
        parts = [
            f"${z.spot_usd:.3f}/h spot ({self.price_source})",
            f"{pl.preemption_rate(z):.2f} preemptions/h expected ({h.preemptions} of the job's own in "
            f"{h.held_hours:.1f} h here, prior {self.facts.prior_per_hour:.2f}/h)",
        ]
        if z.move_usd > 0:
            src = egress_price(self.facts.cloud)
            parts.append(
                f"${z.move_usd:.2f} egress per start from the bucket's {self.facts.bucket_region} "
                f"({self.facts.moved_bytes / BYTES_PER_GB:.2f} GB at ${src.usd_per_gb}/GB, {src.source})"
            )
        if h.since_preempted_seconds is not None and h.since_preempted_seconds < job.cooldown_seconds:
            parts.append(
                f"preempted the job {h.since_preempted_seconds / 60:.0f} min ago (cooling down for "
                f"{job.cooldown_seconds / 60:.0f} min)"
            )
        return f"{z.name}: ${usd_per_useful_hour:.3f} per useful hour expected; " + ", ".join(parts)


def region_of(zone: str, prices: Sequence[FetchedPrice] = ()) -> Optional[str]:
    """The zone's region: the price cache's, else read from the name (AWS ``us-east-1a``, GCP ``us-central1-a``,
    Azure ``eastus-1``); None when the name says nothing."""
    for p in prices:
        if p.zone == zone:
            return p.region
    match = _AWS_ZONE.match(zone) or _SUFFIXED_ZONE.match(zone)
    return match.group(1) if match else None


def _compute(cfg: Any, spot: bool) -> Any:
    compute = cfg.compute
    if dataclasses.is_dataclass(compute):
        node: Any = compute
        return dataclasses.replace(node, spot=spot)
    from omegaconf import OmegaConf

    return OmegaConf.merge(compute, {"spot": spot})


def _model_config(cfg: Any) -> Optional[dict]:
    """The model's config.json from a builtin, a local folder or a shipped preset; never the hub (this runs before
    every attempt)."""
    from pathlib import Path

    from orchestrator.planning.model_shape import PRESETS_DIR, load_model_config

    name = str(cfg.model.name_or_path)
    try:
        if name.startswith("builtin:") or Path(name).expanduser().exists():
            return load_model_config(name, str(cfg.model.preset), model_cfg=cfg.model)
        preset = PRESETS_DIR / f"{cfg.model.preset}.json"
        return load_model_config(str(preset)) if preset.is_file() else None
    except Exception:  # noqa: BLE001 - a size unknown is counted as none
        return None


def _weights_bytes(cfg: Any, model_config: Optional[dict]) -> float:
    """Base weights a start downloads from the bucket: an ``s3://`` model's, else none (the hub, a local folder)."""
    if model_config is None or not str(cfg.model.name_or_path).startswith("s3://"):
        return 0.0
    from orchestrator.planning.memory import DTYPE_BYTES
    from orchestrator.planning.model_shape import count_parameters

    return float(count_parameters(model_config)["total"] * DTYPE_BYTES.get(str(cfg.model.dtype), 2))


def _work_left_seconds(cfg: Any, record: Optional[LedgerRecord], model_config: Optional[dict]) -> float:
    steps_left = max(0, int(cfg.train.max_steps) - (record.step if record else 0))
    pace = steady_seconds_per_step(record.attempts) if record else None
    if pace is not None:
        return steps_left * pace
    if model_config is not None:
        from orchestrator.planning.cost import estimate_cost

        try:
            hours = estimate_cost(cfg, None, model_config=model_config).hours
        except Exception:  # noqa: BLE001 - the planner's estimate is advice
            hours = None
        if hours:
            return hours * 3600.0 * steps_left / max(1, int(cfg.train.max_steps))
    return UNKNOWN_WORK_SECONDS


def _time_left(cfg: Any, record: Optional[LedgerRecord], now: float) -> Optional[float]:
    if not cfg.run.deadline:
        return None
    kind, value = parse_deadline(str(cfg.run.deadline))
    start = (first_start(record.attempts) if record else None) or now
    return (start + value if kind == "after" else value) - now


def job_inputs(
    cfg: Any, store: Any, record: Optional[LedgerRecord], now: float, *, cooldown: float
) -> tuple[pl.JobState, JobFacts]:
    """The job as the placement sees it before a (re)launch (holding nothing), and the facts its reasons name."""
    from orchestrator.money.cost import preemption_prior_per_hour, price_for
    from orchestrator.money.price_refresh import current_catalog

    catalog = current_catalog(cfg, refresh=False, store=store, now=now)[0]
    spot, on_demand = price_for(_compute(cfg, True), catalog), price_for(_compute(cfg, False), catalog)
    prior, _ = preemption_prior_per_hour(_compute(cfg, True), catalog)
    attempts = record.attempts if record else ()
    model_config = _model_config(cfg)
    ckpt = float(record.checkpoints[-1].size) if record and record.checkpoints else 0.0
    moved = ckpt + _weights_bytes(cfg, model_config)
    restart, _ = restart_seconds(
        override=cfg.compute.restart_seconds, measured=restart_seconds_measured(attempts), checkpoint_bytes=ckpt
    )
    cost = measured_cost_seconds(attempts) or estimated_checkpoint_seconds(ckpt)
    job = pl.JobState(
        work_left_seconds=_work_left_seconds(cfg, record, model_config),
        restart_seconds=restart,
        checkpoint_cost_seconds=cost,
        on_demand_usd=on_demand.usd_per_hour_total,
        time_left_seconds=_time_left(cfg, record, now),
        cooldown_seconds=cooldown,
    )
    facts = JobFacts(
        spot.usd_per_hour_total,
        spot.source,
        on_demand.usd_per_hour_total,
        max(1, spot.gpus),
        prior,
        moved,
        cfg.storage.region or None,
        str(spot.cloud),
        cooldown,
    )
    return job, facts


def zone_inputs(
    cfg: Any,
    names: Sequence[str],
    prices: Sequence[FetchedPrice],
    record: Optional[LedgerRecord],
    facts: JobFacts,
    now: float,
) -> list[ZoneInput]:
    """Each named zone: its price (fetched, else the catalog's), its history, its egress."""
    history = zone_history(record.attempts, now) if record else {}
    out = []
    for name in names:
        fetched = next((p for p in prices if p.zone == name), None)  # newest first
        usd = fetched.usd_per_gpu_hour * facts.gpus if fetched else facts.spot_usd
        source = f"fetched from {fetched.source} {ago(now - fetched.fetched_at)}" if fetched else "the catalog's"
        region = region_of(name, prices)
        cloud = fetched.cloud if fetched else facts.cloud
        seen = history.get(name, ZoneHistory())
        zone = pl.Zone(
            name,
            usd,
            True,
            facts.prior_per_hour,
            seen.held_hours,
            seen.preemptions,
            seen.since_preempted_seconds,
            move_usd=egress_usd(facts.moved_bytes, cloud, facts.bucket_region, region),
        )
        out.append(ZoneInput(zone, region, source, seen, facts))
    return out
