"""The catalogue of launch checks: every cross-field check of a composed job config, and ``validate``.

``orchestrator.app.compose`` composes the config and calls ``validate`` (at launch) or ``check_resolvable``
(on the worker); this module imports no Hydra. Each check raises ``ConfigError`` (exit 4, never
requeued) with the key and the fix in the message; ``validate`` runs them all (``CHECKS``) and reports every
problem at once.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from orchestrator.app.hub_access import check_hub_model
from orchestrator.app.image_pin import warn_unpinned_image
from orchestrator.backends.zones import check_zone_settings
from orchestrator.config import train_options
from orchestrator.config.compose import check_resolvable
from orchestrator.config.typed import DurationErrors, Durations
from orchestrator.config.zones import check_zones
from orchestrator.core.errors import ConfigError, UserError
from orchestrator.core.names import RUN_NAME
from orchestrator.core.numbers import check_finite, check_ranges
from orchestrator.core.ranks import configured_world_size
from orchestrator.evaluation import spec as bench_spec
from orchestrator.process.multinode import checks as multinode_checks

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
MULTILINE_KEYS = {"backend.extra.setup"}  # a multi-line setup script, written as a YAML block by the serialiser
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
REMOTE_STORAGE_BACKENDS = ("kubernetes", "skypilot")


def validate(cfg: DictConfig) -> None:
    """Cross-field checks the schemas cannot express, all of them: one ConfigError names every problem.

    Unset or unresolvable values, invalid choices and numbers that are not finite (NaN, infinity)
    are reported first and alone (the other checks read them); then every check runs and their problems are reported together, as
    torchtune's ``config.validate`` does, so a user fixes a config in one round.
    """
    check_resolvable(cfg)
    check_finite(cfg)
    problems = []
    for check in CHECKS:
        try:
            check(cfg)
        except DurationErrors as err:  # each duration that does not parse is its own problem
            problems.extend(err.problems)
        except UserError as err:  # ConfigError, DataError: both exit 4
            problems.append(str(err))
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(
            f"{len(problems)} problems in the config:\n"
            + "\n".join(f"  {n}. {text}" for n, text in enumerate(problems, 1))
        )


def _check_recipe(cfg: DictConfig) -> None:
    if cfg.recipe.peft == "full" and cfg.recipe.name not in ("sft", "grpo"):
        raise ConfigError(f"recipe.peft=full works with recipe=sft or grpo; {cfg.recipe.name} trains LoRA adapters.")
    if cfg.recipe.name == "grpo":
        from recipes.rewards import check_grpo_config

        check_grpo_config(cfg)  # reward functions importable with TRL's signature, batch shapes, beta, vLLM
    if cfg.recipe.quantization == "nf4" and cfg.recipe.peft == "full":
        raise ConfigError(
            "recipe.quantization=nf4 needs recipe.peft=lora: a 4-bit base cannot be fully fine-tuned. "
            "Use recipe.peft=lora (QLoRA) or recipe.quantization=none."
        )
    if cfg.recipe.name == "qlora" and cfg.recipe.quantization != "nf4":
        raise ConfigError(
            "recipe=qlora needs recipe.quantization=nf4 (a 4-bit base); use recipe=sft for an unquantised base."
        )


def _check_evaluation(cfg: DictConfig) -> None:
    """Evaluation during training, early stopping and ``checkpoint.final`` fit together."""
    t = cfg.train
    for key in ("eval_steps", "early_stopping_patience"):
        if t[key] < 0:
            raise ConfigError(f"train.{key}={t[key]} must be at least 0 (0: off); set train.{key}=0 or more.")
    if t.early_stopping_threshold < 0:
        raise ConfigError(
            f"train.early_stopping_threshold={t.early_stopping_threshold} must be at least 0 (how much "
            "the quality metric must improve to count); set e.g. train.early_stopping_threshold=0."
        )
    bench = _check_selection_metric(cfg)
    if t.early_stopping_patience > 0 and t.eval_steps <= 0 and not bench:
        raise ConfigError(
            f"train.early_stopping_patience={t.early_stopping_patience} counts evaluations, but "
            "train.eval_steps=0 evaluates only at the end. Set train.eval_steps=N (e.g. 50), or "
            "train.early_stopping_patience=0."
        )
    if cfg.checkpoint.final == "best":
        if t.eval_steps <= 0 and not bench:
            raise ConfigError(
                "checkpoint.final=best keeps the best evaluation's weights, but train.eval_steps=0 "
                "evaluates only at the end. Set train.eval_steps=N (e.g. 50), or checkpoint.final=last."
            )
        if not cfg.checkpoint.save_final_weights:
            raise ConfigError(
                "checkpoint.final=best chooses what <run>/final/ holds, but "
                "checkpoint.save_final_weights=false writes no final weights. Drop one of the two."
            )
        if cfg.distributed.name not in ("none", "ddp"):
            raise ConfigError(
                f"checkpoint.final=best loads the best checkpoint's weights back at the end, which is "
                f"supported with distributed=none or ddp, not {cfg.distributed.name}. Use "
                "checkpoint.final=last (and pick the best checkpoint from storage), or distributed=ddp."
            )


def _check_selection_metric(cfg: DictConfig) -> bool:
    """``train.early_stopping_metric``: empty (the held-out metric) or a benchmark metric a task produces, scored
    at checkpoints (``eval.every``). Returns whether it names a benchmark metric."""
    name = str(cfg.train.early_stopping_metric or "")
    if not name:
        return False
    from orchestrator.evaluation import selection, spec

    task, metric = selection.split(name) if selection.is_bench_metric(name) else ("", "")
    if not (task and metric):
        raise ConfigError(
            f"train.early_stopping_metric={name!r}: give bench/<task>/<metric> (e.g. "
            "bench/tiny_arith_mc/acc, scored by eval.tasks), or null for the held-out quality metric."
        )
    if not spec.enabled(cfg) or cfg.eval.every <= 0:
        raise ConfigError(
            f"train.early_stopping_metric={name} selects on benchmark scores of checkpoints, but "
            f"{'eval.tasks is empty' if not spec.enabled(cfg) else 'eval.every=0 scores only the final weights'}."
            f" Set 'eval.tasks=[{task}]' and eval.every=N (e.g. 1), or train.early_stopping_metric=null."
        )
    spec.check_metric(cfg.eval, task, metric, key=f"train.early_stopping_metric={name}")
    return True


def _check_tracking(cfg: DictConfig) -> None:
    if cfg.tracking.log_final_weights and not cfg.tracking.enabled:
        raise ConfigError(
            "tracking.log_final_weights=true logs the final weights to MLflow, but tracking.enabled=false. "
            "Set tracking.enabled=true, or drop tracking.log_final_weights."
        )


def _check_data(cfg: DictConfig) -> None:
    from orchestrator.backends.paths import check_placement, checked_here
    from recipes.data import check_chat_template, check_jsonl, check_mix

    if cfg.data.source in ("jsonl", "hub") and not cfg.data.path:
        raise ConfigError(f"data={cfg.data.source} needs data.path (a JSONL file or a hub dataset id).")
    check_placement(cfg)  # each input reaches the worker's machine: s3:// listed, the backend's paths
    if cfg.data.source == "jsonl" and checked_here(cfg, cfg.data.path):
        check_jsonl(cfg.data.path, cfg.recipe.name)  # raises DataError naming the file and the fix
    check_mix(cfg.data, cfg.recipe.name, readable=lambda path: checked_here(cfg, path))
    if cfg.data.chat_template is None or checked_here(cfg, str(cfg.data.chat_template)):
        check_chat_template(cfg.data.chat_template)


def _check_durations(cfg: DictConfig) -> None:
    """Every duration parses (``config.typed.Durations``: checkpoint.every and auto's bounds, run.deadline, ...)."""
    Durations.of(cfg)


def _check_schedule(cfg: DictConfig) -> None:
    """The partition run.deadline may move a Slurm job to; the preemption rate and restart time it plans with."""
    for key in ("preemptions_per_hour", "restart_seconds"):
        if cfg.compute[key] is not None and cfg.compute[key] < 0:
            raise ConfigError(f"compute.{key}={cfg.compute[key]} must be at least 0 (or null: measured or estimated).")
    backend = cfg.backend
    if backend.on_demand_partition is None:
        return
    problem = None
    if backend.name != "slurm":
        problem = f"it is a Slurm setting, and backend={backend.name}"
    elif cfg.run.deadline is None or not cfg.compute.spot:
        problem = "only run.deadline moves a job there, and only a spot job (compute.spot=true)"
    elif not backend.partition or backend.partition == backend.on_demand_partition:
        problem = "backend.partition must name the spot partition, another one"
    if problem:
        raise ConfigError(
            f"backend.on_demand_partition={backend.on_demand_partition!r}: {problem}. Set backend=slurm "
            "backend.partition=<spot partition> backend.on_demand_partition=<on-demand partition> run.deadline=52h "
            "compute.spot=true, or drop backend.on_demand_partition."
        )


def _check_counts(cfg: DictConfig) -> None:
    positive = [
        "train.per_device_batch_size",
        "train.gradient_accumulation_steps",
        "checkpoint.keep_last",
        "compute.nodes",
        "distributed.processes_per_node",
        "distributed.nodes",
    ]
    for key in positive:
        if OmegaConf.select(cfg, key) < 1:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)} must be at least 1.")
    if cfg.checkpoint.keep_last < 2:
        # the newest may still be uploading when retention runs, so one is not enough (after torchtitan)
        raise ConfigError("checkpoint.keep_last must be at least 2: the newest checkpoint may still be uploading.")
    if cfg.train.max_steps <= 0 and cfg.train.num_epochs <= 0:
        raise ConfigError("set train.max_steps > 0 or train.num_epochs > 0.")
    if cfg.budget.max_usd is not None and cfg.budget.max_usd <= 0:
        raise ConfigError("budget.max_usd must be positive (or null for no budget).")


