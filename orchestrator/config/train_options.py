"""Training options a user brings from ``trl sft`` or Axolotl: what each needs, and the launch checks.

Pure tables and checks, no heavy imports (``importlib.util.find_spec`` only):
the planner reads the optimizer's state size from here, ``launch_checks`` runs the
checks at launch, ``recipes.common`` asks which jobs need bitsandbytes. Names are
the Trainer's (``TrainingArguments.optim``), accelerate's (``mixed_precision``)
and transformers' (``attn_implementation``), so a user's habits carry over.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Optional

from orchestrator.core.errors import ConfigError
from orchestrator.core.gpus import GPUS, is_cpu


@dataclass(frozen=True)
class Optimizer:
    state_bytes: float  # optimizer state per trainable parameter (fp32 parameters)
    package: Optional[str] = None  # module it imports (None: torch's own)
    eight_bit: bool = False  # bitsandbytes/torchao low-bit states


_BNB = "bitsandbytes"
# transformers 5.24's OptimizerNames that a job here can use, with their state size: Adam keeps two fp32
# moments (8 bytes), 8-bit variants two 1-byte ones (a quarter), Lion one moment, AdEMAMix three.
OPTIMIZERS: dict[str, Optimizer] = {
    "adamw_torch": Optimizer(8),
    "adamw_torch_fused": Optimizer(8),
    "adafactor": Optimizer(0.0),
    "sgd": Optimizer(0),
    "adagrad": Optimizer(4),
    "rmsprop": Optimizer(4),
    "adamw_bnb_8bit": Optimizer(2, _BNB, True),
    "adamw_8bit": Optimizer(2, _BNB, True),
    "paged_adamw_32bit": Optimizer(8, _BNB),
    "paged_adamw_8bit": Optimizer(2, _BNB, True),
    "ademamix": Optimizer(12, _BNB),
    "ademamix_8bit": Optimizer(3, _BNB, True),
    "paged_ademamix_32bit": Optimizer(12, _BNB),
    "paged_ademamix_8bit": Optimizer(3, _BNB, True),
    "lion_32bit": Optimizer(4, _BNB),
    "lion_8bit": Optimizer(1, _BNB, True),
    "paged_lion_32bit": Optimizer(4, _BNB),
    "paged_lion_8bit": Optimizer(1, _BNB, True),
    "rmsprop_bnb": Optimizer(4, _BNB),
    "rmsprop_bnb_32bit": Optimizer(4, _BNB),
    "rmsprop_bnb_8bit": Optimizer(1, _BNB, True),
    "adamw_torch_8bit": Optimizer(2, "torchao", True),
    "adamw_torch_4bit": Optimizer(1, "torchao", True),
    "adamw_anyprecision": Optimizer(8, "torchdistx"),
    "grokadamw": Optimizer(12, "grokadamw"),
    "schedule_free_adamw": Optimizer(8, "schedulefree"),
    "schedule_free_radam": Optimizer(8, "schedulefree"),
    "schedule_free_sgd": Optimizer(4, "schedulefree"),
    "stable_adamw": Optimizer(8, "optimi"),
}
# Trainer optimizers this project does not start: they need arguments it does not pass (optim_target_modules,
# the model at construction) or a device of their own.
REFUSED_OPTIMIZERS = {
    "galore_adamw": "needs optim_target_modules",
    "galore_adamw_8bit": "needs optim_target_modules",
    "galore_adafactor": "needs optim_target_modules",
    "galore_adamw_layerwise": "needs optim_target_modules",
    "galore_adamw_8bit_layerwise": "needs optim_target_modules",
    "galore_adafactor_layerwise": "needs optim_target_modules",
    "apollo_adamw": "needs optim_target_modules",
    "apollo_adamw_layerwise": "needs optim_target_modules",
    "lomo": "fuses the update into backward, outside the Trainer's optimizer state",
    "adalomo": "fuses the update into backward, outside the Trainer's optimizer state",
    "adamw_torch_xla": "runs on TPUs (torch_xla) only",
    "adamw_torch_npu_fused": "runs on Ascend NPUs only",
}
# bitsandbytes keeps 32-bit states for tensors smaller than this (its ``min_8bit_size``)
BNB_MIN_8BIT_SIZE = 4096

# attn_implementation -> (module it imports or None, needs a CUDA GPU, GPU types it needs or None)
ATTENTION = {
    "eager": (None, False, None),
    "sdpa": (None, False, None),
    "flex_attention": (None, False, None),
    "flash_attention_2": ("flash_attn", True, None),
    "flash_attention_3": ("flash_attn_interface", True, ("h100-80gb", "h200")),
}
FLASH_ATTENTION = ("flash_attention_2", "flash_attention_3")
# backends whose launcher runs in the training machine's environment (same Python and packages)
SAME_ENVIRONMENT_BACKENDS = ("local", "slurm")


def gpu_job(cfg: Any) -> bool:
    """Whether the job's compute has GPUs (what it will train on, as far as the launcher knows)."""
    return int(cfg.compute.gpus_per_node or 0) > 0 and not is_cpu(cfg.compute.gpu_type)


