"""Throughput, hours and USD of a job's run, and the catalog GPU types that hold its memory plan, priced.

Throughput (``estimate_cost``): forward FLOPs per token = 2 x matmul params
(all but the input embedding; lm_head counts even when tied) + 2*L*s*H*d for
causal attention. Training multiplies the forward by 3 for a full fine-tune
(backward = 2 forwards) and by 2 for LoRA/QLoRA (backward through activations
only), +1 with gradient checkpointing, +1 for DPO's reference forward. Tokens/s
= W x peak dense TFLOPs at the compute precision x MFU (35%; 25% for QLoRA,
whose every matmul first dequantises its weight) / FLOPs per token. The peak
is the 16-bit figure (``GPU_PEAK_TFLOPS``) when the job computes in 16 bits
(mixed precision or 16-bit weights); float32 compute gets half of it with
``train.tf32=true`` (TF32 tensor cores) and 1/16 without (plain FP32, the
A100's and H100's ratio).
Tokens = max_steps x micro-batch x grad-accum x W x seq (x2 for DPO): real
tokens with packing, an upper bound (rows padded) without.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from orchestrator.config import train_options
from orchestrator.core.gpus import GPUS, gpu_memory_gb
from orchestrator.planning.memory import CPU_GPU_TYPES, MemoryPlan, compute_width, fits, world_size
from orchestrator.planning.model_shape import _dims, count_parameters, load_model_config

MFU = 0.35
QLORA_MFU = 0.25
TF32_SHARE_OF_PEAK = 0.5  # TF32 tensor-core TFLOPs / 16-bit ones (A100 156/312, H100 495/989)
FP32_SHARE_OF_PEAK = 1 / 16  # plain FP32 TFLOPs / 16-bit ones (A100 19.5/312, H100 67/989)
GPU_PEAK_TFLOPS = {name: gpu.peak_tflops for name, gpu in GPUS.items() if gpu.peak_tflops}


@dataclass
class CostEstimate:
    """What the run costs. ``usd`` is at the chosen compute's price (spot when compute.spot);
    ``on_demand_usd`` the same hours on demand. Hours and USD are None when throughput is unknown."""

    tokens: int
    tokens_per_second: Optional[float]
    flops_per_token: float
    hours: Optional[float]
    usd: Optional[float]
    on_demand_usd: Optional[float]
    spot: bool
    basis: str


def flops_per_token(cfg: Any, model_config: Mapping[str, Any]) -> float:
    """Training FLOPs per token (rule of thumb in the module docstring)."""
    d, params = _dims(model_config), count_parameters(model_config)
    matmul = params["total"] - params["embeddings"] - params["lm_head"] + d["vocab"] * d["h"]
    context = int(cfg.data.max_length)
    if train_options.padding_free(cfg) and str(cfg.model.attn_implementation) not in train_options.FLASH_ATTENTION:
        context *= int(cfg.train.per_device_batch_size)  # one flattened sequence per micro-batch
    forward = 2 * matmul + 2 * d["layers"] * context * d["q_dim"]
    multiplier = (3 if cfg.recipe.peft == "full" else 2) + int(bool(cfg.train.gradient_checkpointing))
    multiplier += int(cfg.recipe.name == "dpo")
    return float(forward * multiplier)


def estimate_cost(
    cfg: Any, price: Any, tokens_per_second: Optional[float] = None, model_config: Optional[Mapping[str, Any]] = None
) -> CostEstimate:
    """Tokens, hours and USD for ``cfg``'s run at ``price`` (an ``orchestrator.money.cost.Price``).

    ``tokens_per_second`` (all GPUs together, e.g. measured in a trial) replaces
    the rule-of-thumb throughput. ``price`` may be None: hours only.
    """
    if model_config is None:
        model_config = load_model_config(cfg.model.name_or_path, cfg.model.preset, model_cfg=cfg.model)
    from orchestrator.money.report import estimated_tokens_per_step

    W = world_size(cfg)
    tokens = int(cfg.train.max_steps) * estimated_tokens_per_step(cfg)
    fpt = flops_per_token(cfg, model_config)
    if tokens_per_second:
        basis = "measured throughput"
    else:
        peak16 = GPU_PEAK_TFLOPS.get(str(cfg.compute.gpu_type).lower())
        share, precision = precision_share(cfg)
        peak = peak16 * share if peak16 else None
        mfu = QLORA_MFU if cfg.recipe.quantization == "nf4" else MFU
        tokens_per_second = W * peak * 1e12 * mfu / fpt if peak else None
        basis = (
            f"{W} x {peak:g} {precision} TFLOPs x {mfu:.0%} MFU / {fpt:.3g} FLOPs per token"
            if peak
            else f"no peak TFLOPs known for {cfg.compute.gpu_type!r}; pass a measured tokens/s"
        )
    hours = tokens / tokens_per_second / 3600 if tokens_per_second else None
    usd = on_demand = None
    if hours is not None and price is not None:
        usd, on_demand = hours * price.usd_per_hour_total, hours * price.on_demand_usd_per_hour_total
    return CostEstimate(tokens, tokens_per_second, fpt, hours, usd, on_demand, bool(cfg.compute.spot), basis)


def precision_share(cfg: Any) -> tuple[float, str]:
    """The share of the GPU's 16-bit peak the job's matmuls run at, and the precision's name."""
    if compute_width(cfg) < 4 or (cfg.recipe.quantization == "nf4" and str(cfg.model.dtype) != "float32"):
        return 1.0, "16-bit"
    if cfg.train.tf32:
        return TF32_SHARE_OF_PEAK, "TF32"
    return FP32_SHARE_OF_PEAK, "FP32"


