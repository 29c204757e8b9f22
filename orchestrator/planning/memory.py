"""Per-GPU memory estimate of a job: bytes by component, sharding, activations, and whether it fits.

Computed from the model's ``config.json`` alone (never weights) and the composed job config. Units: bytes;
"GB" means 1e9 bytes everywhere. ``orchestrator.planning.plan`` prints it; ``orchestrator.planning.cost`` prices it.

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

Optimizer states (``train.optim``, table in ``orchestrator.config.train_options``):
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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from orchestrator.config import train_options
from orchestrator.core.errors import ConfigError
from orchestrator.core.gpus import CPU_TYPES
from orchestrator.planning import grpo as plan_grpo
from orchestrator.planning.model_shape import _dims, count_parameters, load_model_config, lora_parameters

GB = 1e9
NF4_BITS_PER_PARAM = 4
NF4_BLOCKSIZE = 64
NF4_DOUBLE_QUANT_BLOCKSIZE = 256
NF4_CONSTANT_BITS_PER_PARAM = 8 / NF4_BLOCKSIZE + 32 / (NF4_BLOCKSIZE * NF4_DOUBLE_QUANT_BLOCKSIZE)
ADAM_STATE_BYTES_PER_PARAM = 8  # exp_avg + exp_avg_sq, fp32
ADAPTER_BYTES_PER_PARAM = 4  # LoRA weights and their grads are fp32
RUNTIME_OVERHEAD_BYTES = int(1 * GB)
MASK_BYTES_PER_ELEMENT = 1  # the boolean attention mask of a padding-free batch under sdpa/eager
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
CPU_GPU_TYPES = CPU_TYPES
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


def activation_bytes(
    config: Mapping[str, Any],
    seq_len: int,
    micro_batch: int,
    dtype_bytes: int,
    checkpointing: bool,
    *,
    attention: Optional[str] = None,
    padding_free: bool = False,
) -> int:
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
    nodes: int = 1  # machines the world size spans (sharded states are divided over all of their ranks)

    @property
    def total_bytes(self) -> int:
        return sum(self.components.values())


def world_size(cfg: Any) -> int:
    """Training processes (one GPU each); see ``orchestrator.core.ranks.configured_world_size``."""
    from orchestrator.core.ranks import configured_world_size

    return configured_world_size(cfg)


def estimate_memory(cfg: Any, model_config: Optional[Mapping[str, Any]] = None) -> MemoryPlan:
    """Per-GPU memory of the job ``cfg`` (a composed config; see the module docstring).

    ``model_config`` is the config.json dict; loaded with :func:`load_model_config` when None.
    Raises ConfigError for an unknown dtype or a quantised full fine-tune.
    """
    if model_config is None:
        model_config = load_model_config(cfg.model.name_or_path, cfg.model.preset, model_cfg=cfg.model)
    train = cfg.train
    dtype = _checked_dtype(cfg)
    params = count_parameters(model_config)
    W, sharding = world_size(cfg), str(cfg.distributed.name)
    notes: list[str] = []

    c, trainable = _model_state(cfg, model_config, params)
    if train_options.OPTIMIZERS.get(str(train.optim), train_options.OPTIMIZERS["adamw_torch"]).eight_bit:
        notes.append(
            f"train.optim={train.optim} keeps 8-bit states; bitsandbytes keeps 32-bit ones for tensors "
            f"under {train_options.BNB_MIN_8BIT_SIZE} elements (counted here as 8-bit)."
        )

    offload = _shard(c, sharding, W, bool(cfg.distributed.cpu_offload), notes)

    sequences = int(train.per_device_batch_size) * (2 if cfg.recipe.name == "dpo" else 1)
    ckpt = bool(train.gradient_checkpointing)
    compute = compute_width(cfg)
    c["generation_cache"] = plan_grpo.generation_cache_bytes(cfg, model_config, compute)
    c["activations"] = _activations(cfg, model_config, sequences, compute, ckpt)
    alternative = _activations(cfg, model_config, sequences, compute, not ckpt)
    notes += _packing_notes(cfg)
    if str(cfg.compute.gpu_type).lower() not in CPU_GPU_TYPES:
        c["runtime"] = RUNTIME_OVERHEAD_BYTES
    components = {k: int(round(c[k])) for k in COMPONENT_LABELS if k in c and c[k]}
    return MemoryPlan(
        components=components,
        params=params,
        trainable_params=trainable,
        world_size=W,
        sharding=sharding,
        dtype=dtype,
        checkpointing=ckpt,
        activations_alternative=int(alternative),
        cpu_offload_bytes=int(offload),
        tokens_per_step=sequences * plan_grpo.sequence_length(cfg) * int(train.gradient_accumulation_steps) * W,
        optim=str(train.optim),
        describe=_describe(cfg, params, trainable),
        notes=notes,
        nodes=1 if sharding == "none" else max(1, int(cfg.distributed.nodes)),
    )


def _checked_dtype(cfg: Any) -> str:
    """``model.dtype``, after the two precision errors a plan cannot be made for (ConfigError)."""
    dtype = str(cfg.model.dtype)
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"model.dtype={dtype!r} is not one of float32, bfloat16, float16.")
    if cfg.recipe.peft == "full" and cfg.recipe.quantization == "nf4":
        raise ConfigError("recipe.quantization=nf4 needs recipe.peft=lora: a 4-bit base cannot be fully fine-tuned.")
    return dtype


def _model_state(cfg: Any, model_config: Mapping[str, Any], params: Mapping[str, int]) -> tuple[dict[str, float], int]:
    """Bytes of the weights, reference model, adapters, gradients, master weights, optimizer states and autocast
    copies (unsharded), and the trainable parameter count."""
    recipe = cfg.recipe
    width = DTYPE_BYTES[str(cfg.model.dtype)]
    full, nf4 = recipe.peft == "full", recipe.quantization == "nf4"
    c: dict[str, float] = {}
    if nf4:
        c["weights"] = (
            params["linear_weights"] * NF4_BITS_PER_PARAM / 8 + (params["total"] - params["linear_weights"]) * width
        )
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
    c["optimizer"] = trainable * train_options.optimizer_state_bytes(cfg.train.optim)
    compute = compute_width(cfg)
    if compute < width and not nf4:  # float32 weights under autocast: a 16-bit copy of each matmul weight
        c["autocast_copies"] = (
            params["total"]
            - params["embeddings"]
            - params["norms"]
            + (d_vocab_h(model_config) if not params["lm_head"] else 0)
        ) * compute
    return c, trainable


def _activations(cfg: Any, model_config: Mapping[str, Any], sequences: int, compute: int, checkpointing: bool) -> int:
    """:func:`activation_bytes` for ``cfg``'s sequence length, attention and padding-free batches."""
    return activation_bytes(
        model_config,
        plan_grpo.sequence_length(cfg),
        sequences,
        compute,
        checkpointing,
        attention=cfg.model.attn_implementation,
        padding_free=train_options.padding_free(cfg),
    )