def _check_spend_caps(cfg: DictConfig) -> None:
    """The monthly and experiment caps are positive, and need a reservation window to hold against other jobs."""
    for key in ("monthly_max_usd", "experiment_max_usd"):
        value = cfg.budget[key]
        if value is not None and value <= 0:
            raise ConfigError(f"budget.{key}={value} must be positive (or null for no cap).")
    try:
        window = Durations.of(cfg).reserve_ahead
    except ConfigError:
        return  # a duration that does not parse: _check_durations names it
    capped = cfg.budget.monthly_max_usd is not None or cfg.budget.experiment_max_usd is not None
    if capped and window <= 0:
        raise ConfigError(
            f"budget.reserve_ahead={cfg.budget.reserve_ahead!r}: a spend cap (budget.monthly_max_usd or "
            "budget.experiment_max_usd) is charged before it is spent, a reservation at a time, so concurrent jobs "
            "cannot overspend it; set budget.reserve_ahead to a duration such as 1m."
        )


def _check_run_name(cfg: DictConfig) -> None:
    if not RUN_NAME.fullmatch(str(cfg.run.name)):
        raise ConfigError(
            f"run.name={cfg.run.name!r} is not a valid job name: use 1-63 letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit (so it is also a valid Kubernetes label value and "
            "Slurm job name), e.g. run.name=qwen7b-capybara.1."
        )


