"""The typed view of a composed config: every group as its schema's dataclass, every duration parsed once.

Hydra composes the job config into a ``DictConfig`` (``orchestrator.config.compose``). An attempt builds this view
of it once, at its boundary (``orchestrator.attempt.build``), and hands its parts the groups they read as plain
dataclasses (``OmegaConf.to_object``) and the durations as numbers; the launch checks, the planner and the
benchmark check parse durations through ``Durations.of``, so ``checkpoint.every`` is parsed here and nowhere else.
(The launch, a sweep's driver and an evaluation job still hand their parts the ``DictConfig``: docs/architecture.md
says what is left.) The ``DictConfig`` stays the source of what is written (``config.yaml``, the trajectory fingerprint,
MLflow's params): the view only reads it.

A new key reaches a part by its schema field (``orchestrator.config.schema``): the part reads it off the group's
dataclass it is handed; a new duration gets its parsed field in ``Durations`` and its check at compose for free.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any, Callable, Optional

from omegaconf import OmegaConf

from orchestrator.config.schema import (
    BackendConfig,
    BudgetConfig,
    CheckpointConfig,
    ComputeConfig,
    DataConfig,
    DistributedConfig,
    EvalConfig,
    ModelConfig,
    PreemptionConfig,
    PricingConfig,
    RecipeConfig,
    RequeueConfig,
    RunConfig,
    StorageConfig,
    SweepConfig,
    TrackingConfig,
    TrainConfig,
)
from orchestrator.core.durations import Every, parse_deadline, parse_duration
from orchestrator.core.errors import ConfigError


def interval_bounds(min_every: object, max_every: object) -> tuple[float, float]:
    """(``checkpoint.min_every``, ``checkpoint.max_every``) in seconds. Raises ValueError naming the keys."""
    low = parse_duration(str(min_every), key="checkpoint.min_every")
    high = parse_duration(str(max_every), key="checkpoint.max_every")
    if low <= 0 or high < low:
        raise ValueError(
            f"checkpoint.min_every={min_every!r} and checkpoint.max_every={max_every!r} must satisfy "
            "0 < min_every <= max_every; e.g. checkpoint.min_every=1m checkpoint.max_every=1h."
        )
    return low, high


@dataclass(frozen=True)
class Durations:
    """The config's durations in seconds, parsed once (``of``). ``checkpoint_every``: auto or seconds (0: off);
    ``checkpoint_bounds``: auto's (min_every, max_every); ``deadline``: ``run.deadline`` as
    ``core.durations.parse_deadline`` reads it, or None."""

    checkpoint_every: Every
    preemption_grace: float
    system_metrics_every: float
    job_metrics_every: float
    storage_retry_for: float
    checkpoint_bounds: tuple[float, float]
    deadline: Optional[tuple[str, float]]
    reserve_ahead: float
    pricing_max_age: float

    @classmethod
    def of(cls, cfg: Any) -> "Durations":
        """Parse the durations of ``cfg`` (a ``DictConfig`` or the typed groups). Raises ``DurationErrors`` (a
        ConfigError: exit 4) naming every bad key and the forms it takes."""
        problems: list[str] = []

        def parsed(parse: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            try:
                return parse(*args, **kwargs)
            except ValueError as err:
                problems.append(str(err))
                return None

        every = parsed(Every.parse, cfg.checkpoint.every)
        simple = {name: parsed(parse_duration, str(_select(cfg, key)), key=key) for name, key in _SIMPLE}
        bounds = parsed(interval_bounds, cfg.checkpoint.min_every, cfg.checkpoint.max_every)
        deadline = None if cfg.run.deadline is None else parsed(parse_deadline, cfg.run.deadline)
        reserve = parsed(parse_duration, str(cfg.budget.reserve_ahead), key="budget.reserve_ahead")
        max_age = parsed(parse_duration, str(cfg.pricing.max_age), key="pricing.max_age")
        if problems:
            raise DurationErrors(problems)
        return cls(
            checkpoint_every=every,
            checkpoint_bounds=bounds,
            deadline=deadline,
            reserve_ahead=reserve,
            pricing_max_age=max_age,
            **simple,
        )


class DurationErrors(ConfigError):
    """The durations that do not parse, each its own problem (``problems``), as the launch checks list them."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


_SIMPLE = (
    ("preemption_grace", "preemption.grace"),
    ("system_metrics_every", "tracking.system_metrics_every"),
    ("job_metrics_every", "tracking.job_metrics_every"),
    ("storage_retry_for", "storage.retry_for"),
)


def _select(cfg: Any, key: str) -> Any:
    group, _, leaf = key.partition(".")
    return getattr(getattr(cfg, group), leaf)


@dataclass(frozen=True)
class JobConfig:
    """The job config as the parts read it: the groups as the schemas' dataclasses (``recipe``: the recipe's own,
    ``DpoRecipeConfig`` for dpo), and ``durations`` parsed. Built once per process by ``of``; read, never changed
    (``dataclasses.replace`` makes a changed copy, as the attempt does for the compute it runs on)."""

    run: RunConfig
    recipe: RecipeConfig
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    compute: ComputeConfig
    storage: StorageConfig
    pricing: PricingConfig
    checkpoint: CheckpointConfig
    preemption: PreemptionConfig
    requeue: RequeueConfig
    budget: BudgetConfig
    tracking: TrackingConfig
    backend: BackendConfig
    distributed: DistributedConfig
    eval: EvalConfig
    sweep: SweepConfig
    durations: Durations

    @classmethod
    def of(cls, cfg: Any) -> "JobConfig":
        """The view of a composed ``DictConfig`` (resolved: environment variables read now). Raises ConfigError
        for a value that does not resolve or a duration that does not parse."""
        from omegaconf.errors import OmegaConfBaseException

        groups = [group.name for group in fields(cls) if group.name != "durations"]
        try:
            typed: dict[str, Any] = {name: OmegaConf.to_object(cfg[name]) for name in groups}
        except OmegaConfBaseException as err:
            raise ConfigError(f"{getattr(err, 'full_key', '') or 'the config'}: {err}".strip()) from None
        return cls(durations=Durations.of(SimpleNamespace(**typed)), **typed)
