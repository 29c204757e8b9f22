"""The plan's price of interruptions: spot against on-demand on each GPU type that fits, and which to take.

For each GPU type and capacity, from the job's work (``plan_cost.estimate_cost``'s hours) and the same policy
functions the runner uses:

- preemptions per hour: on-demand none (``compute.preemptions_per_hour`` for a job that runs on-demand); spot
  the prior (``cost.preemption_prior_per_hour``: catalog, else the traces' median) blended with the job's own
  attempts (``policy.interval.estimate_preemptions``), or ``compute.preemptions_per_hour``;
- restart seconds (``policy.restart.restart_seconds``): ``compute.restart_seconds``, else the median measured
  in the job's attempts, else an estimate from the model's and the checkpoint's sizes;
- the checkpoint cost (``policy.interval.estimated_checkpoint_seconds`` of the checkpoint's bytes, the estimate
  the attempt's schedule starts from) and interval (the configured one, or ``auto``'s Young/Daly);
- the waste share f (``policy.interval.expected_waste_fraction``: checkpoints, half an interval lost per hard
  kill, a restart per preemption); paid hours = (work + the first start) / (1 - f).

On N nodes the prior is N times a machine's (any one's preemption ends the attempt) and the price is the
whole allocation's; ``plan_nodes`` finds from how many nodes spot stops paying.

Expected cost = paid hours x the hourly price; cost per useful step = that / train.max_steps. Waits for spot
capacity are not counted (they cost nothing but wall time). The recommendation is the cheapest expected cost.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Optional, cast

from orchestrator.config.typed import Durations
from orchestrator.policy.history import restart_seconds_measured, spot_lifetimes
from orchestrator.policy.interval import (
    Lifetime,
    checkpoint_interval,
    estimate_preemptions,
    estimated_checkpoint_seconds,
    expected_waste_fraction,
)
from orchestrator.policy.restart import restart_seconds

SPOT, ON_DEMAND = "spot", "on_demand"


@dataclass
class CapacityOption:
    gpu_type: str
    capacity: str  # spot | on_demand
    usd_per_hour: float
    work_hours: float  # useful training, uninterrupted
    expected_wall_hours: Optional[float]  # paid hours (None: the job would never finish)
    expected_preemptions: Optional[float]
    preemptions_per_hour: float
    expected_lost_work_hours: Optional[float]
    restart_seconds: float
    restart_source: str
    restart_overhead_hours: Optional[float]
    checkpoint_every_seconds: float
    checkpoint_cost_seconds: float
    checkpoint_overhead_hours: Optional[float]
    expected_cost_usd: Optional[float]
    cost_per_useful_step_usd: Optional[float]
    nodes: int = 1  # machines; on spot any one's preemption ends the attempt (preemptions_per_hour counts them all)


def job_history(cfg: Any) -> tuple[list[Lifetime], list[float]]:
    """The job's spot lifetimes and measured restarts from its ledger; none when it has no ledger (or none can be
    read: the plan is advice and never stops a launch, nor waits out a storage outage), or when the ledger under
    this run.name is of another model (a 70B plan under the default run.name is not the tiny demo's 58 s restart).
    A restart is an attempt's start to first step (``policy.history``)."""
    try:
        from orchestrator.records.ledger import Ledger
        from orchestrator.records.ledger_record import LedgerRecord
        from orchestrator.storage import store_from_config

        ledger = Ledger(store_from_config(cfg.storage, retry=False), str(cfg.run.name))
        raw = ledger.load()
        record = LedgerRecord.decode(raw, ledger.uri) if raw else None
    except Exception:  # noqa: BLE001 - no history is a valid answer
        return [], []
    if record is None or not record.trained(str(cfg.model.name_or_path)):
        return [], []
    return list(spot_lifetimes(record.attempts)), restart_seconds_measured(record.attempts)


def checkpoint_bytes(memory_plan: Any) -> float:
    """What a checkpoint writes: the trainable state (adapters or weights) and the optimizer's."""
    c = memory_plan.components
    keys = ("adapters", "optimizer", "master_weights") + (("weights",) if "adapters" not in c else ())
    return float(sum(c.get(k, 0) for k in keys))


def _interval(cfg: Any, durations: Durations, cost_s: float, estimate, lifetimes: list[Lifetime]) -> float:
    every = durations.checkpoint_every
    if not every.auto:
        return every.seconds if every.seconds > 0 else math.inf
    low, high = durations.checkpoint_bounds  # as the attempt's schedule bounds it
    override = cfg.compute.preemptions_per_hour is not None
    return checkpoint_interval(
        cost_s, estimate, lifetimes=None if override else lifetimes, min_seconds=low, max_seconds=high
    ).seconds


def price_option(
    cfg: Any,
    gpu_type: str,
    capacity: str,
    memory_plan: Any,
    catalog: Mapping[str, Any],
    history: tuple[list[Lifetime], list[float]],
    *,
    variant: Callable[[Any, str], Any],
    work_hours: Callable[[Any, Any], Optional[float]],
    durations: Optional[Durations] = None,
) -> Optional[CapacityOption]:
    """One GPU type on one capacity; None when it has no price or no throughput estimate. ``variant(cfg, gpu)``
    and ``work_hours(cfg, price)`` are the planner's (passed in: the planner imports this module); ``durations``:
    the job's, parsed once by ``capacity_plan`` (else here)."""
    from orchestrator.money.cost import preemption_prior_per_hour, price_for

    on_gpu = variant(cfg, gpu_type)
    compute = _with_spot(on_gpu.compute, capacity == SPOT)
    try:
        price = price_for(compute, catalog)
    except (ValueError, KeyError):
        return None
    work = work_hours(on_gpu, price)
    if work is None:
        return None
    lifetimes, measured = history
    prior, _ = preemption_prior_per_hour(compute, catalog)
    # on-demand is not preempted, unless the job runs on-demand and says how often (a partition that requeues)
    explicit = None if cfg.compute.spot else cfg.compute.preemptions_per_hour
    estimate = estimate_preemptions(
        lifetimes if capacity == SPOT else [], prior, override_per_hour=None if capacity == SPOT else (explicit or 0.0)
    )
    ckpt_bytes = checkpoint_bytes(memory_plan)
    cost_s = estimated_checkpoint_seconds(ckpt_bytes)
    restart, source = restart_seconds(
        override=cfg.compute.restart_seconds,
        measured=measured,
        model_bytes=float(memory_plan.components.get("weights", 0)),
        checkpoint_bytes=ckpt_bytes,
    )
    every = _interval(cfg, durations or Durations.of(cfg), cost_s, estimate, lifetimes if capacity == SPOT else [])
    waste = expected_waste_fraction(every, cost_s, estimate, restart_seconds=restart)
    option = CapacityOption(
        gpu_type,
        capacity,
        price.usd_per_hour_total,
        work,
        None,
        None,
        estimate.per_hour,
        None,
        restart,
        source,
        None,
        every,
        cost_s,
        None,
        None,
        None,
        nodes=int(compute.nodes or 1),
    )
    if waste >= 1.0:
        return option  # restarts and lost work eat every hour: the job never finishes on this capacity
    paid = (work + restart / 3600.0) / (1.0 - waste)
    option.expected_wall_hours = paid
    option.expected_preemptions = estimate.per_hour * paid
    option.expected_lost_work_hours = estimate.lossy_per_hour * paid * (every / 2.0 if every < math.inf else 0) / 3600
    option.restart_overhead_hours = (option.expected_preemptions + 1) * restart / 3600.0
    option.checkpoint_overhead_hours = paid * cost_s / every if every < math.inf else 0.0
    option.expected_cost_usd = paid * price.usd_per_hour_total
    option.cost_per_useful_step_usd = option.expected_cost_usd / max(1, int(cfg.train.max_steps))
    return option


def _with_spot(compute: Any, spot: bool) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(compute):
        node: Any = compute
        return dataclasses.replace(node, spot=spot)
    from omegaconf import OmegaConf

    return OmegaConf.merge(compute, {"spot": spot})


def capacity_plan(
    cfg: Any,
    memory_plan: Any,
    catalog: Mapping[str, Any],
    gpu_types: list[str],
    *,
    variant: Callable[[Any, str], Any],
    work_hours: Callable[[Any, Any], Optional[float]],
) -> dict:
    """``{"options": [...], "recommendation": {"capacity", "gpu_type", "reason"}}`` (what ``plan --json`` prints)."""
    history, durations = job_history(cfg), Durations.of(cfg)
    options = [
        o
        for g in gpu_types
        for cap in (SPOT, ON_DEMAND)
        if (
            o := price_option(
                cfg, g, cap, memory_plan, catalog, history, variant=variant, work_hours=work_hours, durations=durations
            )
        )
        is not None
    ]
    doc: dict[str, Any] = {"options": [asdict(o) for o in options], "recommendation": recommend(options)}
    if doc["recommendation"] and str(cfg.distributed.name) != "none":
        from orchestrator.planning.nodes import spot_break_even

        def price(nodes: int, gpu: str, capacity: str) -> Optional[CapacityOption]:
            # the job's ledger measured its own node count: another count starts from the prior alone
            seen = history if nodes == int(cfg.distributed.nodes) else ([], history[1])
            return price_option(
                cfg,
                gpu,
                capacity,
                memory_plan,
                catalog,
                seen,
                variant=lambda c, g: with_nodes(variant(c, g), nodes),
                work_hours=work_hours,
                durations=durations,
            )

        doc["nodes"] = spot_break_even(price, doc["recommendation"]["gpu_type"], int(cfg.distributed.nodes))
    return doc


def with_nodes(cfg: Any, nodes: int) -> Any:
    """A copy of ``cfg`` on ``nodes`` machines (compute.nodes and distributed.nodes); a job's own
    ``compute.preemptions_per_hour`` scales with them (any node's preemption ends the attempt)."""
    import dataclasses

    rate = cfg.compute.preemptions_per_hour
    compute = {
        "nodes": nodes,
        "preemptions_per_hour": None if rate is None else float(rate) * nodes / max(1, int(cfg.compute.nodes or 1)),
    }
    if dataclasses.is_dataclass(cfg):
        node: Any = cfg
        return dataclasses.replace(
            node,
            compute=dataclasses.replace(node.compute, **compute),
            distributed=dataclasses.replace(node.distributed, nodes=nodes),
        )
    from omegaconf import OmegaConf

    return OmegaConf.merge(cfg, {"compute": compute, "distributed": {"nodes": nodes}})


def recommend(options: list[CapacityOption]) -> Optional[dict]:
    priced = [o for o in options if o.expected_cost_usd is not None]
    if not priced:
        return None
    best = min(priced, key=lambda o: cast(float, o.expected_cost_usd))
    same = {o.capacity: o for o in options if o.gpu_type == best.gpu_type}
    spot, od = same.get(SPOT), same.get(ON_DEMAND)
    if best.capacity == ON_DEMAND:
        if spot is None or spot.expected_cost_usd is None:
            why = (
                f"on spot, {_rate(spot)} with a {spot.restart_seconds:.0f}s restart leave no time to train"
                if spot
                else "no spot price"
            )
        else:
            why = (
                f"spot expects {spot.expected_preemptions:.1f} preemptions ({_rate(spot)}), "
                f"each a {spot.restart_seconds:.0f}s restart plus lost work: ~${spot.expected_cost_usd:,.2f} "
                f"against ~${best.expected_cost_usd:,.2f}"
            )
        reason = f"on-demand is cheaper for this job on {best.gpu_type}: {why}"
    else:
        against = f" against ~${od.expected_cost_usd:,.2f} on-demand" if od and od.expected_cost_usd else ""
        reason = (
            f"spot on {best.gpu_type}: ~${best.expected_cost_usd:,.2f} expected{against}, counting "
            f"{best.expected_preemptions:.1f} preemptions ({_rate(best)}, "
            f"{best.restart_seconds:.0f}s restart, {best.expected_lost_work_hours:.2f} h lost work)"
        )
    return {"capacity": best.capacity, "gpu_type": best.gpu_type, "reason": reason}


def _rate(option: CapacityOption) -> str:
    """The preemption rate as the reasons give it: per node too when there are several."""
    if option.nodes <= 1:
        return f"{option.preemptions_per_hour:.2f}/h"
    return (
        f"{option.preemptions_per_hour:.2f}/h: {option.nodes} spot nodes x "
        f"{option.preemptions_per_hour / option.nodes:.2f}/h, any one ends the attempt"
    )


def _h(x: Optional[float], fmt: str = "{:.2f}") -> str:
    return "never" if x is None else fmt.format(x)


def format_capacity_plan(doc: dict) -> str:
    lines = [
        "interruptions priced (expected; waits for spot capacity not counted):",
        f"  {'gpu':<11}{'capacity':<11}{'wall h':>8}{'preempt':>9}{'lost h':>8}{'restart h':>10}{'ckpt h':>8}"
        f"{'cost':>11}{'$/step':>10}",
    ]
    for o in doc["options"]:
        cost = "never" if o["expected_cost_usd"] is None else f"${o['expected_cost_usd']:,.2f}"
        step = "-" if o["cost_per_useful_step_usd"] is None else f"{o['cost_per_useful_step_usd']:.2g}"
        lines.append(
            f"  {o['gpu_type']:<11}{o['capacity']:<11}{_h(o['expected_wall_hours']):>8}"
            f"{_h(o['expected_preemptions'], '{:.1f}'):>9}{_h(o['expected_lost_work_hours']):>8}"
            f"{_h(o['restart_overhead_hours']):>10}{_h(o['checkpoint_overhead_hours']):>8}{cost:>11}{step:>10}"
        )
    if doc["options"]:
        o = doc["options"][0]
        lines.append(
            f"  restart {o['restart_seconds']:.0f}s ({o['restart_source']}), checkpoint "
            f"{o['checkpoint_cost_seconds']:.1f}s each"
        )
    rec = doc["recommendation"]
    lines.append(f"recommendation: {rec['reason']}" if rec else "recommendation: none (no priced GPU type fits)")
    if doc.get("nodes"):
        lines.append(f"nodes: {doc['nodes']['text']}")
    return "\n".join(lines)
