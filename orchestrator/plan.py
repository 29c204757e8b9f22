"""Pre-flight plan: memory per GPU, which GPUs fit, and what the run will cost.

``orchestrator plan [hydra overrides]`` prints it; ``launch`` prints it before a
job starts; a trial (``train.trial_steps``) prints it beside what was measured.
Everything is computed from the model's ``config.json`` alone (never weights)
and the composed job config. Units: bytes; "GB" means 1e9 bytes everywhere.

Assumptions, stated once
------------------------
Parameters (``count_parameters``): a Llama-style decoder (llama, mistral, qwen2,
qwen3): embeddings V*h; per layer q (h x H*d), k and v (h x K*d, GQA), o (H*d x h),
MLP gate/up (h x I) and down (I x h), two RMSNorms (h each); a final norm (h);
lm_head V*h unless ``tie_word_embeddings``. Biases: q/k/v for qwen2, all four
attention projections when ``attention_bias``, MLP when ``mlp_bias``; qwen3 adds
q/k norms (d each). d = ``head_dim`` or h/H.

LoRA (``lora_parameters``): r*(in + out) per targeted projection per layer
(A: r x in, B: out x r). Adapters are held in fp32 (PEFT's default
``autocast_adapter_dtype``): 4 weights + 4 grads + 8 Adam = 16 bytes/adapter param.

Weights, per parameter: float32 4, bfloat16/float16 2. NF4 (QLoRA, bitsandbytes):
only the decoder's linear weights are quantised (embeddings, lm_head, norms and
biases stay at model.dtype); 4 bits = 0.5 byte each, plus quantisation constants
with blocksize 64 and double quantisation: one 8-bit absmax per 64 weights
(8/64 bit) plus one fp32 absmax per 256 of those blocks (32/(64*256) bit)
= 0.126953125 bit/param (``NF4_CONSTANT_BITS_PER_PARAM``).

Optimizer states (``train.optim``, table in ``orchestrator.train_options``):
Adam's two fp32 moments are 8 bytes per trainable parameter; bitsandbytes'
and torchao's 8-bit variants keep them in 1 byte each (2 bytes: a quarter),
Lion one moment, AdEMAMix three, SGD none. bitsandbytes keeps 32-bit states
for tensors under 4096 elements (most LoRA adapters of small models); the
plan counts every state at the optimizer's width. Paged optimizers may move
their states to CPU RAM under memory pressure (not counted).

Full fine-tune with Adam: float32 model -> 4 weights + 4 grads + 8 Adam = 16
bytes/param; 16-bit model -> 2 weights + 2 grads + 4 fp32 master + 8 fp32 Adam
= 16 bytes/param (mixed precision as DeepSpeed/FSDP do it; a bf16 model under
plain torch AdamW keeps bf16 states and needs less -- the plan errs safe).
DPO with a full fine-tune would also hold a frozen reference copy; DPO with LoRA
uses the base with adapters off as the reference (no extra weights).

Mixed precision (``train.mixed_precision`` bf16/fp16) computes in 16 bits
whatever the storage dtype: activations are counted at 2 bytes, and float32
weights under autocast keep a 16-bit copy of every matmul weight from forward
to backward (2 bytes per such weight; ``autocast_copies``). Without it the
compute runs at the storage dtype's width.

Activations (``activation_bytes``), per token and layer, at the compute
width, assuming fused attention (SDPA/flash: no s x s score matrix stored;
``model.attn_implementation=eager`` adds the softmax output, heads x s x s per
sequence and layer) and no dropout: inputs of both norms and their outputs (4h), q and attention output
(2*H*d), k and v (2*K*d), gate, up, SiLU(gate) and their product (4I). With
gradient checkpointing each layer keeps only its input (h); one layer's full set
is rebuilt during backward. Logits add s*b*V*(width + 4 + 4): the lm_head output,
its fp32 upcast (16-bit models only) and the fp32 log-softmax the loss keeps.
DPO runs chosen and rejected together: 2 sequences per example.
s = data.max_length, b = train.per_device_batch_size. Packing
(``train.packing``) fills each row with real tokens up to s; padding-free
batches (bfd packing, ``train.padding_free``) are one sequence of b x s
tokens: flash-attention kernels attend within each example (varlen), but
sdpa and eager attend over the whole flattened sequence under a (b*s)^2
boolean mask (counted with the activations), so attention FLOPs grow b-fold. Checked against the
tensors autograd saves for a small Llama (SDPA, fp32): within ~5%.

Sharding over the world size W (distributed.processes_per_node x nodes; 1 when
distributed=none): zero2 divides gradients, master weights and optimizer states
by W; zero3 and fsdp divide weights (and adapters, constants) too; ddp and none
divide nothing. distributed.cpu_offload (zero2/zero3/fsdp) moves optimizer
states and master weights to CPU RAM. A GPU also holds ~1 GB of CUDA context and
library workspaces (``RUNTIME_OVERHEAD_BYTES``).

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
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from orchestrator import plan_grpo, train_options
from orchestrator.errors import ConfigError, UserError
from orchestrator.gpus import CPU_TYPES, GPUS, gpu_memory_gb  # noqa: F401  (gpu_memory_gb: re-exported)
from orchestrator.model_config import (  # noqa: F401  (the model's shape; re-exported under the planner's names)
    ATTENTION_MODULES, HUB_TIMEOUT_SECONDS, MLP_MODULES, PRESETS_DIR, _dims, count_parameters, load_model_config,
    lora_parameters, projection_shapes, tiny_llama_config)

GB = 1e9
NF4_BITS_PER_PARAM = 4
NF4_BLOCKSIZE = 64
NF4_DOUBLE_QUANT_BLOCKSIZE = 256
NF4_CONSTANT_BITS_PER_PARAM = 8 / NF4_BLOCKSIZE + 32 / (NF4_BLOCKSIZE * NF4_DOUBLE_QUANT_BLOCKSIZE)
ADAM_STATE_BYTES_PER_PARAM = 8  # exp_avg + exp_avg_sq, fp32
ADAPTER_BYTES_PER_PARAM = 4  # LoRA weights and their grads are fp32
RUNTIME_OVERHEAD_BYTES = int(1 * GB)
MFU = 0.35
QLORA_MFU = 0.25
TF32_SHARE_OF_PEAK = 0.5  # TF32 tensor-core TFLOPs / 16-bit ones (A100 156/312, H100 495/989)
FP32_SHARE_OF_PEAK = 1 / 16  # plain FP32 TFLOPs / 16-bit ones (A100 19.5/312, H100 67/989)
MASK_BYTES_PER_ELEMENT = 1  # the boolean attention mask of a padding-free batch under sdpa/eager
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
CPU_GPU_TYPES = CPU_TYPES
NO_BF16_GPUS = frozenset(name for name, gpu in GPUS.items() if not gpu.bf16)
GPU_PEAK_TFLOPS = {name: gpu.peak_tflops for name, gpu in GPUS.items() if gpu.peak_tflops}
COMPONENT_LABELS = {
    "weights": "weights (base model)",
    "quant_constants": "NF4 quantisation constants",
    "reference_model": "reference model (DPO; GRPO with beta > 0)",
    "generation_cache": "generation KV cache (GRPO)",
    "adapters": "LoRA adapters (fp32)",
    "gradients": "gradients",
    "master_weights": "fp32 master weights",
    "optimizer": "optimizer states",
    "autocast_copies": "autocast 16-bit weight copies",
    "activations": "activations",
    "runtime": "CUDA context + workspaces",
}


def activation_bytes(config: Mapping[str, Any], seq_len: int, micro_batch: int, dtype_bytes: int,
                     checkpointing: bool, *, attention: Optional[str] = None, padding_free: bool = False) -> int:
    """Activations kept for backward on one GPU (formula in the module docstring).

    ``attention``: ``model.attn_implementation`` (None: sdpa); ``padding_free``: the batch is one
    flattened sequence (bfd packing or ``train.padding_free``).
    """
    d = _dims(config)
    tokens = int(seq_len) * int(micro_batch)
    per_layer = tokens * dtype_bytes * (4 * d["h"] + 2 * d["q_dim"] + 2 * d["kv_dim"] + 4 * d["inter"])
    flash = str(attention) in train_options.FLASH_ATTENTION
    context = tokens if padding_free and not flash else int(seq_len)  # keys each query is scored against
    if str(attention) == "eager":  # the softmax output, heads x queries x keys, kept for backward
        per_layer += d["heads"] * tokens * context * dtype_bytes
    mask = tokens * tokens * MASK_BYTES_PER_ELEMENT if padding_free and not flash else 0
    logits = tokens * d["vocab"] * (dtype_bytes + (4 if dtype_bytes < 4 else 0) + 4)
    if checkpointing:
        return d["layers"] * tokens * dtype_bytes * d["h"] + per_layer + logits + mask
    return d["layers"] * per_layer + logits + mask


def compute_width(cfg: Any) -> int:
    """Bytes per activation: 2 under mixed precision, else the storage dtype's."""
    if str(cfg.train.mixed_precision) in ("bf16", "fp16"):
        return 2
    return DTYPE_BYTES[str(cfg.model.dtype)]