def _check_model_path(cfg: DictConfig) -> None:
    from orchestrator.backends.paths import checked_here

    name = cfg.model.name_or_path
    if name.startswith(("/", "./", "../", "~")) and checked_here(cfg, name) and not Path(name).expanduser().is_dir():
        raise ConfigError(
            f"model.name_or_path={cfg.model.name_or_path!r} does not exist. Give an existing local model folder "
            "(with config.json) or a hub id such as Qwen/Qwen2.5-0.5B."
        )


def _check_backend_settings(cfg: DictConfig) -> None:
    from orchestrator.backends.settings import backend_settings

    backend_settings(cfg)  # raises ConfigError for an unknown key or a value of the wrong type


def _check_string_values(cfg: DictConfig) -> None:
    _check_strings(OmegaConf.to_container(cfg, resolve=True))


def _check_gpus_match_processes(cfg: DictConfig) -> None:
    """Refuse a job that bills GPUs it does not train on (or starts more processes than it has GPUs).

    One training process drives one GPU. CPU presets (no GPUs) are exempt;
    ``compute.allow_idle_gpus=true`` lets a job bill more GPUs than it uses, deliberately.
    """
    from orchestrator.core.gpus import CPU_TYPES

    per_node, nodes = int(cfg.compute.gpus_per_node), int(cfg.compute.nodes)
    if per_node <= 0 or str(cfg.compute.gpu_type or "none").lower() in CPU_TYPES:
        return
    gpus, processes = per_node * nodes, configured_world_size(cfg)
    if gpus == processes or (processes < gpus and cfg.compute.allow_idle_gpus):
        return
    started = (
        f"distributed={cfg.distributed.name} starts {processes} training process{'es' if processes > 1 else ''}"
        + (
            ""
            if cfg.distributed.name == "none"
            else f" (distributed.processes_per_node={cfg.distributed.processes_per_node} x "
            f"distributed.nodes={cfg.distributed.nodes})"
        )
    )
    billed = f"compute={cfg.compute.name} bills {gpus} GPUs (compute.gpus_per_node={per_node} x compute.nodes={nodes})"
    spread = f"distributed.processes_per_node={per_node}" + (f" distributed.nodes={nodes}" if nodes > 1 else "")
    if processes < gpus:
        raise ConfigError(
            f"{billed} but {started}, so {gpus - processes} of them would be paid for and sit idle. "
            f"Train on all of them (distributed=ddp, zero2, zero3 or fsdp with {spread}), pick compute with "
            f"{processes} GPU{'s' if processes > 1 else ''} (e.g. compute.gpus_per_node={max(1, processes // nodes)}), "
            "or set compute.allow_idle_gpus=true if the idle GPUs are deliberate."
        )
    raise ConfigError(
        f"{billed} but {started}: one process per GPU. Set {spread}, or compute.gpus_per_node so that "
        f"gpus_per_node x nodes = {processes}."
    )