def uses_bitsandbytes(cfg: Any) -> bool:
    """Whether ``train.optim`` is one of bitsandbytes' optimizers."""
    spec = OPTIMIZERS.get(str(cfg.train.optim))
    return bool(spec and spec.package == _BNB)


def optimizer_state_bytes(name: str) -> float:
    """Optimizer state per trainable parameter; Adam's 8 for a name not in the table."""
    spec = OPTIMIZERS.get(str(name))
    return spec.state_bytes if spec else 8.0


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_optimizer(cfg: Any) -> None:
    name, t = str(cfg.train.optim), cfg.train
    if name in REFUSED_OPTIMIZERS:
        raise ConfigError(
            f"train.optim={name} {REFUSED_OPTIMIZERS[name]}, which this project does not support; "
            "use adamw_torch, adamw_torch_fused, paged_adamw_8bit or adamw_bnb_8bit."
        )
    if name not in OPTIMIZERS:
        raise ConfigError(
            f"train.optim={name!r} is not a Trainer optimizer this project runs; choose one of: "
            f"{', '.join(OPTIMIZERS)}."
        )
    package = OPTIMIZERS[name].package
    if package == "torchao" and not gpu_job(cfg):
        raise ConfigError(f"train.optim={name} (torchao) needs a CUDA GPU; on CPU use adamw_bnb_8bit or adamw_torch.")
    if package and cfg.backend.name in SAME_ENVIRONMENT_BACKENDS and not _installed(package):
        raise ConfigError(
            f"train.optim={name} needs the {package} package, which is not installed here. "
            f"Install it (pip install {package}) or use train.optim=adamw_torch."
        )
    if t.max_grad_norm < 0:
        raise ConfigError(
            f"train.max_grad_norm={t.max_grad_norm} must be at least 0 (0: no clipping); "
            "set e.g. train.max_grad_norm=1.0."
        )


def check_precision(cfg: Any) -> None:
    """accelerate's mixed precision against the job's hardware and the weights' storage dtype."""
    mp, dtype, gpu = str(cfg.train.mixed_precision), str(cfg.model.dtype), str(cfg.compute.gpu_type).lower()
    on_gpu = gpu_job(cfg)
    if mp == "fp16" and not on_gpu:
        raise ConfigError(
            "train.mixed_precision=fp16 needs a CUDA GPU: on CPU accelerate runs neither fp16 autocast "
            "nor loss scaling. Use train.mixed_precision=bf16 (CPU autocast) or no, or pick GPU compute."
        )
    if mp == "bf16" and on_gpu and gpu in GPUS and not GPUS[gpu].bf16:
        raise ConfigError(
            f"train.mixed_precision=bf16 on compute.gpu_type={gpu}: this GPU has no bfloat16 support. "
            "Use train.mixed_precision=fp16 (with loss scaling) and model.dtype=float16 or float32, "
            "or pick an Ampere-or-newer GPU (l4, a10g, a100, h100)."
        )
    if dtype == "float16" and mp != "fp16":
        raise ConfigError(
            f"model.dtype=float16 with train.mixed_precision={mp} trains in half precision without "
            "loss scaling (small gradients underflow to zero). Set train.mixed_precision=fp16 (loss "
            "scaling, GPU), or store the weights as model.dtype=bfloat16 or float32."
        )
    if dtype == "float16" and cfg.recipe.peft == "full":
        raise ConfigError(
            "model.dtype=float16 with recipe.peft=full: the loss scaler cannot unscale float16 "
            "gradients. Store the weights as model.dtype=float32 with train.mixed_precision=fp16."
        )
    if mp == "fp16" and dtype == "bfloat16":
        raise ConfigError(
            "train.mixed_precision=fp16 with model.dtype=bfloat16 would cast bfloat16 weights down to "
            "float16 in every matmul. Use train.mixed_precision=bf16, or model.dtype=float16 or float32."
        )
    if cfg.train.tf32:
        if not on_gpu:
            raise ConfigError(
                "train.tf32=true is a CUDA setting (TF32 matmuls on Ampere-or-newer GPUs); this job "
                "has no GPU. Drop train.tf32 or pick GPU compute."
            )
        if gpu in GPUS and not GPUS[gpu].bf16:
            raise ConfigError(
                f"train.tf32=true on compute.gpu_type={gpu}: TF32 needs an Ampere-or-newer GPU. Drop train.tf32."
            )


