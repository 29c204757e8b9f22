"""``eval.tasks`` resolved to lm-evaluation-harness task configs, without loading a model; the launch checks.

An entry of ``eval.tasks`` is a task (or group) name, a task YAML file, or a folder of them. Names are looked up
first among the local folders (the shipped ``tasks/`` and the folders and files given), in a ``TaskManager`` that
skips the harness's own 14,000 tasks (0.2 s); only a name not found there is looked up among those (about 25 s).
A local task's ``dataset_kwargs.data_files`` are relative to its YAML file's folder: they are made absolute here,
so a job evaluates the same data from any working directory.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from orchestrator.core.errors import ConfigError

log = logging.getLogger(__name__)

SHIPPED_TASKS = Path(__file__).resolve().parent / "tasks"
INSTALL_FIX = (
    "lm-evaluation-harness is not installed: run `bash scripts/setup.sh` (it installs lm-eval==0.4.13), "
    "or `pip install -c constraints.txt lm-eval==0.4.13`; or set eval.tasks=[] to evaluate nothing."
)


@dataclass
class TaskSet:
    """What ``simple_evaluate`` is given (``specs``: config dicts for local tasks, names for the harness's own),
    the ``TaskManager`` that knows them, and the hash of everything that decides the scores but the model."""

    specs: list = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    manager: Any = None
    config_hash: str = ""
    harness_version: str = ""


def harness_version() -> str:
    try:
        import lm_eval
    except ImportError:
        raise ConfigError(INSTALL_FIX) from None
    return str(lm_eval.__version__)


def _local_paths(tasks: list[str]) -> tuple[list[Path], list[str], list[Path]]:
    """(include folders, names, YAML files) of ``eval.tasks``; a missing path is a ConfigError."""
    folders, names, files = [SHIPPED_TASKS], [], []
    for entry in tasks:
        entry = str(entry)
        looks_like_path = entry.endswith((".yaml", ".yml")) or "/" in entry or entry.startswith((".", "~"))
        if not looks_like_path:
            names.append(entry)
            continue
        path = Path(entry).expanduser().resolve()
        if not path.exists():
            raise ConfigError(
                f"eval.tasks: {entry!r} does not exist. Give a harness task name (e.g. tiny_arith_mc, "
                "arc_easy), a task YAML file, or a folder of them."
            )
        if path.is_dir():  # a folder of task YAMLs: every task in it (the harness's include_path is recursive)
            folders.append(path)
            found = sorted(path.rglob("*.yaml")) + sorted(path.rglob("*.yml"))
            tasks_in = [f for f in found if _names_a_task(f)]
            if not tasks_in:
                raise ConfigError(
                    f"eval.tasks: the folder {entry!r} holds no task YAML (a file with a `task:` or "
                    "`group:` name). Give the folder of your task files, or the files themselves."
                )
            files.extend(tasks_in)
        else:
            files.append(path)
            folders.append(path.parent)
    return folders, names, files


def _names_a_task(path: Path) -> bool:
    """Whether ``path`` is a task or group YAML (a file of shared settings for ``include:`` is neither)."""
    try:
        doc = _load_yaml(path)
    except ConfigError:
        return False
    return isinstance(doc.get("task") or doc.get("group"), str)


def _load_yaml(path: Path) -> dict:
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        cfg = load_yaml(path, resolve_func=True)
    except Exception as err:  # noqa: BLE001 - yaml.YAMLError, a !function that does not import, ...
        raise ConfigError(
            f"eval.tasks: {path} does not parse as a task YAML ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}). Fix the file (see lm-evaluation-harness's "
            "docs/task_guide.md), or drop it from eval.tasks."
        ) from None
    if not isinstance(cfg, dict) or not (cfg.get("task") or cfg.get("group")):
        raise ConfigError(f"eval.tasks: {path} has no `task:` (or `group:`) key; a task YAML names its task.")
    return cfg


def _resolved_config(yaml_path: Path) -> tuple[dict, dict]:
    """The task's config with its local data files made absolute, and those files' SHA-256."""
    cfg = copy.deepcopy(_load_yaml(yaml_path))
    data_files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    hashes = {}
    if data_files:
        mapping = data_files if isinstance(data_files, dict) else {"_": data_files}
        for split, files in mapping.items():
            listed = [files] if isinstance(files, str) else list(files)
            absolute = []
            for name in listed:
                path = (yaml_path.parent / name) if not Path(name).is_absolute() else Path(name)
                if not path.is_file():
                    raise ConfigError(
                        f"eval.tasks: {yaml_path} reads {name!r}, which is not a file ({path}); "
                        "data_files are relative to the YAML file's folder."
                    )
                absolute.append(str(path))
                hashes[str(name)] = hashlib.sha256(path.read_bytes()).hexdigest()
            mapping[split] = absolute[0] if isinstance(files, str) else absolute
        cfg["dataset_kwargs"]["data_files"] = mapping if isinstance(data_files, dict) else mapping["_"]
    return cfg, hashes


def _manager(folders: list[Path], *, defaults: bool):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=[str(f) for f in folders], include_defaults=defaults)


def resolve(eval_cfg: Any) -> TaskSet:
    """``eval.tasks`` as the harness's task specs (no model loaded). Raises ConfigError naming the fix."""
    version = harness_version()
    folders, names, files = _local_paths(list(eval_cfg.tasks))
    for path in files:
        names.append(str(_load_yaml(path).get("task") or _load_yaml(path).get("group")))
    manager = _manager(folders, defaults=False)
    if any(name not in manager.task_index for name in names):
        log.info(
            "eval.tasks: looking up %s among lm-evaluation-harness's own tasks",
            [n for n in names if n not in manager.task_index],
        )
        manager = _manager(folders, defaults=True)
    unknown = [name for name in names if name not in manager.task_index]
    if unknown:
        close = sorted(t for t in manager.all_tasks if any(u.lower() in t.lower() for u in unknown))[:8]
        raise ConfigError(
            f"eval.tasks: {', '.join(map(repr, unknown))} is not a task lm-evaluation-harness knows"
            f"{' (close: ' + ', '.join(close) + ')' if close else ''}. Give a task name (`lm_eval ls "
            "tasks` lists them; tiny_arith_mc and tiny_arith_gen ship here), or a task YAML path."
        )
    specs: list[Any] = []
    described: list[dict[str, Any]] = []
    for name in names:
        entry = manager.task_index[name]
        yaml_path = Path(entry.yaml_path) if getattr(entry, "yaml_path", None) else None
        local = (
            yaml_path is not None
            and any(_inside(yaml_path, f) for f in folders)
            and getattr(entry.kind, "name", "") == "TASK"
        )
        if local:
            cfg, data = _resolved_config(cast(Path, yaml_path))
            specs.append(cfg)
            described.append({"task": name, "config": cfg, "data": data})
        else:
            specs.append(name)
            described.append({"task": name, "yaml": yaml_path.read_text() if yaml_path and yaml_path.is_file() else ""})
    shape = {"tasks": described, "num_fewshot": eval_cfg.num_fewshot, "limit": eval_cfg.limit, "harness": version}
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()
    return TaskSet(specs=specs, names=names, manager=manager, config_hash=digest, harness_version=version)


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def enabled(cfg: Any) -> bool:
    return len(cfg.eval.tasks) > 0


def check(cfg: Any) -> None:
    """The launch check of the ``eval`` group (``orchestrator.app.checks.CHECKS``)."""
    ev = cfg.eval
    for key, low in (("every", 0), ("batch_size", 1), ("limit", 1), ("num_fewshot", 0)):
        value = ev[key]
        if value is not None and value < low:
            raise ConfigError(f"eval.{key}={value} must be at least {low}; set eval.{key}={max(low, 1)} or more.")
    if not enabled(cfg):
        if ev.every > 0:
            raise ConfigError(
                f"eval.every={ev.every} evaluates checkpoints, but eval.tasks is empty. Set "
                "eval.tasks=[tiny_arith_mc] (or a harness task), or eval.every=0."
            )
        return
    if ev.every > 0 and not _checkpoints_on(cfg):
        raise ConfigError(
            f"eval.every={ev.every} evaluates every {ev.every}-th committed checkpoint, but this job "
            "commits none (checkpoint.every=off and checkpoint.every_steps=0). Set checkpoint.every_steps=N "
            "or checkpoint.every=15m, or eval.every=0 (the final weights only)."
        )
    if cfg.distributed.name != "none":
        raise ConfigError(
            f"eval.tasks: the in-job evaluation runs in the training process, supported with "
            f"distributed=none, not {cfg.distributed.name}. Use distributed=none, or eval.tasks=[]."
        )
    _resolved(ev)


_RESOLVED: dict = {}


def _resolved(eval_cfg: Any) -> TaskSet:
    """``resolve``, once per task list in this process (the launch checks ask twice)."""
    key = json.dumps([list(map(str, eval_cfg.tasks)), eval_cfg.num_fewshot, eval_cfg.limit], default=str)
    if key not in _RESOLVED:
        _RESOLVED[key] = resolve(eval_cfg)
    return _RESOLVED[key]


# the metrics an output type reports when a task YAML lists none (lm-evaluation-harness's defaults)
DEFAULT_METRICS = {
    "multiple_choice": ["acc", "acc_norm"],
    "generate_until": ["exact_match"],
    "loglikelihood": ["perplexity", "acc"],
    "loglikelihood_rolling": ["word_perplexity"],
}


def produced_metrics(task_set: TaskSet, task: str) -> Any:
    """The metric names (as logged: ``<metric>`` or ``<metric>_<filter>``) a local task reports; None where
    the task is the harness's own (not known without building it)."""
    found = [s for s in task_set.specs if isinstance(s, dict) and s.get("task") == task]
    if not found:
        return None
    cfg = found[0]
    metrics = [m.get("metric") for m in cfg.get("metric_list") or [] if isinstance(m, dict)] or DEFAULT_METRICS.get(
        str(cfg.get("output_type"))
    )
    if metrics is None:
        return None
    filters = [f.get("name") for f in cfg.get("filter_list") or [] if isinstance(f, dict)] or ["none"]
    return {m if f == "none" else f"{m}_{f}" for m in metrics for f in filters}


def check_metric(eval_cfg: Any, task: str, metric: str, *, key: str) -> None:
    """A benchmark metric named in another key (``train.early_stopping_metric``) is one a task of
    ``eval.tasks`` reports. Raises ConfigError naming the fix."""
    task_set = _resolved(eval_cfg)
    if task not in task_set.names:
        raise ConfigError(
            f"{key}: {task!r} is not one of eval.tasks ({', '.join(task_set.names)}). Name a task "
            f"eval.tasks evaluates, e.g. bench/{task_set.names[0]}/<metric>, or add it to eval.tasks."
        )
    known = produced_metrics(task_set, task)
    if known is not None and metric not in known:
        raise ConfigError(
            f"{key}: task {task} reports {', '.join(sorted(known))}, not {metric!r}. Use e.g. "
            f"bench/{task}/{sorted(known)[0]}."
        )


def _checkpoints_on(cfg: Any) -> bool:
    from orchestrator.config.typed import Durations

    try:
        timed = not Durations.of(cfg).checkpoint_every.off
    except ConfigError:  # reported by the durations' own check
        timed = True
    return timed or cfg.checkpoint.every_steps > 0


def describe(task_set: TaskSet, eval_cfg: Any) -> dict:
    """What the scores depend on besides the model: the run's params."""
    return {
        "bench_tasks": ",".join(task_set.names),
        "bench_harness_version": task_set.harness_version,
        "bench_task_hash": task_set.config_hash[:16],
        "bench_seed": str(eval_cfg.seed),
    }
