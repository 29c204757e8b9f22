"""TRL's option names on the command line, and ``+key`` overrides that nothing would read.

A TRL user writes ``train.per_device_train_batch_size=4`` or ``+train.warmup_ratio=0.03`` (TrainingArguments',
SFTConfig's and GRPOConfig's names). ``rewrite`` turns each such override into the project's own key before Hydra
composes it (``train.per_device_batch_size=4``), so the value takes effect; ``+``/``++`` on a key the schema has
is the plain override. ``check_added`` refuses a ``+key`` that no schema field holds (Hydra would add it and
nothing would read it): one line naming the key and what to use instead, a ``ConfigError`` (exit 4).
"""

from __future__ import annotations

import difflib
import functools
from typing import Any, Optional, cast

from omegaconf import DictConfig, ListConfig, OmegaConf

from orchestrator.core.errors import ConfigError

# TRL's name (under train.) -> the project's key that takes the value as is
_RENAMED = {
    "per_device_train_batch_size": "train.per_device_batch_size",
    "num_train_epochs": "train.num_epochs",
    "lr_scheduler_type": "train.lr_scheduler",
    "max_length": "data.max_length",
    "max_seq_length": "data.max_length",
    "dataset_num_proc": "data.num_proc",
    "save_steps": "checkpoint.every_steps",
    "save_total_limit": "checkpoint.keep_last",
    "model_name_or_path": "model.name_or_path",
    "model_revision": "model.revision",
    "dtype": "model.dtype",
    "torch_dtype": "model.dtype",
    "attn_implementation": "model.attn_implementation",
    "trust_remote_code": "model.trust_remote_code",
}
# the recipe's own keys a TRL config holds beside the training arguments (ModelConfig's LoRA, GRPOConfig's, DPOConfig's)
_RECIPE = (
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "reward_funcs",
    "reward_weights",
    "num_generations",
    "steps_per_generation",
    "generation_batch_size",
    "num_iterations",
    "max_completion_length",
    "temperature",
    "use_vllm",
    "vllm_mode",
    "precompute_ref_log_probs",
)
ALIASES = {f"train.{name}": key for name, key in _RENAMED.items()} | {f"train.{n}": f"recipe.{n}" for n in _RECIPE}
# the train. keys that are TRL's own names too: written bare (learning_rate=1e-4), they are train.'s
_TRAIN_AS_TRL = (
    "max_steps",
    "gradient_accumulation_steps",
    "learning_rate",
    "warmup_steps",
    "warmup_ratio",
    "weight_decay",
    "seed",
    "logging_steps",
    "eval_steps",
    "gradient_checkpointing",
    "packing",
    "packing_strategy",
    "padding_free",
    "tf32",
    "optim",
    "max_grad_norm",
    "dataloader_num_workers",
)
# TRL's options the orchestrator sets itself -> what to use instead
INSTEAD = {
    "output_dir": "the job's folders are storage.uri (checkpoints, final weights) and run.work_dir (scratch)",
    "save_strategy": "checkpoints are the orchestrator's: checkpoint.every (wall clock, or auto) and checkpoint.every_steps",
    "eval_strategy": "set train.eval_steps (0: evaluate at the end only) and train.eval_at_end",
    "evaluation_strategy": "set train.eval_steps (0: evaluate at the end only) and train.eval_at_end",
    "report_to": "MLflow is the tracker: tracking.enabled, tracking.uri, tracking.experiment",
    "push_to_hub": "the final weights go to <storage.uri>/<run.name>/final/ (checkpoint.save_final_weights)",
    "resume_from_checkpoint": "relaunch with the same run.name: the job resumes from its last committed checkpoint",
    "use_peft": "set recipe.peft=lora or recipe.peft=full",
    "load_in_4bit": "set recipe.quantization=nf4 (or recipe=qlora)",
    "dataset_name": "set data=hub data.path=<dataset id>",
    "per_device_eval_batch_size": "evaluation batches are train.per_device_batch_size",
    "deepspeed": "choose distributed=zero2, zero3 or fsdp",
    "fsdp": "choose distributed=fsdp",
    "num_processes": "set distributed.processes_per_node",
}
# TRL's precision flags -> train.mixed_precision's value when true
_PRECISION = {"train.bf16": "bf16", "train.fp16": "fp16"}
_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