def _describe(cfg: Any, params: Mapping[str, int], trainable: int) -> str:
    """The plan's one-line title: recipe, method, model, precision, optimizer, parameter counts."""
    recipe, train = cfg.recipe, cfg.train
    full, nf4 = recipe.peft == "full", recipe.quantization == "nf4"
    method = "full fine-tune" if full else ("QLoRA (NF4 base + LoRA)" if nf4 else "LoRA")
    precision = "" if str(train.mixed_precision) == "no" else f" + {train.mixed_precision} mixed precision"
    return (
        f"{recipe.name} / {method} on {cfg.model.name_or_path} ({cfg.model.preset}), "
        f"{cfg.model.dtype}{precision}, {train.optim}, "
        f"{_count(params['total'])} params, trainable {_count(trainable)} ({100 * trainable / params['total']:.3g}%)"
    )


def d_vocab_h(model_config: Mapping[str, Any]) -> int:
    d = _dims(model_config)
    return d["vocab"] * d["h"]


def _packing_notes(cfg: Any) -> list[str]:
    t = cfg.train
    if cfg.recipe.name == "dpo":
        return []
    if not t.packing:
        return [
            "tokens per step count every row at data.max_length, an upper bound on real tokens (rows are "
            "padded); train.packing=true fills rows with real tokens."
        ]
    notes = [
        f"train.packing ({t.packing_strategy}): rows hold up to data.max_length real tokens, so tokens per "
        "step are real tokens."
    ]
    flash = str(cfg.model.attn_implementation) in train_options.FLASH_ATTENTION
    if train_options.padding_free(cfg) and not flash:
        notes.append(
            "padding-free batches under sdpa/eager attend over the whole flattened micro-batch "
            "(b x s tokens, masked): b times the attention FLOPs of flash_attention_2's per-example kernels."
        )
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