def with_gpu(cfg: Any, gpu_type: str) -> Any:
    """A copy of ``cfg`` on ``gpu_type`` (one GPU per process at least), priced and sized by the
    catalog: compute.price_per_hour and compute.memory_gb are dropped."""
    gpus = max(int(cfg.compute.gpus_per_node or 0), world_size(cfg) // max(1, int(cfg.compute.nodes or 1)), 1)
    change = {"gpu_type": gpu_type, "gpus_per_node": gpus, "price_per_hour": None, "memory_gb": None}
    if dataclasses.is_dataclass(cfg):
        node: Any = cfg
        return dataclasses.replace(node, compute=dataclasses.replace(node.compute, **change))
    from omegaconf import OmegaConf

    return OmegaConf.merge(cfg, {"compute": change})


@dataclass
class GpuOption:
    gpu_type: str
    memory_gb: float
    usd_per_hour_total: Optional[float]
    run_usd: Optional[float]


def gpu_types_that_fit(
    plan: MemoryPlan, cfg: Any, catalog: Mapping[str, Any], model_config: Mapping[str, Any], headroom: float = 0.1
) -> list[GpuOption]:
    """Catalog GPU types whose memory holds ``plan``, cheapest run first to the cent, as the plan prints it (then
    cheapest hour: runs that round alike, a tiny job's all $0.00, are not ordered by a difference nobody sees;
    unpriced last), each priced at cfg's GPU count, spot mode and cloud."""
    from orchestrator.money.cost import price_for

    options = []
    for gpu_type in sorted(catalog):
        memory = gpu_memory_gb(gpu_type, catalog)
        if memory is None or str(gpu_type).lower() in CPU_GPU_TYPES or not fits(plan, memory, headroom):
            continue
        variant = with_gpu(cfg, gpu_type)
        try:
            price = price_for(variant.compute, catalog)
        except (ValueError, KeyError):
            price = None
        run = estimate_cost(variant, price, model_config=model_config).usd
        options.append(GpuOption(gpu_type, memory, price.usd_per_hour_total if price else None, run))
    inf = float("inf")
    return sorted(
        options,
        key=lambda o: (
            round(o.run_usd, 2) if o.run_usd is not None else inf,
            o.usd_per_hour_total if o.usd_per_hour_total is not None else inf,
        ),
    )