@dataclass
class MemoryPlan:
    """Estimated bytes per GPU by component (keys of ``COMPONENT_LABELS``, in order).

    ``activations_alternative`` is the activation figure with gradient
    checkpointing toggled, to show what switching it would save or cost.
    """

    components: dict[str, int]
    params: dict[str, int]
    trainable_params: int
    world_size: int
    sharding: str
    dtype: str
    checkpointing: bool
    activations_alternative: int
    cpu_offload_bytes: int = 0
    tokens_per_step: int = 0
    optim: str = ""
    describe: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(self.components.values())


def world_size(cfg: Any) -> int:
    """Training processes (one GPU each); see ``orchestrator.distributed.configured_world_size``."""
    from orchestrator.distributed import configured_world_size

    return configured_world_size(cfg)


def estimate_memory(cfg: Any, model_config: Optional[Mapping[str, Any]] = None) -> MemoryPlan:
    """Per-GPU memory of the job ``cfg`` (a composed config; see the module docstring).

    ``model_config`` is the config.json dict; loaded with :func:`load_model_config` when None.
    Raises ConfigError for an unknown dtype or a quantised full fine-tune.
    """
    if model_config is None:
        model_config = load_model_config(cfg.model.name_or_path, cfg.model.preset, model_cfg=cfg.model)
    recipe, train = cfg.recipe, cfg.train
    dtype = str(cfg.model.dtype)
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"model.dtype={dtype!r} is not one of float32, bfloat16, float16.")
    width = DTYPE_BYTES[dtype]
    full = recipe.peft == "full"
    nf4 = recipe.quantization == "nf4"
    if full and nf4:
        raise ConfigError("recipe.quantization=nf4 needs recipe.peft=lora: a 4-bit base cannot be fully fine-tuned.")
    params = count_parameters(model_config)
    W, sharding = world_size(cfg), str(cfg.distributed.name)
    notes: list[str] = []

    c: dict[str, float] = {}
    if nf4:
        c["weights"] = params["linear_weights"] * NF4_BITS_PER_PARAM / 8 + (params["total"] - params["linear_weights"]) * width
        c["quant_constants"] = params["linear_weights"] * NF4_CONSTANT_BITS_PER_PARAM / 8
    else:
        c["weights"] = params["total"] * width
    if full:
        trainable = params["total"]
        if recipe.name == "dpo" or plan_grpo.holds_reference(cfg):
            c["reference_model"] = params["total"] * width
        c["gradients"] = trainable * width
        c["master_weights"] = trainable * 4 if width < 4 else 0
    else:
        trainable = lora_parameters(model_config, recipe.lora_r, recipe.lora_target_modules)
        c["adapters"] = trainable * ADAPTER_BYTES_PER_PARAM
        c["gradients"] = trainable * ADAPTER_BYTES_PER_PARAM
        c["master_weights"] = 0
    c["optimizer"] = trainable * train_options.optimizer_state_bytes(train.optim)
    compute = compute_width(cfg)
    if compute < width and not nf4:  # float32 weights under autocast: a 16-bit copy of each matmul weight
        c["autocast_copies"] = (params["total"] - params["embeddings"] - params["norms"]
                                + (d_vocab_h(model_config) if not params["lm_head"] else 0)) * compute
    if train_options.OPTIMIZERS.get(str(train.optim), train_options.OPTIMIZERS["adamw_torch"]).eight_bit:
        notes.append(f"train.optim={train.optim} keeps 8-bit states; bitsandbytes keeps 32-bit ones for tensors "
                     f"under {train_options.BNB_MIN_8BIT_SIZE} elements (counted here as 8-bit).")

    offload = _shard(c, sharding, W, bool(cfg.distributed.cpu_offload), notes)

    sequences = int(train.per_device_batch_size) * (2 if recipe.name == "dpo" else 1)
    ckpt = bool(train.gradient_checkpointing)
    attention, flat = cfg.model.attn_implementation, train_options.padding_free(cfg)
    c["generation_cache"] = plan_grpo.generation_cache_bytes(cfg, model_config, compute)
    c["activations"] = activation_bytes(model_config, plan_grpo.sequence_length(cfg), sequences, compute, ckpt,
                                        attention=attention, padding_free=flat)
    alternative = activation_bytes(model_config, plan_grpo.sequence_length(cfg), sequences, compute, not ckpt,
                                   attention=attention, padding_free=flat)
    notes += _packing_notes(cfg)
    if str(cfg.compute.gpu_type).lower() not in CPU_GPU_TYPES:
        c["runtime"] = RUNTIME_OVERHEAD_BYTES
    components = {k: int(round(c[k])) for k in COMPONENT_LABELS if k in c and c[k]}
    method = "full fine-tune" if full else ("QLoRA (NF4 base + LoRA)" if nf4 else "LoRA")
    precision = "" if str(train.mixed_precision) == "no" else f" + {train.mixed_precision} mixed precision"
    describe = (f"{recipe.name} / {method} on {cfg.model.name_or_path} ({cfg.model.preset}), {dtype}{precision}, "
                f"{train.optim}, "
                f"{_count(params['total'])} params, trainable {_count(trainable)} ({100 * trainable / params['total']:.3g}%)")
    return MemoryPlan(
        components=components, params=params, trainable_params=trainable, world_size=W, sharding=sharding,
        dtype=dtype, checkpointing=ckpt, activations_alternative=int(alternative), cpu_offload_bytes=int(offload),
        tokens_per_step=sequences * plan_grpo.sequence_length(cfg) * int(train.gradient_accumulation_steps) * W,
        optim=str(train.optim), describe=describe, notes=notes,
    )