def _check_attempt_settings(cfg: DictConfig) -> None:
    """What the price catalog, the requeue policy, the preemption handler and the store would refuse
    when an attempt starts.

    Their constructors raise ValueError for these; found here, at launch, they exit 4 instead of
    a traceback in the launcher or a crash that an engine requeues.
    """
    from orchestrator.money.cost import load_catalog, price_for
    from orchestrator.storage import check_uri

    try:  # the worker prices its attempt first thing (orchestrator.money.cost.CostMeter)
        price_for(cfg.compute, load_catalog())
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(str(err)) from None
    requeue = cfg.requeue
    for key in ("max_preemptions", "max_failures"):
        if requeue[key] < 0:
            raise ConfigError(
                f"requeue.{key}={requeue[key]} must be at least 0 (0: never requeue); set requeue.{key}=0 or more."
            )
    for key in ("backoff_base_seconds", "backoff_max_seconds"):
        if requeue[key] < 0:
            raise ConfigError(f"requeue.{key}={requeue[key]} must be at least 0 seconds; set requeue.{key}=0 or more.")
    if requeue.crash_loop_threshold < 1:
        raise ConfigError(
            f"requeue.crash_loop_threshold={requeue.crash_loop_threshold} must be at least 1: it counts consecutive "
            "attempts without progress, and stopping after zero of them would stop every job. "
            "Set requeue.crash_loop_threshold=3 (the default) or more."
        )
    if cfg.preemption.poll_seconds <= 0:
        raise ConfigError(
            f"preemption.poll_seconds={cfg.preemption.poll_seconds} must be more than 0 (seconds "
            "between polls of the cloud's metadata service); set e.g. preemption.poll_seconds=5."
        )
    try:
        check_uri(cfg.storage.uri)
    except ValueError as err:
        raise ConfigError(f"storage.uri: {err}") from None
    if cfg.storage.multipart_threshold_mb < 1:
        raise ConfigError(
            f"storage.multipart_threshold_mb={cfg.storage.multipart_threshold_mb} must be at least 1 "
            "(files this large or larger upload in parts); set e.g. storage.multipart_threshold_mb=64."
        )