# Hydra's runtime keys -> what this project uses instead (the launcher composes conf/ itself: no Hydra app)
_HYDRA_FIX = (
    (
        ("hydra.run", "hydra.sweep.dir", "hydra.output_subdir", "hydra.job.chdir", "hydra.runtime"),
        "the job's folders are run.work_dir (local scratch) and storage.uri (checkpoints, ledger, final weights)",
    ),
    (("hydra/launcher", "hydra.launcher"), "choose where the job runs with backend=local|slurm|skypilot|kubernetes"),
    (
        ("hydra/sweeper", "hydra.sweeper", "hydra.sweep", "hydra.mode"),
        "sweep with -m and a=1,2 grids, or sweep=asha with sweep.params (docs/sweeps.md)",
    ),
    (
        ("hydra/job_logging", "hydra/hydra_logging", "hydra.job_logging", "hydra.hydra_logging", "hydra.verbose"),
        "set the log level with ORCH_LOG_LEVEL=DEBUG",
    ),
)


def refuse_hydra(overrides: list[str]) -> None:
    """``hydra.*`` and ``hydra/...`` overrides set Hydra's runtime, which this launcher does not run: refused."""
    for item in overrides:
        key = _split(item)[1]
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            fix = next(
                (fix for prefixes, fix in _HYDRA_FIX if key.startswith(prefixes)),
                "; ".join(fix for _, fix in _HYDRA_FIX),
            )
            raise ConfigError(
                f"{item}: the launcher is not a Hydra app and has no hydra config to override: {fix}. "
                "Drop the override."
            )


def _split(item: str) -> tuple[str, str, str, str]:
    """``(prefix, key, sep, value)`` of an override: ``+``/``++``/``~`` prefix, the key, ``=`` or nothing."""
    stripped = item.lstrip("+~")
    prefix = item[: len(item) - len(stripped)]
    key, sep, value = stripped.partition("=")
    return prefix, key.strip(), sep, value


def rewrite(overrides: list[str], is_field) -> list[str]:
    """TRL's names as the project's keys; ``+``/``++`` dropped where ``is_field(key)`` (the key exists already).

    ``train.bf16=true`` is ``train.mixed_precision=bf16`` (``fp16`` likewise); ``train.bf16=false`` is
    ``train.mixed_precision=no`` unless another override sets the precision."""
    parts = [_split(o) for o in overrides]
    recipe = next((v.strip() for p, k, _, v in reversed(parts) if k == "recipe" and not p), None)
    keys = [project_key(k, recipe) if sep and "/" not in k else k for _, k, sep, _ in parts]
    precision_set = any(
        k == "train.mixed_precision" or (k in _PRECISION and v.strip().lower() in _TRUE)
        for k, (_, _, _, v) in zip(keys, parts)
    )
    out = []
    for item, key, (prefix, _, sep, value) in zip(overrides, keys, parts):
        if prefix.startswith("~"):
            out.append(f"{prefix}{project_key(key, recipe)}{sep}{value}")
        elif "/" in key or not sep:
            out.append(item)
        elif key in _PRECISION:
            flag = value.strip().lower()
            if flag not in _TRUE + _FALSE:
                raise ConfigError(
                    f"{item}: give true or false (TRL's flag), or set train.mixed_precision={_PRECISION[key]}|no."
                )
            if flag in _TRUE or not precision_set:
                out.append(f"train.mixed_precision={_PRECISION[key] if flag in _TRUE else 'no'}")
        else:
            keep = prefix if prefix not in ("+", "++") or not is_field(key) else ""
            out.append(f"{keep}{key}{sep}{value}")
    return out