def d_vocab_h(model_config: Mapping[str, Any]) -> int:
    d = _dims(model_config)
    return d["vocab"] * d["h"]


def _packing_notes(cfg: Any) -> list[str]:
    t = cfg.train
    if cfg.recipe.name == "dpo":
        return []
    if not t.packing:
        return ["tokens per step count every row at data.max_length, an upper bound on real tokens (rows are "
                "padded); train.packing=true fills rows with real tokens."]
    notes = [f"train.packing ({t.packing_strategy}): rows hold up to data.max_length real tokens, so tokens per "
             "step are real tokens."]
    flash = str(cfg.model.attn_implementation) in train_options.FLASH_ATTENTION
    if train_options.padding_free(cfg) and not flash:
        notes.append("padding-free batches under sdpa/eager attend over the whole flattened micro-batch "
                     "(b x s tokens, masked): b times the attention FLOPs of flash_attention_2's per-example kernels.")
    return notes


def _count(n: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


SHARDED_COMPONENTS = {
    "zero2": ("gradients", "master_weights", "optimizer"),
    "zero3": ("weights", "quant_constants", "reference_model", "adapters", "gradients", "master_weights", "optimizer"),
}
SHARDED_COMPONENTS["fsdp"] = SHARDED_COMPONENTS["zero3"]


def _shard(components: dict[str, float], sharding: str, world: int, cpu_offload: bool, notes: list[str]) -> float:
    """Divide the sharded components by the world size in place; return the bytes offloaded to CPU."""
    for key in SHARDED_COMPONENTS.get(sharding, ()):
        if key in components:
            components[key] /= world
    if sharding in ("zero3", "fsdp"):
        notes.append("zero3/fsdp also gather one layer's full weights at a time (not counted).")
    if not cpu_offload:
        return 0.0
    if sharding not in SHARDED_COMPONENTS:
        notes.append(f"distributed.cpu_offload is ignored with distributed={sharding}: it needs zero2, zero3 or fsdp.")
        return 0.0
    offloaded = components["optimizer"] + components["master_weights"]
    components["optimizer"] = components["master_weights"] = 0
    return offloaded


def fits(plan: MemoryPlan, gpu_memory_gb: float, headroom: float = 0.1) -> bool:
    """True when the plan's per-GPU total fits in ``gpu_memory_gb`` less a ``headroom`` fraction
    (kept free for allocator fragmentation and transient buffers)."""
    return plan.total_bytes <= float(gpu_memory_gb) * GB * (1.0 - headroom)


# ---------------------------------------------------------------- cost


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


def estimate_cost(cfg: Any, price: Any, tokens_per_second: Optional[float] = None,
                  model_config: Optional[Mapping[str, Any]] = None) -> CostEstimate:
    """Tokens, hours and USD for ``cfg``'s run at ``price`` (an ``orchestrator.cost.Price``).

    ``tokens_per_second`` (all GPUs together, e.g. measured in a trial) replaces
    the rule-of-thumb throughput. ``price`` may be None: hours only.
    """
    if model_config is None:
        model_config = load_model_config(cfg.model.name_or_path, cfg.model.preset, model_cfg=cfg.model)
    from orchestrator.cost_report import estimated_tokens_per_step

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
        basis = (f"{W} x {peak:g} {precision} TFLOPs x {mfu:.0%} MFU / {fpt:.3g} FLOPs per token" if peak
                 else f"no peak TFLOPs known for {cfg.compute.gpu_type!r}; pass a measured tokens/s")
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


def _with_gpu(cfg: Any, gpu_type: str) -> Any:
    """A copy of ``cfg`` on ``gpu_type`` (one GPU per process at least), priced and sized by the
    catalog: compute.price_per_hour and compute.memory_gb are dropped."""
    gpus = max(int(cfg.compute.gpus_per_node or 0), world_size(cfg) // max(1, int(cfg.compute.nodes or 1)), 1)
    change = {"gpu_type": gpu_type, "gpus_per_node": gpus, "price_per_hour": None, "memory_gb": None}
    if dataclasses.is_dataclass(cfg):
        return dataclasses.replace(cfg, compute=dataclasses.replace(cfg.compute, **change))
    from omegaconf import OmegaConf

    return OmegaConf.merge(cfg, {"compute": change})


@dataclass
class GpuOption:
    gpu_type: str
    memory_gb: float
    usd_per_hour_total: Optional[float]
    run_usd: Optional[float]


def gpu_types_that_fit(plan: MemoryPlan, cfg: Any, catalog: Mapping[str, Any], model_config: Mapping[str, Any],
                       headroom: float = 0.1) -> list[GpuOption]:
    """Catalog GPU types whose memory holds ``plan``, cheapest run first to the cent, as the plan prints it (then
    cheapest hour: runs that round alike, a tiny job's all $0.00, are not ordered by a difference nobody sees;
    unpriced last), each priced at cfg's GPU count, spot mode and cloud."""
    from orchestrator.cost import price_for

    options = []
    for gpu_type in sorted(catalog):
        memory = gpu_memory_gb(gpu_type, catalog)
        if memory is None or str(gpu_type).lower() in CPU_GPU_TYPES or not fits(plan, memory, headroom):
            continue
        variant = _with_gpu(cfg, gpu_type)
        try:
            price = price_for(variant.compute, catalog)
        except (ValueError, KeyError):
            price = None
        run = estimate_cost(variant, price, model_config=model_config).usd
        options.append(GpuOption(gpu_type, memory, price.usd_per_hour_total if price else None, run))
    inf = float("inf")
    return sorted(options, key=lambda o: (round(o.run_usd, 2) if o.run_usd is not None else inf,
                                          o.usd_per_hour_total if o.usd_per_hour_total is not None else inf))


# ---------------------------------------------------------------- report


def _gb(n: float) -> str:
    return f"{n / GB:,.2f} GB" if n >= 0.1 * GB else f"{n / 1e6:,.2f} MB"


def format_plan(plan: MemoryPlan, *, gpu_type: str, memory_gb: Optional[float], options: list[GpuOption],
                cost: Optional[CostEstimate], headroom: float = 0.1) -> str:
    """The plan as text: breakdown table, fit verdict (a WARNING line when it will not
    fit), GPU types that fit, and the run's estimated cost, spot vs on-demand."""
    lines = [f"plan: {plan.describe}",
             f"  world size {plan.world_size} (distributed={plan.sharding}), {plan.tokens_per_step:,} tokens per "
             f"optimizer step, gradient checkpointing {'on' if plan.checkpointing else 'off'}", "",
             f"  {'component':<30}{'per GPU':>14}"]
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
            lines.append(f"fit: OK on {gpu_type} ({memory_gb:g} GB; {usable:.1f} GB usable at {headroom:.0%} headroom): "
                         f"{share:.0%} used.")
        else:
            hint = ("turn on train.gradient_checkpointing=true, " if not plan.checkpointing
                    and plan.activations_alternative < plan.components.get("activations", 0) else "")
            lines.append(f"WARNING: will NOT fit on {gpu_type} ({memory_gb:g} GB; {usable:.1f} GB usable): needs "
                         f"{_gb(plan.total_bytes)} per GPU. Fix: {hint}lower train.per_device_batch_size or "
                         "data.max_length, shard (distributed=zero3), or pick a GPU type below.")
    if str(gpu_type).lower() in NO_BF16_GPUS and plan.dtype == "bfloat16":
        lines.append(f"WARNING: {gpu_type} has no bfloat16 support; set model.dtype=float16 (or pick an Ampere+ GPU).")
    if options:
        lines.append("GPU types that fit (cheapest run first, to the cent; then cheapest hour):"
                     if any(o.run_usd is not None for o in options) else "GPU types that fit (cheapest hour first):")
        for o in options:
            hourly = f"${o.usd_per_hour_total:,.2f}/h" if o.usd_per_hour_total is not None else "unpriced"
            run = f"~${o.run_usd:,.2f} for the run" if o.run_usd is not None else ""
            caveat = " (no bf16: set model.dtype=float16)" if o.gpu_type in NO_BF16_GPUS and plan.dtype == "bfloat16" else ""
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
    from orchestrator.cost import load_catalog, price_for

    model_config = load_model_config(cfg.model.name_or_path, cfg.model.preset, model_cfg=cfg.model)
    plan = estimate_memory(cfg, model_config)
    catalog = load_catalog()
    try:
        price = price_for(cfg.compute, catalog)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    gpu_type = str(cfg.compute.gpu_type).lower()
    memory = float(cfg.compute.memory_gb) if cfg.compute.memory_gb else gpu_memory_gb(gpu_type, catalog)
    options = gpu_types_that_fit(plan, cfg, catalog, model_config, headroom)
    cost = estimate_cost(cfg, price, model_config=model_config)
    from orchestrator import plan_spot  # spot against on-demand, interruptions priced

    spot = plan_spot.capacity_plan(cfg, plan, catalog, [o.gpu_type for o in options], variant=_with_gpu,
                                   work_hours=lambda c, p: estimate_cost(c, p, model_config=model_config).hours)
    if as_json:
        return json.dumps(spot)
    return format_plan(plan, gpu_type=gpu_type, memory_gb=memory, options=options, cost=cost, headroom=headroom) \
        + "\n" + plan_spot.format_capacity_plan(spot)


def main(argv: Optional[list[str]] = None) -> int:
    """``orchestrator plan [hydra overrides]``: print the plan. Exit 0, or the error's code (4: bad config)."""
    from orchestrator.cli_common import Parser, fail
    from orchestrator.compose import compose_config

    parser = Parser(prog="orchestrator plan", description="Estimate memory per GPU and cost for a job before "
                    "running it, from the same Hydra overrides as the launch.")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="Hydra overrides, as for the launch: e.g. model=llama-3.1-8b recipe=qlora compute=l40s-spot")
    parser.add_argument("--json", action="store_true",
                        help="print spot against on-demand per GPU type that fits, and the recommendation, as JSON")
    args = parser.parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))
    try:
        print(plan_text(compose_config(args.overrides), as_json=args.json))
    except UserError as err:  # a bad config: the launch's exit code (4)
        return fail(err, err.exit_code)
    return 0


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
    rows = [("parameters", est_params, measured.get("params"), _gb), ("gradients", comp.get("gradients", 0),
            measured.get("grads"), _gb), ("optimizer states", est_opt, measured.get("optimizer"), _gb),
            ("peak memory", plan.total_bytes, measured.get("peak_memory_bytes"), _gb),
            ("step time", est_step, measured.get("step_time_s"), lambda s: f"{s:.3f} s"),
            ("tokens/s", est_tps, measured.get("tokens_per_second"), lambda s: f"{s:,.0f}"),
            ("data-loader wait", None, measured.get("data_wait_s"), lambda s: f"{s:.3f} s/step")]
    lines = [f"trial: {plan.describe}", f"  {'':<18}{'estimate':>14}{'measured':>14}{'ratio':>8}"]
    for label, est, got, fmt in rows:
        ratio = f"{got / est:.2f}" if est and got is not None else ""
        lines.append(f"  {label:<18}{fmt(est) if est is not None else '-':>14}"
                     f"{fmt(got) if got is not None else '-':>14}{ratio:>8}")
    step, wait = measured.get("step_time_s"), measured.get("data_wait_s")
    if step and wait is not None and wait > 0.1 * step:
        lines.append(f"WARNING: the data loader holds up {wait / step:.0%} of each step; raise "
                     "train.dataloader_num_workers (e.g. train.dataloader_num_workers=4) or pre-tokenise the data.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
