"""The config boundary: compose ``conf/`` with the overrides against the typed schemas, and validate.

``launch``, ``plan`` and ``worker`` import this module; it imports none of them.
Every config error is found here, at launch, and raised as ``ConfigError``
(exit 4, never requeued) with the key and the fix in the message.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from orchestrator.config import register_configs
from orchestrator.durations import parse_duration
from orchestrator.errors import ConfigError

CHOICES = {
    "recipe.name": ("sft", "dpo", "qlora"),
    "recipe.peft": ("lora", "full"),
    "recipe.quantization": ("none", "nf4"),
    "data.source": ("synthetic", "jsonl", "hub"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "preemption.provider": ("auto", "aws", "gcp", "azure", "none"),
    "backend.name": ("local", "slurm", "skypilot", "kubernetes"),
    "distributed.name": ("none", "ddp", "zero2", "zero3", "fsdp"),
}


def conf_dir() -> Path:
    """The config tree: ``$ORCH_CONF_DIR`` or the repository's ``conf/``."""
    env = os.environ.get("ORCH_CONF_DIR")
    return Path(env).resolve() if env else Path(__file__).resolve().parents[1] / "conf"


def compose_config(overrides: list[str]) -> DictConfig:
    """Compose and validate the job config. Raises ConfigError with the fix in the message."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(_explain(err)) from None
    finally:
        GlobalHydra.instance().clear()
    validate(cfg)
    return cfg


def _explain(err: Exception) -> str:
    """Turn Hydra's and OmegaConf's errors into one paragraph naming the key and the valid choices."""
    text = str(err).strip()
    cause = str(err.__cause__).strip().splitlines()[0] if err.__cause__ else ""
    m = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    if m:
        group, choice = m.groups()
        options = sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))
        return f"{group}={choice} is not a known {group}; choose one of: {', '.join(options)} (the files in conf/{group}/)."
    m = re.search(r"Could not override '([^']+)'", text)
    if m:
        key = m.group(1)
        parent, _, leaf = key.rpartition(".")
        valid = _schema_keys(parent)
        if valid is None:
            return f"{key}: there is no config group {parent or leaf!r}; the groups are: {', '.join(_schema_keys('') or [])}."
        return f"{key}: {parent!r} has no key {leaf!r}; its keys are: {', '.join(valid)}."
    m = re.search(r"Error merging override (\S+)", text)
    if m:
        return f"{m.group(1)}: {cause or text}. Give a value of the field's type (see the config reference in README.md)."
    return f"{text} {cause}".strip()


def _schema_keys(path: str) -> list[str] | None:
    from orchestrator.config import Config

    node = OmegaConf.structured(Config)
    sub = OmegaConf.select(node, path) if path else node
    if not isinstance(sub, DictConfig):
        return None
    return list(sub.keys())


def validate(cfg: DictConfig) -> None:
    """Cross-field checks the schemas cannot express. Raises ConfigError."""
    from omegaconf.errors import MissingMandatoryValue

    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} is required but not set. Set it on the command line: {err.full_key}=VALUE.") from None
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not a valid choice; choose one of: {', '.join(allowed)}.")
    if cfg.recipe.peft == "full" and cfg.recipe.name != "sft":
        raise ConfigError(f"recipe.peft=full works with recipe=sft only; {cfg.recipe.name} trains LoRA adapters.")
    if cfg.recipe.name == "qlora" and cfg.recipe.quantization != "nf4":
        raise ConfigError("recipe=qlora needs recipe.quantization=nf4 (a 4-bit base); use recipe=sft for an unquantised base.")
    if cfg.data.source in ("jsonl", "hub") and not cfg.data.path:
        raise ConfigError(f"data={cfg.data.source} needs data.path (a JSONL file or a hub dataset id).")
    if cfg.data.source == "jsonl":
        from recipes.data import check_jsonl

        check_jsonl(cfg.data.path, cfg.recipe.name)  # raises DataError naming the file and the fix
    for key in ("checkpoint.every", "preemption.grace", "tracking.system_metrics_every", "tracking.job_metrics_every"):
        try:
            parse_duration(OmegaConf.select(cfg, key), key=key)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    positive = ["train.per_device_batch_size", "train.gradient_accumulation_steps", "checkpoint.keep_last",
                "compute.nodes", "distributed.processes_per_node", "distributed.nodes"]
    for key in positive:
        if OmegaConf.select(cfg, key) < 1:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)} must be at least 1.")
    if cfg.checkpoint.keep_last < 2:
        # the newest may still be uploading when retention runs, so one is not enough (after torchtitan)
        raise ConfigError("checkpoint.keep_last must be at least 2: the newest checkpoint may still be uploading.")
    if cfg.train.max_steps <= 0 and cfg.train.num_epochs <= 0:
        raise ConfigError("set train.max_steps > 0 or train.num_epochs > 0.")
    if not cfg.run.name or "/" in cfg.run.name:
        raise ConfigError(f"run.name={cfg.run.name!r} must be a non-empty name without '/'.")
    if cfg.budget.max_usd is not None and cfg.budget.max_usd <= 0:
        raise ConfigError("budget.max_usd must be positive (or null for no budget).")
    check_lr_scheduler(cfg)
    if cfg.model.name_or_path.startswith(("/", "./", "../", "~")) and not Path(cfg.model.name_or_path).expanduser().is_dir():
        raise ConfigError(
            f"model.name_or_path={cfg.model.name_or_path!r} does not exist. Give an existing local model folder "
            "(with config.json) or a hub id such as Qwen/Qwen2.5-0.5B."
        )


DEFAULT_LR_SCHEDULER = "linear"


def check_lr_scheduler(cfg: DictConfig) -> None:
    """Refuse a ``train.lr_scheduler`` the Trainer would refuse, by asking transformers itself.

    The name must be one of transformers' ``SchedulerType`` values, and
    ``get_scheduler`` must build it with what the recipes pass (warm-up and
    training steps, no ``lr_scheduler_kwargs``): cosine_with_min_lr, for one,
    needs a kwarg. reduce_lr_on_plateau and greedy step on evaluation metrics,
    and TrainingArguments refuses them without an eval strategy, which the
    recipes do not set. The default is not checked: importing transformers
    costs seconds at launch. Raises ConfigError.
    """
    name = cfg.train.lr_scheduler
    if name == DEFAULT_LR_SCHEDULER:
        return
    import torch
    from transformers.optimization import get_scheduler
    from transformers.trainer_utils import SchedulerType

    names = [s.value for s in SchedulerType]
    usable = "linear, cosine, cosine_with_restarts, polynomial, constant, constant_with_warmup, inverse_sqrt"
    if name not in names:
        raise ConfigError(f"train.lr_scheduler={name!r} is not a transformers scheduler; choose one of: {usable} "
                          f"(transformers knows: {', '.join(names)}).")
    if name in (SchedulerType.REDUCE_ON_PLATEAU.value, SchedulerType.GREEDY.value):
        raise ConfigError(f"train.lr_scheduler={name!r} steps on evaluation metrics, and the recipes do not "
                          f"evaluate during training; choose one of: {usable}.")
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    steps = max(1, int(cfg.train.max_steps))
    try:
        get_scheduler(name, optimizer=optimizer, num_warmup_steps=int(cfg.train.warmup_steps), num_training_steps=steps)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"train.lr_scheduler={name!r} needs arguments this job does not pass ({err}); choose one "
                          f"of: {usable}.") from None


def absolutize(overrides: list[str]) -> list[str]:
    """Pin a relative local storage.uri to the launch directory, so every attempt and backend agrees."""
    out = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key in ("storage.uri", "data.path") and value and "://" not in value and not value.startswith("/"):
            value = str(Path(value).expanduser().resolve())
            item = f"{key}={value}"
        out.append(item)
    return out


def with_default_storage(cfg: DictConfig, overrides: list[str]) -> list[str]:
    if not any(o.startswith("storage.uri=") for o in overrides):
        uri = cfg.storage.uri
        if "://" not in uri and not uri.startswith("/"):
            overrides = overrides + [f"storage.uri={Path(uri).resolve()}"]
    return overrides
