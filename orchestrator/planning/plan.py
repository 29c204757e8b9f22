"""Pre-flight plan: memory per GPU, which GPUs fit, and what the run will cost -- the report and its CLI.

``orchestrator plan [hydra overrides]`` prints it; ``launch`` prints it before a
job starts; a trial (``train.trial_steps``) prints it beside what was measured.
Everything is computed from the model's ``config.json`` alone (never weights)
and the composed job config. Units: bytes; "GB" means 1e9 bytes everywhere.

The estimates live beside this module, each with its assumptions stated once in its docstring:
``orchestrator.planning.memory`` (bytes per GPU by component) and ``orchestrator.planning.cost`` (throughput, hours,
USD, the GPU types that fit). This module turns them into text: the plan (``format_plan``, ``plan_text``,
``main``) and, after a trial, the estimate beside what was measured
(``count_allocated_state_bytes``, ``format_trial``).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from orchestrator.core.errors import ConfigError
from orchestrator.core.gpus import GPUS, gpu_memory_gb
from orchestrator.planning.cost import CostEstimate, GpuOption, estimate_cost, gpu_types_that_fit, with_gpu
from orchestrator.planning.memory import COMPONENT_LABELS, CPU_GPU_TYPES, GB, MemoryPlan, estimate_memory, fits
from orchestrator.planning.model_shape import load_model_config

NO_BF16_GPUS = frozenset(name for name, gpu in GPUS.items() if not gpu.bf16)


def _gb(n: float) -> str:
    return f"{n / GB:,.2f} GB" if n >= 0.1 * GB else f"{n / 1e6:,.2f} MB"


def format_plan(
    plan: MemoryPlan,
    *,
    gpu_type: str,
    memory_gb: Optional[float],
    options: list[GpuOption],
    cost: Optional[CostEstimate],
    headroom: float = 0.1,
    prices: Optional[str] = None,
) -> str:
    """The plan as text: breakdown table, fit verdict (a WARNING line when it will not
    fit), where the prices come from and how old they are (``prices``), GPU types that fit, and the run's
    estimated cost, spot vs on-demand."""
    spread = f" = {plan.nodes} nodes x {plan.world_size // plan.nodes}" if plan.nodes > 1 else ""
    lines = [
        f"plan: {plan.describe}",
        f"  world size {plan.world_size}{spread} (distributed={plan.sharding}), {plan.tokens_per_step:,} tokens per "
        f"optimizer step, gradient checkpointing {'on' if plan.checkpointing else 'off'}",
        "",
        f"  {'component':<30}{'per GPU':>14}",
    ]
    for key, value in plan.components.items():
        label = f"optimizer ({plan.optim})" if key == "optimizer" and plan.optim else COMPONENT_LABELS[key]
        lines.append(f"  {label:<30}{_gb(value):>14}")
    lines.append(f"  {'total':<30}{_gb(plan.total_bytes):>14}")
    if plan.cpu_offload_bytes:
        lines.append(f"  {'(offloaded to CPU RAM)':<30}{_gb(plan.cpu_offload_bytes):>14}")
    other = "on" if not plan.checkpointing else "off"
    lines += [f"  activations with gradient checkpointing {other}: {_gb(plan.activations_alternative)}", ""]
    if str(gpu_type).lower() in CPU_GPU_TYPES:
        lines.append(f"fit: compute has no GPU; needs ~{_gb(plan.total_bytes)} of RAM.")
    elif memory_gb is None:
        lines.append(f"fit: unknown memory for gpu_type {gpu_type!r}; set compute.memory_gb to check it.")
    else:
        usable = memory_gb * (1 - headroom)
        share = plan.total_bytes / (memory_gb * GB)
        if fits(plan, memory_gb, headroom):
            lines.append(
                f"fit: OK on {gpu_type} ({memory_gb:g} GB; {usable:.1f} GB usable at {headroom:.0%} headroom): "
                f"{share:.0%} used."
            )
        else:
            hint = (
                "turn on train.gradient_checkpointing=true, "
                if not plan.checkpointing and plan.activations_alternative < plan.components.get("activations", 0)
                else ""
            )
            lines.append(
                f"WARNING: will NOT fit on {gpu_type} ({memory_gb:g} GB; {usable:.1f} GB usable): needs "
                f"{_gb(plan.total_bytes)} per GPU. Fix: {hint}lower train.per_device_batch_size or "
                "data.max_length, shard (distributed=zero3), or pick a GPU type below."
            )
    if str(gpu_type).lower() in NO_BF16_GPUS and plan.dtype == "bfloat16":
        lines.append(f"WARNING: {gpu_type} has no bfloat16 support; set model.dtype=float16 (or pick an Ampere+ GPU).")
    if prices:
        lines.append(prices)
    if options:
        lines.append(
            "GPU types that fit (cheapest run first, to the cent; then cheapest hour):"
            if any(o.run_usd is not None for o in options)
            else "GPU types that fit (cheapest hour first):"
        )
        for o in options:
            hourly = f"${o.usd_per_hour_total:,.2f}/h" if o.usd_per_hour_total is not None else "unpriced"
            run = f"~${o.run_usd:,.2f} for the run" if o.run_usd is not None else ""
            caveat = (
                " (no bf16: set model.dtype=float16)" if o.gpu_type in NO_BF16_GPUS and plan.dtype == "bfloat16" else ""
            )
            lines.append(f"  {o.gpu_type:<11}{o.memory_gb:>5g} GB  {hourly:>11}  {run}{caveat}".rstrip())
    else:
        lines.append("GPU types that fit: none in the catalog at this world size; shard over more GPUs (zero3/fsdp).")
    lines += [f"note: {n}" for n in plan.notes]
    if cost is not None:
        lines.append(f"cost: {cost.tokens:,} tokens; " + _cost_line(cost))
    return "\n".join(lines)


def _cost_line(cost: CostEstimate) -> str:
    if cost.hours is None:
        return f"duration unknown ({cost.basis})."
    text = f"~{cost.tokens_per_second:,.0f} tokens/s ({cost.basis}), ~{cost.hours:,.2f} h"
    if cost.usd is None:
        return text + "; no price."
    mode = "spot" if cost.spot else "on-demand (compute.spot=false)"
    return text + f": {mode} ~${cost.usd:,.2f} vs on-demand ~${cost.on_demand_usd:,.2f}."


def plan_text(cfg: Any, headroom: float = 0.1, as_json: bool = False) -> str:
    """The whole pre-flight plan for a composed config (what ``orchestrator plan`` and launch print); ``as_json``:
    only the capacity plan (spot against on-demand), as JSON."""
    from omegaconf import OmegaConf

    from orchestrator.money.cost import price_for
    from orchestrator.money.price_refresh import current_catalog

    # the schemas' dataclasses: the 2 x N variants (each GPU type, spot and on-demand) are dataclasses.replace
    # copies, not OmegaConf merges of the whole tree (0.47 s of a launch's CPU before)
    cfg = OmegaConf.to_object(cfg) if OmegaConf.is_config(cfg) else cfg
    model_config = load_model_config(cfg.model.name_or_path, cfg.model.preset, model_cfg=cfg.model)
    plan = estimate_memory(cfg, model_config)
    catalog, prices = current_catalog(cfg)  # fetched prices while fresh (refreshed when stale), else the shipped
    try:
        price = price_for(cfg.compute, catalog)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    gpu_type = str(cfg.compute.gpu_type).lower()
    memory = float(cfg.compute.memory_gb) if cfg.compute.memory_gb else gpu_memory_gb(gpu_type, catalog)
    options = gpu_types_that_fit(plan, cfg, catalog, model_config, headroom)
    cost = estimate_cost(cfg, price, model_config=model_config)
    from orchestrator.planning import spot as plan_spot  # spot against on-demand, interruptions priced

    spot = plan_spot.capacity_plan(
        cfg,
        plan,
        catalog,
        [o.gpu_type for o in options],
        variant=with_gpu,
        work_hours=lambda c, p: estimate_cost(c, p, model_config=model_config).hours,
    )
    placeholder = placeholder_note(cfg)
    if as_json:
        return json.dumps({**spot, "prices": prices, "placeholder": placeholder})
    return (
        format_plan(
            plan, gpu_type=gpu_type, memory_gb=memory, options=options, cost=cost, headroom=headroom, prices=prices
        )
        + "\n"
        + plan_spot.format_capacity_plan(spot)
        + (f"\nWARNING: {placeholder}" if placeholder else "")
    )


def placeholder_note(cfg: Any) -> Optional[str]:
    """What the plan prices that is the CPU demo's, not the job's: the built-in arithmetic data under a real model
    (its steps are a placeholder too), or None."""
    from orchestrator.config.defaults import is_builtin

    if str(cfg.data.source) != "synthetic" or is_builtin(cfg):
        return None
    return (
        f"these figures price {cfg.train.max_steps} steps of the built-in arithmetic data (data=synthetic), "
        "the CPU demo's placeholder, not your job: give your data (data=jsonl data.path=... or data=hub "
        "data.path=...) and its length (train.max_steps or train.num_epochs) for the run's real cost."
    )


SHORT_PLAN_PREFIXES = ("fit:", "WARNING", "cost:", "recommendation:")


def short_plan_text(cfg: Any, headroom: float = 0.1) -> str:
    """The plan a launch prints: five lines of ``plan_text`` -- what is trained, whether it fits (with every
    WARNING), the cost, the capacity recommendation -- and where the whole plan is (``orchestrator plan``)."""
    lines = plan_text(cfg, headroom).splitlines()
    kept = [lines[0], *(line for line in lines[1:] if line.startswith(SHORT_PLAN_PREFIXES))]
    return "\n".join(
        kept
        + [
            "the whole plan (memory per component, every GPU type, spot against on-demand): "
            "orchestrator plan with the same overrides"
        ]
    )


# ---------------------------------------------------------------- trial: estimate vs measurement


def count_allocated_state_bytes(model: Any, optimizer: Any = None) -> dict[str, int]:
    """Bytes held by a live model's parameters (with bitsandbytes quantisation
    constants), their gradients, and the optimizer's state tensors, counted from
    the tensors themselves; shared storage (tied weights) counts once."""
    import torch

    seen: set[tuple[int, int]] = set()

    def size(t: Any) -> int:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return 0
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key in seen:
            return 0
        seen.add(key)
        return t.untyped_storage().nbytes()

    out = {"params": 0, "grads": 0, "optimizer": 0}
    for p in model.parameters():
        out["params"] += size(p)
        state = getattr(p, "quant_state", None)
        for t in _tensors(vars(state) if state is not None else {}):
            out["params"] += size(t)
    for p in model.parameters():
        out["grads"] += size(p.grad)
    if optimizer is not None:
        for state in optimizer.state.values():
            out["optimizer"] += sum(size(t) for t in _tensors(state))
    return out


def _tensors(mapping: Mapping[str, Any]):
    for value in mapping.values():
        if hasattr(value, "untyped_storage"):
            yield value
        elif hasattr(value, "absmax"):  # bitsandbytes' nested QuantState (double quantisation)
            yield from _tensors(vars(value))


def format_trial(plan: MemoryPlan, measured: Mapping[str, Any], cost: Optional[CostEstimate] = None) -> str:
    """Estimate beside measurement after a trial. ``measured`` keys (each optional):
    params, grads, optimizer (bytes, from :func:`count_allocated_state_bytes`),
    peak_memory_bytes, step_time_s, tokens_per_second, data_wait_s (per step).
    The peak estimate includes ~1 GB of CUDA context that ``torch.cuda.max_memory_allocated``
    does not see; ``cost`` (from :func:`estimate_cost`) supplies the step-time and tokens/s estimates."""
    comp = plan.components
    est_params = sum(comp.get(k, 0) for k in ("weights", "quant_constants", "reference_model", "adapters"))
    est_opt = comp.get("optimizer", 0) + comp.get("master_weights", 0)
    est_tps = cost.tokens_per_second if cost else None
    est_step = plan.tokens_per_step / est_tps if est_tps else None
    rows = [
        ("parameters", est_params, measured.get("params"), _gb),
        ("gradients", comp.get("gradients", 0), measured.get("grads"), _gb),
        ("optimizer states", est_opt, measured.get("optimizer"), _gb),
        ("peak memory", plan.total_bytes, measured.get("peak_memory_bytes"), _gb),
        ("step time", est_step, measured.get("step_time_s"), lambda s: f"{s:.3f} s"),
        ("tokens/s", est_tps, measured.get("tokens_per_second"), lambda s: f"{s:,.0f}"),
        ("data-loader wait", None, measured.get("data_wait_s"), lambda s: f"{s:.3f} s/step"),
    ]
    lines = [f"trial: {plan.describe}", f"  {'':<18}{'estimate':>14}{'measured':>14}{'ratio':>8}"]
    for label, est, got, fmt in rows:
        ratio = f"{got / est:.2f}" if est and got is not None else ""
        lines.append(
            f"  {label:<18}{fmt(est) if est is not None else '-':>14}"
            f"{fmt(got) if got is not None else '-':>14}{ratio:>8}"
        )
    step, wait = measured.get("step_time_s"), measured.get("data_wait_s")
    if step and wait is not None and wait > 0.1 * step:
        lines.append(
            f"WARNING: the data loader holds up {wait / step:.0%} of each step; raise "
            "train.dataloader_num_workers (e.g. train.dataloader_num_workers=4) or pre-tokenise the data."
        )
    return "\n".join(lines)
