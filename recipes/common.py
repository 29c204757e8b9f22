"""Loading and evaluation shared by the recipes: model, tokenizer, LoRA, training arguments.

Kept as plain functions (no base class), so each recipe reads top to bottom.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import ConfigError
from recipes.tiny import TINY_NAME, ensure_tiny_model

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
# The open load timers (``timed_loads``): load_tokenizer and load_model add their seconds to each
_LOAD_TIMERS: contextvars.ContextVar[tuple] = contextvars.ContextVar("load_timers", default=())


@dataclass
class LoadTimer:
    """Seconds spent in ``load_tokenizer`` and ``load_model`` while it was open."""

    seconds: float = 0.0


@contextlib.contextmanager
def timed_loads():
    """``with timed_loads() as loads: build_trainer(...)``: ``loads.seconds`` is the model and tokenizer load
    time inside (the restart split tells the model load from the rest of a recipe's build with it)."""
    timer = LoadTimer()
    token = _LOAD_TIMERS.set((*_LOAD_TIMERS.get(), timer))
    try:
        yield timer
    finally:
        _LOAD_TIMERS.reset(token)


def _count_load(started: float) -> None:
    elapsed = time.monotonic() - started
    for timer in _LOAD_TIMERS.get():
        timer.seconds += elapsed


def quantisation_stack_needed(cfg) -> bool:
    """Whether the job needs bitsandbytes: a quantised base (``recipe.quantization`` other than none)
    or one of its optimizers (``train.optim=paged_adamw_8bit``, ...)."""
    from orchestrator.config.train_options import uses_bitsandbytes

    return str(cfg.recipe.quantization) != "none" or uses_bitsandbytes(cfg)


def resolve_model_path(model_cfg) -> str:
    """A local folder or hub id for ``from_pretrained``; builds the tiny model when asked.

    Raises ConfigError for a local-looking path that does not exist.
    """
    name = model_cfg.name_or_path
    if name == TINY_NAME:
        return str(
            ensure_tiny_model(model_cfg.hidden_size, model_cfg.num_layers, model_cfg.num_heads, model_cfg.vocab_size)
        )
    if name.startswith("builtin:"):
        raise ConfigError(f"model.name_or_path={name!r}: the only built-in model is {TINY_NAME!r}.")
    if name.startswith("s3://"):
        from orchestrator.storage.inputs import local_folder

        folder = local_folder(name)  # downloaded once per attempt, verified
        if not (folder / "config.json").is_file():
            raise ConfigError(
                f"model.name_or_path={name!r} holds no config.json; point it at the folder a model "
                "was saved to (save_pretrained), uploaded whole (aws s3 sync MODEL_DIR URI)."
            )
        return str(folder)
    looks_local = name.startswith(("/", "./", "../", "~")) or os.path.sep in name and Path(name).expanduser().exists()
    if name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().is_dir():
        raise ConfigError(
            f"model.name_or_path={name!r} does not exist. Give an existing local model folder "
            "(with config.json) or a hub id such as Qwen/Qwen2.5-0.5B."
        )
    if looks_local and not (Path(name).expanduser() / "config.json").exists():
        raise ConfigError(f"model.name_or_path={name!r} is a folder without config.json; point it at a saved model.")
    return str(Path(name).expanduser()) if looks_local else name


def torch_dtype(model_cfg):
    import torch

    if model_cfg.dtype not in _DTYPES:
        raise ConfigError(f"model.dtype={model_cfg.dtype!r}; choose one of {sorted(_DTYPES)}.")
    return getattr(torch, _DTYPES[model_cfg.dtype])


def load_tokenizer(
    path: str, trust_remote_code: bool = False, *, revision: str | None = None, chat_template: str | None = None
):
    """The model's tokenizer (at ``model.revision``), with ``data.chat_template`` in place of its own when set."""
    from transformers import AutoTokenizer

    from recipes.data import chat_template_text

    started = time.monotonic()
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, revision=revision)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    template = chat_template_text(chat_template)
    if template is not None:
        tok.chat_template = template
    _count_load(started)
    return tok


