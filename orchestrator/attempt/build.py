"""The one place an attempt's parts are made: ``build_attempt(cfg)`` -> a ``Runner`` ready to run.

The main rank gets the parts that write (ledger record, MLflow, the budget
guard, the cloud's spot-notice watcher); other ranks get the same kinds of
object with those capabilities left out, never a mutated config.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, cast

from orchestrator.attempt.capacity_contract import ACTION_ENV, REQUEST_FILE_ENV, attempt_capacity, attempt_compute
from orchestrator.attempt.checkpoints import CheckpointController
from orchestrator.attempt.datacache import PreparedDataCache, cache_wanted
from orchestrator.attempt.money import MoneyWatch, SpendWatch
from orchestrator.attempt.ports import CheckpointInterval, StepClock
from orchestrator.attempt.quality import QualityWatch
from orchestrator.attempt.record import AttemptRecord, FollowerRecord
from orchestrator.attempt.reporting import AttemptTracking
from orchestrator.attempt.resolved import resolve
from orchestrator.attempt.runner import Runner, TestHooks
from orchestrator.attempt.zone import attempt_zone
from orchestrator.config.schema import ComputeConfig
from orchestrator.config.typed import JobConfig
from orchestrator.core import ranks as dist
from orchestrator.core.errors import ConfigError, DataError
from orchestrator.money.spend_holds import HOLD_ENV
from orchestrator.storage import inputs


def job_name(cfg: Any) -> str:
    """The job's name in storage: a trial is its own job, so it neither resumes nor completes the real one."""
    return cfg.run.name + ("-trial" if cfg.train.trial_steps > 0 else "")


def build_attempt(cfg: Any, *, environ=os.environ) -> Runner:
    from orchestrator.attempt.restart import RestartClock

    clock = RestartClock()  # the start-up timeline: its parts are made from here
    clock.mark("parts")
    from orchestrator.attempt.preemption import PreemptionHandler
    from orchestrator.checkpoint.fingerprint import trajectory_config
    from orchestrator.checkpoint.store import CheckpointStore
    from orchestrator.money.budget import BudgetGuard, default_sinks
    from orchestrator.policy.requeue import RequeuePolicy
    from orchestrator.records.ledger import Ledger
    from orchestrator.storage import store_from_config
    from orchestrator.tracking.progress import quiet_data_progress

    settings = JobConfig.of(cfg)  # the typed view: the groups as dataclasses, the durations parsed, once
    quiet_data_progress(settings.tracking.data_progress_bars)  # before the recipe maps its data
    main = dist.is_main()
    run_name = job_name(settings)
    resolved = resolve(cfg)  # config.yaml, the repro record and MLflow's params: one resolved dict
    store = store_from_config(settings.storage)
    capacity, compute, catalog, price, placed = placed_price(cfg, settings.compute, store, run_name, environ, main)
    ledger = Ledger(store, run_name, keep_checkpoints=settings.checkpoint.keep_last)
    money = MoneyWatch.from_config(cfg, price, started_at=clock.marks["start"])  # billed from the process start
    spend = spend_watch(settings, store, run_name, money, hold=environ.get(HOLD_ENV)) if main else None
    record = (
        AttemptRecord(
            ledger,
            RequeuePolicy(settings.requeue),
            compute=compute,
            zone=placed,
            budget_max_usd=settings.budget.max_usd,
            spend=spend,
        )
        if main
        else FollowerRecord()
    )

    token, work = attempt_folder(settings, run_name, environ)
    # s3:// data, templates and weights land here, once per attempt; the main rank holds each to the first attempt's
    inputs.use(settings.storage, work / "inputs", on_listed=functools.partial(pin_input, ledger) if main else None)
    checkpoints = CheckpointController(
        CheckpointStore(store, run_name, keep_last=settings.checkpoint.keep_last, staging_dir=work / "staging"),
        record,
        main=main,
        work=work,
        token=token,
        snapshot_dir=settings.checkpoint.snapshot_dir,
        full_model=settings.recipe.peft == "full",
        trajectory=trajectory_config(cfg),
        attempt_cost_usd=money.attempt_cost_usd,
        clock=clock,
    )

    from recipes import recipe_for
    from recipes.evaluation import quality_metric

    recipe = recipe_for(settings.recipe.name)
    tracking = AttemptTracking.from_config(
        cfg,
        settings.tracking,
        main=main,
        run_name=run_name,
        ledger=ledger.load() if main and settings.tracking.enabled else {},
        params=resolved.plain,
        quality_metric=quality_metric(cfg).name,
        job_metrics_every_s=settings.durations.job_metrics_every,
    )
    if main:
        sinks = default_sinks(settings.budget, set_tag=tracking.set_tag if tracking.active else None)
        money.watch_budget(
            BudgetGuard(settings.budget, record_alert=record.record_alert, job_name=run_name, sinks=sinks),
            cast(Any, spend).with_alerts(settings.budget, sinks),
        )
    # every rank must survive the signal to save; rank 0 alone watches the cloud's notices
    preemption = PreemptionHandler.from_config(
        settings.preemption, watch_cloud=main, grace_seconds=settings.durations.preemption_grace
    )
    quality = QualityWatch(cfg, record=record, checkpoints=checkpoints, tracking=tracking)
    recipe = measured_recipe(cfg, recipe, clock, checkpoints=checkpoints, record=record, tracking=tracking, work=work)
    hooks = TestHooks.from_environ(environ)
    parts: dict[str, Any] = dict(
        record=record, tracking=tracking, interval=checkpoint_interval(settings), steps=StepClock()
    )
    steer = (
        steering(
            cfg,
            settings,
            parts,
            store=store,
            run_name=run_name,
            checkpoints=checkpoints,
            money=money,
            preemption=preemption,
            compute=compute,
            capacity=capacity,
            catalog=catalog,
            hooks=hooks,
            environ=environ,
        )
        if main and settings.train.trial_steps <= 0
        else []
    )
    return Runner(
        cfg,
        job=settings,
        resolved=resolved,
        run_name=run_name,
        recipe=recipe,
        checkpoints=checkpoints,
        money=money,
        quality=quality,
        preemption=preemption,
        hooks=hooks,
        main=main,
        steering=steer,
        **parts,
    )


