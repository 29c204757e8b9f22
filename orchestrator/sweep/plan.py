"""From the launch command to a sweep: the overrides split into fixed ones and a search space, composed and
checked once (exit 4 before any trial), and the sweep's record opened (resume, or refusal of a changed space)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import ConfigError
from orchestrator.sweep.space import SearchSpace

MULTIRUN_FLAGS = ("-m", "--multirun")
# what each recipe's evaluations log (orchestrator.attempt.quality.EVAL_RECORDED), and the default metric
_LOGGED = {"dpo": ("eval_reward_accuracy", "eval_reward_margin", "eval_loss", "eval_perplexity")}
_DEFAULT_LOGGED = ("eval_accuracy", "eval_loss", "eval_perplexity")
_MINIMIZED = ("eval_loss", "eval_perplexity")


def wants_sweep(argv: list[str]) -> bool:
    """``-m``, a ``sweep=...`` choice or a ``sweep.`` key: the command is a sweep, not one job."""
    return any(a in MULTIRUN_FLAGS or a.startswith(("sweep=", "sweep.")) for a in argv)


@dataclass
class SweepPlan:
    cfg: object  # the composed config of the first point (keys and types checked)
    space: SearchSpace
    fixed: list[str]  # every trial's overrides (the launcher's defaults added; no sweep.* key)
    trial_overrides: list[str]  # what the driver adds to each trial: the sweep's experiment and its cap
    settings: dict  # what shapes the decisions (stored; a change is refused)
    state: object  # orchestrator.sweep.state.SweepState
    store: object
    experiment: str
    budget_usd: float
    max_parallel: int
    n_trials: int
    log_dir: str

    def spend_index(self) -> dict:
        return spend_index(self.store)


def spend_index(store) -> dict:
    """The store's spend index, checked (SpendIndexCorrupt); {} before any trial reserved."""
    from orchestrator.money.spend import INDEX_KEY, parse_index

    try:
        return parse_index(store.get_bytes(INDEX_KEY), store.get_uri(INDEX_KEY), store.uri)
    except FileNotFoundError:
        return {}


def plan_sweep(argv: list[str], compose_for_launch) -> SweepPlan:
    """``compose_for_launch``: the launcher's (``orchestrator.launch``, which nothing imports)."""
    from orchestrator.config.compose import absolutize, compose_resolved, split_sweep_overrides

    multirun = any(a in MULTIRUN_FLAGS for a in argv)
    overrides = absolutize([a for a in argv if a not in MULTIRUN_FLAGS])
    fixed, specs = split_sweep_overrides(overrides)
    if multirun and not any(o.startswith("sweep=") for o in fixed):
        fixed = ["sweep=grid", *fixed]
    first = compose_resolved([o for o in fixed if o.startswith("sweep")])
    params = {k: str(v) for k, v in first.sweep.params.items()}
    _, from_config = split_sweep_overrides([f"{k}={v}" for k, v in params.items()])
    space = SearchSpace.from_specs({**from_config, **specs})
    if not space.specs:
        raise ConfigError(
            "the sweep has no search space: give at least one key with several values "
            "(-m train.learning_rate=1e-4,2e-4, or 'train.learning_rate=interval(1e-5,1e-3)' with "
            "sweep=asha), or drop -m/sweep to run one job."
        )
    cfg, final = compose_for_launch(fixed + space.representative())
    return _plan(cfg, space, [o for o in final if o not in space.representative()])


def _settings(cfg, space: SearchSpace) -> tuple[dict, int]:
    s = cfg.sweep
    logged: tuple[str, ...] = _LOGGED.get(cfg.recipe.name, _DEFAULT_LOGGED)
    if cfg.recipe.name != "dpo" and cfg.recipe.eval_metric == "none":
        logged = ("eval_loss", "eval_perplexity")
    metric = logged[0] if s.metric == "auto" else s.metric
    problems = []
    if s.budget_usd is None or not (
        isinstance(s.budget_usd, (int, float)) and math.isfinite(s.budget_usd) and s.budget_usd > 0
    ):
        problems.append(
            f"sweep.budget_usd={s.budget_usd}: a sweep needs a positive dollar budget "
            "(sweep.budget_usd=5): it is the cap on every trial's spend together"
        )
    if s.max_parallel < 1:
        problems.append(f"sweep.max_parallel={s.max_parallel}: at least 1 trial must run at once")
    if metric.startswith("bench/"):
        problems += _bench_metric_problems(cfg, metric)
    elif metric not in logged:
        problems.append(
            f"sweep.metric={metric}: no trial of recipe={cfg.recipe.name} logs it; its evaluations log "
            f"{', '.join(logged)}, or bench/<task>/<metric> of an eval.tasks task"
        )
    if not (0 < s.min_fraction <= 1) or s.reduction_factor < 2:
        problems.append(
            f"sweep.min_fraction={s.min_fraction}, sweep.reduction_factor={s.reduction_factor}: "
            "the first rung is a fraction in (0, 1] of train.max_steps, the factor at least 2"
        )
    if cfg.train.max_steps <= 0:
        problems.append("train.max_steps must be positive in a sweep: its rungs are steps of it")
    n_trials = s.n_trials
    if s.sampler == "grid":
        size = space.grid_size()  # ConfigError when a key is an interval
        n_trials = min(n_trials, size) if n_trials > 0 else size
    elif n_trials < 1:
        problems.append(f"sweep.n_trials={n_trials}: sweep.sampler={s.sampler} needs the number of trials to sample")
    if problems:
        raise ConfigError("the sweep cannot start: " + "; ".join(problems) + ". Nothing was launched.")
    # the choices (StrEnum fields, checked at compose) stored as their plain strings, as the sweep's record has them
    direction = str(s.direction) if s.direction != "auto" else ("minimize" if metric in _MINIMIZED else "maximize")
    settings = dict(
        sampler=str(s.sampler),
        seed=int(s.seed),
        pruner=str(s.pruner),
        metric=metric,
        direction=direction,
        min_fraction=float(s.min_fraction),
        reduction_factor=int(s.reduction_factor),
        max_steps=int(cfg.train.max_steps),
    )
    return settings, n_trials