def project_key(key: str, recipe: str | None) -> str:
    """The project's key for TRL's ``key`` (``train.X`` or bare ``X``); ``key`` itself when it is none of TRL's.
    ``beta`` is DPO's ``recipe.dpo_beta`` under recipe=dpo (``recipe``: the command line's), else GRPO's."""
    if "." not in key and (
        f"train.{key}" in ALIASES or f"train.{key}" in _PRECISION or key in _TRAIN_AS_TRL or key == "beta"
    ):
        key = f"train.{key}"
    if key == "train.beta":
        return "recipe.dpo_beta" if recipe == "dpo" else "recipe.beta"
    return ALIASES.get(key, key)


def instead(key: str) -> str | None:
    """What to use instead of TRL's option ``key`` (``train.X`` or bare) that the orchestrator sets itself."""
    group, _, leaf = key.rpartition(".")
    return INSTEAD.get(leaf) if group in ("", "train") else None


FIELD, FREE = "field", "free"


def lookup(key: str, recipe_schema) -> str | DictConfig | None:
    """Where ``key`` lands in the schema: ``FIELD`` (a field), ``FREE`` (below a free-form dict or list, which
    holds anything), else the structured node that lacks it (None: below a plain value)."""
    node: Any = _schema_tree(recipe_schema)
    for part in key.split("."):
        if isinstance(node, ListConfig) or (isinstance(node, DictConfig) and OmegaConf.get_type(node) is dict):
            return FREE
        if not isinstance(node, DictConfig) or part not in node:
            return node if isinstance(node, DictConfig) else None
        node = node._get_node(part)  # noqa: SLF001 - a MISSING value is still a node
    return FIELD


@functools.lru_cache(maxsize=None)
def _schema_tree(recipe_schema) -> DictConfig:
    """The whole schema with ``recipe_schema`` as its recipe, built once per process (read, never changed)."""
    from orchestrator.config.schema import Config

    node = OmegaConf.structured(Config)
    node.recipe = OmegaConf.structured(recipe_schema)
    return node


def check_added(overrides: list[str], recipe_schema, is_group) -> None:
    """Refuse a ``+key``/``++key`` that no schema field holds: Hydra would add it and nothing would read it.
    ``is_group(key)``: ``+experiment=...`` adds a config group's option, not a key."""
    for item in overrides:
        prefix, key, sep, _ = _split(item)
        if prefix not in ("+", "++") or "/" in key or not sep or is_group(key):
            continue
        where = lookup(key, recipe_schema)
        if where not in (FIELD, FREE):
            raise ConfigError(unread_message(item, key, cast(Optional[DictConfig], where)))


def unread_message(item: str, key: str, parent: DictConfig | None) -> str:
    from orchestrator.config.schema import GROUP_SCHEMAS

    leaf = key.rpartition(".")[2]
    if instead(key):
        return f"{item}: nothing reads {key}: the orchestrator sets TRL's {leaf} itself; {instead(key)}."
    owners = [f"{group}.{leaf}" for group, schema in GROUP_SCHEMAS.items() if leaf in schema.__dataclass_fields__]
    owners += [k for k in ALIASES if k.endswith(f".{leaf}")]
    if owners:
        fix = f"Did you mean {owners[0]}=...?"
    else:
        keys: list[str] = cast("list[str]", list(parent.keys())) if parent is not None else []
        close = difflib.get_close_matches(leaf, keys, n=3)
        base = key.rpartition(".")[0]
        fix = (f"Did you mean {', '.join(f'{base}.{c}' if base else c for c in close)}? " if close else "") + (
            f"The keys at that level: {', '.join(keys)}." if parent is not None else ""
        )
    return (
        f"{item}: nothing reads {key} (no such option; Hydra's '+' adds a key the job then ignores). {fix} "
        "Free-form values go under run.notes (+run.notes.NAME=VALUE)."
    ).replace("  ", " ")
