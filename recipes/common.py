"""Loading and evaluation shared by the recipes: model, tokenizer, LoRA, training arguments.

Kept as plain functions (no base class), so each recipe reads top to bottom.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from orchestrator.errors import ConfigError
from recipes.tiny import TINY_NAME, ensure_tiny_model

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
# Seconds this process spent in load_tokenizer and load_model: the orchestrator's restart split
# (orchestrator.attempt.restart) reads it around a recipe's build to tell the model load from the rest.
LOAD_SECONDS = {"total": 0.0}


def quantisation_stack_needed(cfg) -> bool:
    """Whether the job loads a quantised base (bitsandbytes): ``recipe.quantization`` other than none."""
    return str(cfg.recipe.quantization) != "none"


def resolve_model_path(model_cfg) -> str:
    """A local folder or hub id for ``from_pretrained``; builds the tiny model when asked.

    Raises ConfigError for a local-looking path that does not exist.
    """
    name = model_cfg.name_or_path
    if name == TINY_NAME:
        return str(ensure_tiny_model(model_cfg.hidden_size, model_cfg.num_layers, model_cfg.num_heads, model_cfg.vocab_size))
    if name.startswith("builtin:"):
        raise ConfigError(f"model.name_or_path={name!r}: the only built-in model is {TINY_NAME!r}.")
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


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    started = time.monotonic()
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    LOAD_SECONDS["total"] += time.monotonic() - started
    return tok


def load_model(path: str, model_cfg, *, quantization: str = "none"):
    """``from_pretrained`` with the configured dtype; ``quantization='nf4'`` loads a 4-bit bitsandbytes base."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    kwargs = {"dtype": torch_dtype(model_cfg), "trust_remote_code": model_cfg.trust_remote_code}
    if quantization == "nf4":
        compute = torch.bfloat16 if torch.cuda.is_available() and model_cfg.dtype == "bfloat16" else torch.float32
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
            f"model.name_or_path={path!r} could not be loaded ({err}). Check the hub id or local folder; "
            "without network use a local folder or the built-in model=tiny."
        ) from None
    if quantization == "nf4":
        keep_4bit_training_layout(model)
    LOAD_SECONDS["total"] += time.monotonic() - started
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


def training_kwargs(cfg, output_dir: str) -> dict:
    """Arguments shared by SFTConfig and DPOConfig.

    Saving is left to the orchestrator's callback (``save_strategy='no'`` here;
    the callback asks the Trainer to save on its own schedule), and reporting
    to the orchestrator's MLflow tracker, so ``report_to`` is empty.
    """
    import torch

    t = cfg.train
    cuda = torch.cuda.is_available()
    bf16 = cuda and cfg.model.dtype == "bfloat16"
    kw = dict(
        output_dir=output_dir,
        max_steps=t.max_steps if t.max_steps > 0 else -1,
        num_train_epochs=t.num_epochs,
        per_device_train_batch_size=t.per_device_batch_size,
        per_device_eval_batch_size=t.per_device_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        warmup_steps=t.warmup_steps,
        weight_decay=t.weight_decay,
        seed=t.seed,
        data_seed=t.seed,
        logging_steps=t.logging_steps,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        bf16=bf16,
        fp16=False,
        use_cpu=not cuda,
        dataloader_num_workers=0,
        disable_tqdm=True,
        activation_checkpointing=t.gradient_checkpointing,
        max_length=cfg.data.max_length,
        save_only_model=False,
    )
    kw.update(distributed_kwargs(cfg.distributed, cuda))
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


_NUMBER = re.compile(r"-?\d+")


def generation_accuracy(model, tokenizer, prompts: list[str], answers: list[str], max_new_tokens: int = 8, batch_size: int = 32) -> float:
    """Exact-match accuracy of greedy generations: the first number (or word) generated equals the answer."""
    import torch

    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    correct = 0
    device = next(p for p in model.parameters()).device
    try:
        for i in range(0, len(prompts), batch_size):
            batch = prompts[i : i + batch_size]
            enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            with torch.no_grad():
                out = model.generate(
                    **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
                )
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            for text, want in zip(texts, answers[i : i + batch_size]):
                correct += _first_answer(text) == _first_answer(want)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return correct / max(1, len(prompts))



def _first_answer(text: str) -> str:
    m = _NUMBER.search(text)
    if m:
        return m.group(0)
    words = text.strip().split()
    return words[0] if words else ""


def eval_prompts(eval_dataset, tokenizer) -> tuple[list[str], list[str]]:
    """Prompts and reference answers from a held-out split of any supported format."""
    prompts, answers = [], []
    for row in eval_dataset:
        if "messages" in row:
            msgs = row["messages"]
            prompts.append(tokenizer.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True))
            answers.append(msgs[-1]["content"])
        else:
            prompts.append(row["prompt"] if isinstance(row["prompt"], str) else tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True))
            ans = row.get("completion", row.get("chosen"))
            answers.append(ans if isinstance(ans, str) else ans[-1]["content"])
    return prompts, answers