def _bench_metric_problems(cfg, metric: str) -> list[str]:
    """``sweep.metric=bench/<task>/<metric>``: the benchmark score of each rung's checkpoint (``eval.tasks``,
    scored at every ``train.pause_at_step`` and on the final weights), so a task of eval.tasks must report it."""
    from orchestrator.evaluation import selection, spec

    task, name = selection.split(metric)
    if not (task and name):
        return [f"sweep.metric={metric}: give bench/<task>/<metric> (e.g. bench/tiny_arith_mc/acc)"]
    if not spec.enabled(cfg):
        return [
            f"sweep.metric={metric} decides rungs by a benchmark score, but eval.tasks is empty: no trial would "
            f"log it; set 'eval.tasks=[{task}]', or a held-out sweep.metric (eval_loss)"
        ]
    try:
        spec.check_metric(cfg.eval, task, name, key=f"sweep.metric={metric}")
    except ConfigError as err:
        return [str(err).rstrip(".")]
    return []


def _plan(cfg, space: SearchSpace, final: list[str]) -> SweepPlan:
    from orchestrator.storage import store_from_config
    from orchestrator.sweep.state import SweepState

    settings, n_trials = _settings(cfg, space)
    name = checked_name(cfg, n_trials)
    fixed = [o for o in final if not o.startswith(("sweep", "run.name="))]
    given_experiment = any(o.startswith("tracking.experiment=") for o in fixed)
    experiment = str(cfg.tracking.experiment) if given_experiment else name
    trial_overrides = [f"budget.experiment_max_usd={float(cfg.sweep.budget_usd)!r}"]
    if not given_experiment:
        trial_overrides.append(f"tracking.experiment={name}")
    store = store_from_config(cfg.storage, retry=not cfg.backend.dry_run)  # a dry run waits out no outage
    state = SweepState(store, name)
    if not cfg.backend.dry_run:  # a dry run writes nothing: no record, no lease (orchestrator.sweep.dryrun)
        refuse_a_jobs_folder(store, name, name_key(cfg))
        state.open(
            space=space.to_json(),
            fixed=[_redacted(o) for o in fixed],
            settings=settings,
            allow_changes=bool(cfg.sweep.allow_changes),
        )
    return SweepPlan(
        cfg=cfg,
        space=space,
        fixed=fixed,
        trial_overrides=trial_overrides,
        settings=settings,
        state=state,
        store=store,
        experiment=experiment,
        budget_usd=float(cfg.sweep.budget_usd),
        max_parallel=int(cfg.sweep.max_parallel),
        n_trials=n_trials,
        log_dir=str(Path(cfg.run.work_dir) / "sweeps" / name),
    )


def checked_name(cfg, n_trials: int) -> str:
    """``sweep.name`` (default ``run.name``), held to ``run.name``'s rule (``orchestrator.core.names.RUN_NAME``) with its
    trials' run names (``<name>-t<k>``) too, so no trial fails on its name and the record's folder is one plain
    name (no ``/``, no ``..``): ConfigError, exit 4, before anything is written."""
    from orchestrator.core.names import RUN_NAME

    key = name_key(cfg)
    name = str(cfg.sweep.name if key == "sweep.name" else cfg.run.name)
    last = f"{name}-t{max(n_trials, 1) - 1}"
    if not RUN_NAME.fullmatch(name) or not RUN_NAME.fullmatch(last):
        raise ConfigError(
            f"{key}={name!r} cannot name a sweep: it and its trials' run names ({last!r} is the last) "
            "must each be 1-63 letters, digits, '.', '_' or '-', starting and ending with a letter or "
            f"digit, as run.name; give a shorter plain name, e.g. sweep.name=lr-search."
        )
    return name


def name_key(cfg) -> str:
    """The key that names the sweep: ``sweep.name`` when given, else ``run.name``."""
    given = cfg.sweep.name
    return "sweep.name" if given is not None and str(given) != "" else "run.name"


def refuse_a_jobs_folder(store, name: str, key: str) -> None:
    """ConfigError (exit 4), before anything is written, when ``<name>/`` is an ordinary job's folder (its
    ledger is there): the sweep's record would go in beside that job's ledger and checkpoints (a sweep's own
    folder holds no ledger: its trials are ``<name>-t<k>``)."""
    from orchestrator.records.ledger import LEDGER_FILENAME

    ledger = f"{name}/{LEDGER_FILENAME}"
    if store.exists(ledger):
        raise ConfigError(
            f"{key}={name!r} names an ordinary job ({store.get_uri(ledger)} is its ledger): the "
            f"sweep's record would go into that job's folder. Give the sweep a name of its own, e.g. "
            f"sweep.name={name}-sweep."
        )


def _redacted(item: str) -> str:
    """An override as the sweep's record stores it: a secret's value (a webhook URL, a token) replaced."""
    from orchestrator.core.redaction import redact

    key, _, value = item.partition("=")
    leaf = key.rsplit(".", 1)[-1]
    return f"{key}={redact({leaf: value})[leaf]}"