def tokenizer_for(cfg, path: str):
    """``load_tokenizer`` with the job's model revision and chat template."""
    return load_tokenizer(
        path, cfg.model.trust_remote_code, revision=cfg.model.revision, chat_template=cfg.data.chat_template
    )


_AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def compute_dtype(model_cfg, mixed_precision: str):
    """The dtype matmuls run in: the autocast dtype under mixed precision, else the storage dtype
    (what bitsandbytes dequantises a 4-bit weight to)."""
    import torch

    name = _AMP_DTYPES.get(str(mixed_precision))
    return getattr(torch, name) if name else torch_dtype(model_cfg)


def load_model(path: str, model_cfg, *, quantization: str = "none", mixed_precision: str = "no"):
    """``from_pretrained`` with the configured dtype, revision and attention kernel; ``quantization='nf4'``
    loads a 4-bit bitsandbytes base that dequantises to the compute dtype (``compute_dtype``)."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    kwargs = {
        "dtype": torch_dtype(model_cfg),
        "trust_remote_code": model_cfg.trust_remote_code,
        "revision": model_cfg.revision,
    }
    if model_cfg.attn_implementation:
        kwargs["attn_implementation"] = str(model_cfg.attn_implementation)
    if quantization == "nf4":
        compute = compute_dtype(model_cfg, mixed_precision)
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute,
        )
        if torch.cuda.is_available():
            kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", 0))}
    elif quantization != "none":
        raise ConfigError(f"recipe.quantization={quantization!r}; choose none or nf4.")
    started = time.monotonic()
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as err:
        raise ConfigError(
            f"model.name_or_path={path!r} could not be loaded ({err}). Check the hub id, revision or local folder; "
            "without network use a local folder or the built-in model=tiny."
        ) from None
    except (ImportError, ValueError) as err:
        if not model_cfg.attn_implementation:
            raise
        # a kernel missing from this machine (a container image without flash-attn), or one the model refuses
        raise ConfigError(
            f"model.attn_implementation={model_cfg.attn_implementation} cannot be used here: "
            f"{str(err).strip().splitlines()[0]} Install the kernel in this environment, or use "
            "model.attn_implementation=sdpa."
        ) from None
    if quantization == "nf4":
        keep_4bit_training_layout(model)
    _count_load(started)
    return model


def keep_4bit_training_layout(model) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for CPU inference; returns how many layers it affects.

    On a CPU with AVX512-BF16, a ``Linear4bit`` that runs in eval mode without
    gradients (the "before training" evaluation) repacks its weight for
    inference, with a bf16 quantisation state, and keeps that layout until its
    state dict is saved; the way back is not exact. Training on from it computes
    differently: an uninterrupted run would depend on when it first saved, and
    a resumed one (which never evaluated before training) would part from it.
    With the repacking off, every forward uses the layout it was loaded in.
    GPU runs never repack (bitsandbytes does this on CPU only).
    """
    layers = [m for m in model.modules() if hasattr(m, "support_avx512bf16_for_cpu")]
    for module in layers:
        module.support_avx512bf16_for_cpu = False
    return len(layers)


def lora_config(recipe_cfg):
    from peft import LoraConfig

    return LoraConfig(
        r=recipe_cfg.lora_r,
        lora_alpha=recipe_cfg.lora_alpha,
        lora_dropout=recipe_cfg.lora_dropout,
        target_modules=list(recipe_cfg.lora_target_modules),
        task_type="CAUSAL_LM",
    )


# TrainingArguments' name -> the ``train.`` key it takes as is
_TRAIN_ARGS = {
    "num_train_epochs": "num_epochs",
    "per_device_train_batch_size": "per_device_batch_size",
    "per_device_eval_batch_size": "per_device_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "learning_rate": "learning_rate",
    "lr_scheduler_type": "lr_scheduler",
    "warmup_steps": "warmup_steps",
    "weight_decay": "weight_decay",
    "optim": "optim",
    "max_grad_norm": "max_grad_norm",
    "seed": "seed",
    "data_seed": "seed",
    "logging_steps": "logging_steps",
    "dataloader_num_workers": "dataloader_num_workers",
    "activation_checkpointing": "gradient_checkpointing",
}