def cached_catalog(cfg: Any, store: Any) -> dict:
    """The prices the cache in ``store`` holds while fresh, over the shipped catalog (read, never fetched here: the
    launch and the plan fetch): what an attempt's meter and the supervisor's start-up holds price with."""
    from orchestrator.money.price_refresh import current_catalog

    return current_catalog(cfg, refresh=False, store=store)[0]


def placed_price(cfg: Any, configured: ComputeConfig, store: Any, run_name: str, environ, main: bool) -> tuple:
    """(capacity, compute, catalog, price, zone) of this attempt: ``attempt_price`` with the cached prices, then
    where it landed (``attempt.zone``: compute.zones), whose price its meter bills."""
    capacity, compute, catalog, price = attempt_price(configured, environ, cached_catalog(cfg, store))
    placed, price = attempt_zone(cfg, store, run_name, price, environ=environ, main=main)
    return capacity, compute, catalog, price, placed


def attempt_price(configured: ComputeConfig, environ, catalog=None) -> tuple:
    """(capacity, compute, catalog, price) of this attempt, from the job's ``compute``: a backend may run a spot
    job on-demand (run.deadline); ``compute``: the ``ComputeConfig`` it runs on. ``catalog``: the prices to use
    (``money.price_refresh.current_catalog``: fetched ones while fresh), else the shipped catalog."""
    from orchestrator.money.cost import load_catalog, price_for

    capacity = attempt_capacity(configured, environ)
    compute = attempt_compute(configured, capacity)
    catalog = load_catalog() if catalog is None else catalog
    try:
        return capacity, compute, catalog, price_for(compute, catalog)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def pin_input(ledger: Any, uri: str, digest: str) -> None:
    """Hold an ``s3://`` input to what the job's first attempt listed under it (``records.ledger.pin_input``): a model or
    data swapped under the same key between attempts stops the job (exit 4, never requeued), not resumed on."""
    from orchestrator.records.ledger import pin_input as pin

    earlier = pin(ledger, uri, digest)
    if earlier is not None:
        raise DataError(
            f"{uri} changed since the job's first attempt: its objects (paths, sizes, ETags) digest "
            f"{digest[:12]} now, {earlier[:12]} then, so this job's checkpoints were trained on other "
            "inputs. Put the original objects back, or start over under a new run.name."
        )


def attempt_folder(cfg: Any, run_name: str, environ) -> tuple[str, Path]:
    """(token, folder): one folder per attempt, shared by its ranks (the launcher hands them the token)."""
    token = environ.get("ORCH_ATTEMPT_TOKEN", f"pid{os.getpid()}")
    return token, Path(cfg.run.work_dir).expanduser().resolve() / run_name / token