def _check_strings(node, path: str = "") -> None:
    """Refuse control characters (a newline would start a new line of an sbatch script) in any string value."""
    if isinstance(node, dict):
        for key, value in node.items():
            _check_strings(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_strings(value, f"{path}[{i}]")
    elif isinstance(node, str) and CONTROL_CHARS.search(node):
        if path in MULTILINE_KEYS and not CONTROL_CHARS.search(node.replace("\n", "").replace("\t", "")):
            return
        raise ConfigError(
            f"{path}={node!r} contains a control character (newline, tab, escape...); backends write config "
            f"values into scripts and manifests, so they must be single-line printable text. Remove it."
        )


def _check_webhook(cfg: DictConfig) -> None:
    """budget.webhook_url_env names a variable that is set (where the launcher can see it); not both keys."""
    name = cfg.budget.webhook_url_env
    if not name:
        return
    if cfg.budget.webhook_url:
        raise ConfigError("set budget.webhook_url_env or budget.webhook_url, not both (webhook_url_env is preferred).")
    if not ENV_NAME.fullmatch(str(name)):
        raise ConfigError(
            f"budget.webhook_url_env={name!r} must be the name of an environment variable (letters, digits and "
            "'_', not starting with a digit), e.g. budget.webhook_url_env=SLACK_WEBHOOK_URL."
        )
    # on Kubernetes the variable comes from a Secret in the pod (see docs/scale-out.md), not from here
    if cfg.backend.name != "kubernetes" and not os.environ.get(str(name)):
        raise ConfigError(
            f"budget.webhook_url_env={name}: the environment variable {name} is not set, so budget alerts "
            f"could not reach the webhook. export {name}=https://hooks.slack.com/services/... before launching."
        )


def _check_remote_storage(cfg: DictConfig) -> None:
    """Remote backends run on machines that vanish: the ledger and checkpoints must outlive them."""
    if cfg.backend.name in REMOTE_STORAGE_BACKENDS and not str(cfg.storage.uri).startswith("s3://"):
        raise ConfigError(
            f"backend={cfg.backend.name} with storage.uri={cfg.storage.uri!r}: a local folder lives on the node's "
            "disk and vanishes with it, taking the ledger (the requeue and budget caps) and the checkpoints. "
            "Use object storage: storage=s3 storage.uri=s3://bucket/runs (storage.endpoint_url for MinIO, R2...)."
        )


DEFAULT_LR_SCHEDULER = "linear"


def check_lr_scheduler(cfg: DictConfig) -> None:
    """Refuse a ``train.lr_scheduler`` the Trainer would refuse, by asking transformers itself.

    The name must be one of transformers' ``SchedulerType`` values, and
    ``get_scheduler`` must build it with what the recipes pass (warm-up and
    training steps, no ``lr_scheduler_kwargs``): cosine_with_min_lr, for one,
    needs a kwarg. reduce_lr_on_plateau and greedy step on evaluation metrics
    (``train.eval_steps``), a path whose resume is not proven here, so they are refused. The default is not checked: importing transformers
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
        raise ConfigError(
            f"train.lr_scheduler={name!r} is not a transformers scheduler; choose one of: {usable} "
            f"(transformers knows: {', '.join(names)})."
        )
    if name in (SchedulerType.REDUCE_ON_PLATEAU.value, SchedulerType.GREEDY.value):
        raise ConfigError(
            f"train.lr_scheduler={name!r} steps on evaluation metrics, which this project "
            f"does not support (resume exactness is proven for step-driven schedules only); choose one "
            f"of: {usable}."
        )
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    steps = max(1, int(cfg.train.max_steps))
    try:
        get_scheduler(name, optimizer=optimizer, num_warmup_steps=int(cfg.train.warmup_steps), num_training_steps=steps)
    except (ValueError, TypeError) as err:
        raise ConfigError(
            f"train.lr_scheduler={name!r} needs arguments this job does not pass ({err}); choose one of: {usable}."
        ) from None


# every check validate() runs (after the resolvable values, the choices and the finite numbers), in the order they are reported
CHECKS = (
    _check_recipe,
    _check_evaluation,
    check_ranges,
    _check_tracking,
    _check_data,
    _check_durations,
    _check_schedule,
    _check_counts,
    _check_spend_caps,
    _check_run_name,
    _check_string_values,
    _check_backend_settings,
    _check_webhook,
    _check_remote_storage,
    _check_gpus_match_processes,
    _check_attempt_settings,
    check_lr_scheduler,
    _check_model_path,
    bench_spec.check,
    *train_options.CHECKS,
    *multinode_checks.CHECKS,
    check_zones,
    check_zone_settings,
    check_hub_model,
    warn_unpinned_image,
)