def check_attention(cfg: Any) -> None:
    """``model.attn_implementation``: a known kernel, installed, on hardware that runs it."""
    name = cfg.model.attn_implementation
    if name is None:
        return
    name = str(name)
    if "/" in name:  # a hub kernel (kernels-community/...), loaded by the `kernels` package
        if cfg.backend.name in SAME_ENVIRONMENT_BACKENDS and not _installed("kernels"):
            raise ConfigError(
                f"model.attn_implementation={name} is a hub kernel, loaded by the kernels package, "
                "which is not installed here. pip install kernels, or use sdpa."
            )
        return
    if name not in ATTENTION:
        raise ConfigError(
            f"model.attn_implementation={name!r} is not an attention kernel transformers knows; "
            f"choose one of: {', '.join(ATTENTION)} (or a hub kernel, kernels-community/NAME)."
        )
    module, needs_gpu, gpus = ATTENTION[name]
    if needs_gpu and not gpu_job(cfg):
        raise ConfigError(
            f"model.attn_implementation={name} runs on CUDA GPUs only, and this job has no GPU "
            f"(compute={cfg.compute.name}). Use model.attn_implementation=sdpa, or pick GPU compute."
        )
    gpu = str(cfg.compute.gpu_type).lower()
    if gpus and gpu not in gpus:
        raise ConfigError(
            f"model.attn_implementation={name} needs a Hopper GPU ({', '.join(gpus)}); this job runs "
            f"on {gpu}. Use flash_attention_2 or sdpa."
        )
    if module and cfg.backend.name in SAME_ENVIRONMENT_BACKENDS and not _installed(module):
        package = "flash-attn" if module == "flash_attn" else "flash-attn 3 (hopper/ of the flash-attention repo)"
        raise ConfigError(
            f"model.attn_implementation={name} needs the {module} module, which is not installed "
            f"here. Install {package} (pip install flash-attn --no-build-isolation), or use "
            "model.attn_implementation=sdpa."
        )
    if name in FLASH_ATTENTION and str(cfg.train.mixed_precision) == "no" and str(cfg.model.dtype) == "float32":
        raise ConfigError(
            f"model.attn_implementation={name} computes in bfloat16 or float16 only; this job computes "
            "in float32. Set train.mixed_precision=bf16 (or model.dtype=bfloat16), or use sdpa."
        )


def padding_free(cfg: Any) -> bool:
    """Whether TRL flattens each batch into one sequence: padding_free, or packing with a bfd strategy."""
    t = cfg.train
    return bool(t.padding_free or (t.packing and str(t.packing_strategy) in ("bfd", "bfd_split")))


def check_packing(cfg: Any) -> None:
    t = cfg.train
    if not (t.packing or t.padding_free):
        return
    if cfg.recipe.name == "dpo":
        key = "train.packing" if t.packing else "train.padding_free"
        raise ConfigError(
            f"{key}=true works with recipe=sft or qlora only: TRL 1.16's DPOTrainer neither packs "
            "nor trains padding-free. Drop it for DPO."
        )
    if t.packing and str(t.packing_strategy) == "wrapped" and t.padding_free:
        raise ConfigError(
            "train.packing_strategy=wrapped with train.padding_free=true: wrapped rows cut examples "
            "mid-sequence, and padding-free attention would not see the cut. Use packing_strategy=bfd."
        )
    if t.padding_free and not t.packing and int(t.per_device_batch_size) == 1:
        raise ConfigError(
            "train.padding_free=true with train.per_device_batch_size=1 saves nothing (one sequence "
            "has no padding). Raise the batch size, or drop train.padding_free."
        )


def check_workers(cfg: Any) -> None:
    if int(cfg.train.dataloader_num_workers) < 0:
        raise ConfigError(
            f"train.dataloader_num_workers={cfg.train.dataloader_num_workers} must be at least 0 "
            "(0: batches are collated in the training loop)."
        )
    if cfg.data.num_proc is not None and int(cfg.data.num_proc) < 1:
        raise ConfigError(f"data.num_proc={cfg.data.num_proc} must be at least 1 (or null: one process).")


def check_warmup(cfg: Any) -> None:
    ratio = cfg.train.warmup_ratio
    if ratio is None:
        return
    if not 0 <= float(ratio) < 1:
        raise ConfigError(
            f"train.warmup_ratio={ratio} must be in [0, 1): the fraction of the training steps that warm "
            "up. Give e.g. train.warmup_ratio=0.03, or a number of steps as train.warmup_steps."
        )
    if int(cfg.train.warmup_steps) > 0:
        raise ConfigError(
            f"train.warmup_ratio={ratio} and train.warmup_steps={cfg.train.warmup_steps} both set the "
            "warm-up; keep one (drop train.warmup_steps, or train.warmup_ratio)."
        )


CHECKS = (check_optimizer, check_precision, check_attention, check_packing, check_workers, check_warmup)