def training_kwargs(cfg, output_dir: str) -> dict:
    """Arguments shared by SFTConfig and DPOConfig.

    Saving is left to the orchestrator's callback (``save_strategy='no'`` here;
    the callback asks the Trainer to save on its own schedule), and reporting
    to the orchestrator's MLflow tracker, so ``report_to`` is empty. Precision is
    ``train.mixed_precision`` alone, never implied by ``model.dtype``: TRL's
    configs default ``bf16`` to true, so both flags are always given.
    """
    import torch

    from recipes.evaluation import quality_args

    t = cfg.train
    cuda = torch.cuda.is_available()
    kw = {arg: getattr(t, key) for arg, key in _TRAIN_ARGS.items()}
    if t.warmup_ratio is not None:  # transformers 5 reads a warmup_steps below 1 as the fraction of the steps
        kw["warmup_steps"] = float(t.warmup_ratio)
    kw.update(
        output_dir=output_dir,
        max_steps=t.max_steps if t.max_steps > 0 else -1,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        use_cpu=not cuda,
        dataset_num_proc=cfg.data.num_proc,
        disable_tqdm=True,
        max_length=cfg.data.max_length,
        save_only_model=False,
    )
    kw.update(precision_kwargs(t, cuda))
    kw.update(distributed_kwargs(cfg.distributed, cuda))
    kw.update(quality_args(cfg))  # evaluation during training, early stopping
    return kw


def precision_kwargs(train_cfg, cuda: bool) -> dict:
    """``bf16``/``fp16``/``tf32`` for TrainingArguments from ``train.mixed_precision`` and ``train.tf32``.

    fp16 makes accelerate scale the loss (a GradScaler, whose state the Trainer saves as scaler.pt in
    every checkpoint and loads on resume). Checked at launch against compute; checked again here
    against the machine the attempt landed on.
    """
    import torch

    mp = str(train_cfg.mixed_precision)
    if mp == "fp16" and not cuda:
        raise ConfigError(
            "train.mixed_precision=fp16 needs a CUDA GPU, and this machine has none (accelerate runs "
            "no fp16 autocast or loss scaling on CPU). Use train.mixed_precision=bf16 or no."
        )
    if mp == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"train.mixed_precision=bf16 on {torch.cuda.get_device_name(0)}, which has no bfloat16 "
            "support. Use train.mixed_precision=fp16, or an Ampere-or-newer GPU."
        )
    kw = {"bf16": mp == "bf16", "fp16": mp == "fp16"}
    if train_cfg.tf32 is not None and cuda:
        kw["tf32"] = bool(train_cfg.tf32)
    return kw


def deepspeed_config(stage: int, cpu_offload: bool) -> dict:
    """A DeepSpeed ZeRO config; "auto" lets the Trainer fill sizes and precision (a fixed
    bf16 setting is refused as a mismatch with TRL's own)."""
    zero: dict = {"stage": stage, "overlap_comm": False, "contiguous_gradients": True}
    if cpu_offload:
        zero["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    return {
        "zero_optimization": zero,
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
    }


def distributed_kwargs(dist_cfg, cuda: bool) -> dict:
    """Trainer arguments for the ``distributed`` group (the ranks are started by torchrun)."""
    name = dist_cfg.name
    if name == "none":
        return {}
    kw: dict = {"ddp_backend": "nccl" if cuda else "gloo"}
    if name in ("zero2", "zero3"):
        kw["deepspeed"] = deepspeed_config(2 if name == "zero2" else 3, dist_cfg.cpu_offload)
    elif name == "fsdp":
        kw["fsdp"] = "full_shard auto_wrap" + (" offload" if dist_cfg.cpu_offload else "")
    return kw