def checkpoint_interval(job: JobConfig) -> CheckpointInterval:
    """``checkpoint.every``: a fixed interval (off at 0), or ``auto``'s, which the checkpoint schedule decides."""
    every = job.durations.checkpoint_every
    return CheckpointInterval.derived() if every.auto else CheckpointInterval.fixed(every.seconds)


def steering(
    cfg: Any,
    job: JobConfig,
    parts: dict,
    *,
    store: Any,
    run_name: str,
    checkpoints: CheckpointController,
    money: MoneyWatch,
    preemption: Any,
    compute: Any,
    capacity: str,
    catalog: dict,
    hooks: TestHooks,
    environ,
) -> list:
    """The main rank's Trainer callbacks besides the orchestrator's: the checkpoint schedule
    (``checkpoint.every=auto``), the deadline's capacity watch (``run.deadline``) and the benchmark watch
    (``eval.tasks``). ``parts``: the record, the tracking, the interval and the step clock they share with the
    runner."""
    from orchestrator.attempt.capacity import CapacityWatch
    from orchestrator.attempt.schedule import CheckpointSchedule
    from orchestrator.evaluation.watch import bench_watch
    from orchestrator.money.budget import WebhookSink, webhook_url

    callbacks: list = []
    bench = bench_watch(
        cfg,
        store=store,
        run_name=run_name,
        tracking=parts["tracking"],
        checkpoints=checkpoints,
        money=money,
        steps=parts["steps"],
        record=parts["record"],
    )
    if bench is not None:
        callbacks.append(bench)
    if parts["interval"].auto:
        low, high = job.durations.checkpoint_bounds
        callbacks.append(
            CheckpointSchedule(
                **parts,
                full_model=checkpoints.full_model,
                uploading=checkpoints.uploading,
                compute=compute,
                catalog=catalog,
                min_seconds=low,
                max_seconds=high,
            )
        )
    if job.run.deadline:
        url = webhook_url(job.budget)
        callbacks.append(
            CapacityWatch(
                **parts,
                job=run_name,
                request_stop=preemption.request,
                total_cost_usd=money.total_cost_usd,
                budget_max_usd=job.budget.max_usd,
                deadline=str(job.run.deadline),
                capacity=capacity,
                action=environ.get(ACTION_ENV) or None,
                request_file=environ.get(REQUEST_FILE_ENV, ""),
                restart_override=job.compute.restart_seconds,
                webhook=WebhookSink(url) if url else None,
                heartbeat_seconds=hooks.heartbeat_seconds,
                spot_job=bool(job.compute.spot),
            )
        )
    return callbacks


def measured_recipe(
    cfg: Any,
    recipe: Any,
    clock: Any,
    *,
    checkpoints: CheckpointController,
    record: Any,
    tracking: AttemptTracking,
    work: Path,
) -> Any:
    """The recipe with its build timed, its training set from the prepared-dataset cache, and the restart
    split reported to the ledger and MLflow at the first step."""
    from orchestrator.attempt.restart import MeasuredRecipe

    def report(split: dict, step: int) -> None:
        record.record_restart(split)
        # an earlier attempt SIGKILLed before its points left it: its split is in the ledger, logged here at
        # its own step (a step the run already has is dropped, so nothing is logged twice)
        for earlier in record.prior_attempts:
            logged = earlier.extra.get("restart")  # an AttemptEntry; its extra is a JSON object, read as it is
            if isinstance(logged, dict) and logged:
                tracking.log_metrics({f"restart_{k}": v for k, v in logged.items()}, earlier.step_start + 1)
        tracking.log_metrics({f"restart_{k}": v for k, v in split.items()}, step)

    cache = PreparedDataCache(checkpoints.checkpoints, work=work) if cache_wanted(cfg) else None
    return MeasuredRecipe(recipe, clock, cache=cache, data_fingerprint=lambda: checkpoints.dataset_fp, report=report)


def spend_watch(settings: JobConfig, store: Any, run_name: str, money: MoneyWatch, *, hold=None) -> SpendWatch:
    """The attempt's hold on the store's spend index: every job records its spend there, capped or not."""
    from orchestrator.money.budget import spend_caps
    from orchestrator.money.spend import SpendIndex

    caps = spend_caps(settings.budget, run_name, str(settings.tracking.experiment))
    return SpendWatch(
        SpendIndex(store, caps),
        usd_per_second=money.price.usd_per_second,
        window_s=settings.durations.reserve_ahead,
        spent=money.attempt_cost_usd,
        hold=hold,
    )
