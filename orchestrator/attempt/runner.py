"""One attempt, in order: begin -> load data (the checkpoint's download starts) -> build (the model's
load) -> restore (the download joined) -> train -> finish | stop.

The runner sequences the collaborators ``orchestrator.attempt.build`` made for it (record, checkpoints,
money, tracking, preemption, recipe, the steering callbacks), and is what the Trainer callback calls back
into (``on_step``, ``stop_reason``, ``commit``, ``on_metrics``): that callback is the one part it makes
itself, in ``build``, handing it itself. It decides nothing about storage, cost or MLflow itself.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence, cast

from orchestrator.attempt.measure import peak_memory_bytes
from orchestrator.attempt.ports import CheckpointInterval, StepClock
from orchestrator.attempt.record import record_repro
from orchestrator.attempt.resolved import ResolvedConfig
from orchestrator.attempt.trial import finish_trial
from orchestrator.checkpoint import safe_load
from orchestrator.config.typed import JobConfig
from orchestrator.core import exitcodes
from orchestrator.core.exitcodes import ExitClass
from orchestrator.storage.base import TransientStorageError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TestHooks:
    """Knobs for the tests, read once at start; all off (costing nothing per step) unless set.

    ORCH_HEARTBEAT_SECONDS: how often the ledger hears from the attempt (default 15 s).
    ORCH_FAULT_AFTER_STEPS: crash every attempt this many steps after it started (chaos tests).
    ORCH_STEP_DELAY_SECONDS: a floor under each step, so interruptions land mid-run on any machine.
    """

    heartbeat_seconds: float = 15.0
    fault_after_steps: int = 0
    step_delay_seconds: float = 0.0

    def after_step(self, steps_this_attempt: int) -> None:
        if self.step_delay_seconds:
            time.sleep(self.step_delay_seconds)
        if self.fault_after_steps and steps_this_attempt >= self.fault_after_steps:
            raise RuntimeError(f"injected fault after {self.fault_after_steps} steps (ORCH_FAULT_AFTER_STEPS)")

    @classmethod
    def from_environ(cls, environ=os.environ) -> "TestHooks":
        return cls(
            heartbeat_seconds=float(environ.get("ORCH_HEARTBEAT_SECONDS", "15")),
            fault_after_steps=int(environ.get("ORCH_FAULT_AFTER_STEPS", "0")),
            step_delay_seconds=float(environ.get("ORCH_STEP_DELAY_SECONDS", "0")),
        )


class StopReason(str):
    """Why training stops early (the text users read), with the outcome it leads to."""

    exit_class: ExitClass

    def __new__(cls, text: str, exit_class: ExitClass):
        obj = super().__new__(cls, text)
        obj.exit_class = exit_class
        return obj

    def __reduce__(self):  # broadcast to the other ranks by pickling
        return StopReason, (str(self), self.exit_class)


def pause_reason(pause: int, max_steps: int, step: int) -> Optional[StopReason]:
    """``train.pause_at_step`` (``pause``): stop with a checkpoint at that step (a sweep's rung), exit 3.
    Plain numbers: this runs every step, and an OmegaConf lookup costs tens of microseconds."""
    if 0 < pause <= step < max_steps:
        return StopReason(
            f"paused at step {step} (train.pause_at_step={pause}: a sweep's rung; relaunch with a "
            "larger train.pause_at_step to go on from this checkpoint)",
            ExitClass.BUDGET_EXHAUSTED,
        )
    return None


class Runner:
    """Sequences the parts ``build_attempt`` made; ``resolved``: the config it writes; ``run_name``: the job's name in
    storage, ``main``: this rank prints the results; ``interval``, ``steps`` go to the callbacks (``attempt/ports.py``)."""

    def __init__(
        self,
        cfg: Any,
        *,
        job: JobConfig,
        resolved: ResolvedConfig,
        run_name: str,
        recipe: Any,
        record: Any,
        checkpoints: Any,
        money: Any,
        tracking: Any,
        quality: Any,
        preemption: Any,
        hooks: TestHooks,
        interval: CheckpointInterval,
        steps: StepClock,
        main: bool,
        steering: Sequence[Any] = (),
    ):
        self.cfg, self.resolved, self.run_name, self.recipe, self.main = cfg, resolved, run_name, recipe, main
        self.record, self.checkpoints, self.money, self.tracking = record, checkpoints, money, tracking
        self.quality = quality  # the "before" evaluation, early stopping, checkpoint.final
        self.preemption, self.hooks, self.job = preemption, hooks, job  # job: the typed view; cfg: the recipe's
        self.interval, self.steps, self.steering = interval, steps, list(steering)
        # the steering part that scores the final weights too (eval.tasks: orchestrator.evaluation.watch)
        self.bench = next((part for part in self.steering if hasattr(part, "after_final")), None)
        self.trial, self.pause_at, self.max_steps = (
            job.train.trial_steps > 0,
            job.train.pause_at_step,
            job.train.max_steps,
        )  # read every step: plain numbers
        self.step = self.step_at_start = 0
        self.first_step_seconds: Optional[float] = None
        self.beat = Heartbeat(record, money, preemption, every_seconds=hooks.heartbeat_seconds)
        self.callback: Any = None  # the Trainer callback (an OrchestratorCallback), made in build()

    # ---- the sequence ---------------------------------------------------------
    def run(self) -> int:
        self.begin()
        self.preemption.install()
        try:
            train_ds, eval_ds = self.load_data()  # and the checkpoint's download starts, behind the model's load
            trainer = self.build(train_ds, eval_ds)
            restored, manifest = self.restore()
            self.quality.ask_before(trainer, fresh=restored is None)  # the "before" of quality per dollar
            with safe_load.no_code_from_storage():  # every torch.load weights_only=True, DeepSpeed's too
                trainer.train(resume_from_checkpoint=str(restored) if restored else None)
            self.checkpoints.wait()
            if self.trial:
                finish_trial(
                    self.cfg, trainer, steps=self.steps, money=self.money, tracking=self.tracking, step=self.step
                )
                self.end(ExitClass.COMPLETED)
                return exitcodes.COMPLETED
            if self.callback.stop_reason:
                return self.stop(self.callback.stop_reason)
            return self.finish(trainer, eval_ds)
        finally:
            self.preemption.uninstall()
            self.checkpoints.close()

    def begin(self) -> None:
        """1. Take the job's next fence in the ledger (or stop: caps, budget, completed); open MLflow."""
        self.record.begin(self.checkpoints.newest_step(), final_uri=self.checkpoints.final_uri())
        self.checkpoints.remove_uncommitted()
        self.record.set_mlflow_run_id(self.tracking.start())
        record_repro(self.resolved.plain, self.record, self.tracking)

    def load_data(self):
        """2. The datasets and their fingerprint (the checkpoint's download starts behind the model's load)."""
        from recipes.data import fingerprint, load_datasets

        train_ds, eval_ds = load_datasets(self.cfg.data, self.cfg.recipe.name)
        self.checkpoints.set_dataset(fingerprint(train_ds, self.cfg.data))
        self.tracking.log_dataset(train_ds, self.checkpoints.dataset_fp, self.cfg.data)
        return train_ds, eval_ds

    def restore(self):
        """4. The newest usable checkpoint of this trajectory, verified (None: start fresh)."""
        from orchestrator.checkpoint.fingerprint import check_resumable

        restored, manifest = self.checkpoints.restore(
            check=lambda m: check_resumable(m, self.checkpoints.trajectory, self.checkpoints.dataset_fp, self.cfg)
        )
        self.step = self.step_at_start = manifest["step"] if manifest else 0
        self.money.start(self.record.prior_attempts, self.record.prior_cost_usd, self.step_at_start)
        self.tracking.replay_history(restored)  # the Trainer's logs a SIGKILL kept from MLflow
        return restored, manifest

    def build(self, train_ds, eval_ds):
        """3. The recipe's TRL trainer, with the orchestrator's callback."""
        from orchestrator.checkpoint.callback import OrchestratorCallback
        from orchestrator.tracking.progress import attach_progress

        cfg, job, trial = self.cfg, self.job, self.trial  # a trial measures steps and saves nothing
        self.callback = OrchestratorCallback(
            self,
            interval=CheckpointInterval.off() if trial else self.interval,
            steps=self.steps,
            every_steps=0 if trial else job.checkpoint.every_steps,
            stop_after_steps=job.train.trial_steps,
            save_best=job.checkpoint.final == "best",
        )
        trainer = self.recipe.build_trainer(
            cfg,
            train_dataset=train_ds,
            eval_dataset=eval_ds,
            output_dir=str(self.checkpoints.work / "trainer"),
            callbacks=[self.callback, *self.steering],
            **recipe_extras(cfg, self.checkpoints),
        )
        self.checkpoints.use_snapshot_root(trainer)
        attach_progress(
            trainer, job.tracking, main=self.main, dollars=self.dollars, every_s=job.durations.job_metrics_every
        )
        return trainer

    # ---- the callback's hooks ---------------------------------------------------
    def stop_reason(self) -> Optional[StopReason]:
        if self.preemption.requested:
            return StopReason(f"preempted ({self.preemption.reason})", ExitClass.PREEMPTED)
        try:
            budget = self.money.stop_reason(
                self.step,
                self.step_at_start,
                first_step_seconds=self.first_step_seconds,
                restarts=len(self.record.prior_attempts),
            )
        except TransientStorageError as err:  # the spend index stayed unreachable for storage.retry_for
            return StopReason(f"preempted (storage outage: {err})", ExitClass.PREEMPTED)
        return (
            StopReason(budget, ExitClass.BUDGET_EXHAUSTED)
            if budget
            else pause_reason(self.pause_at, self.max_steps, self.step)
        )

    def dollars(self, step: int, total: int) -> tuple[float, Optional[float]]:
        """Spent so far and the projected total at ``step`` (what the progress display shows)."""
        return self.money.total_cost_usd(), self.money.projected_total_usd(
            step,
            max_steps=total,
            step_at_start=self.step_at_start,
            first_step_seconds=self.first_step_seconds,
            restarts=len(self.record.prior_attempts),
        )

    def on_step(self, step: int) -> None:
        self.step = step
        if not self.record.writes:
            return
        if self.first_step_seconds is None:
            self.first_step_seconds = self.money.meter.attempt_seconds()
            log.info(
                "metered start-up: %.2fs (billed from the process start to the first step, as the budget counts it; "
                "resumed at step %d)",
                self.first_step_seconds,
                self.step_at_start,
            )
        self.hooks.after_step(step - self.step_at_start)
        self.beat.maybe(step)

    def commit(self, folder, step: int, *, wait: bool) -> None:
        self.checkpoints.commit(folder, step, wait=wait, seconds_left=self.preemption.seconds_left())

    def on_metrics(self, metrics: dict, step: int) -> None:
        """The Trainer's logs plus the job's cost and throughput figures, keyed by optimizer step."""
        self.quality.observe(metrics, step)  # and each evaluation's numbers into the ledger
        if not self.tracking.active:
            return
        self.money.figures.observe_logs(metrics, step)

        def job_figures(closing: bool) -> dict:
            timing = self.steps.timing_metrics()
            out = dict(peak_memory_bytes=peak_memory_bytes(), **timing)
            if not closing:
                out.update(self.cost_figures(step, window_step_seconds=timing.get("step_time_s")))
            return out

        closing = self.callback.stop_reason is not None or "train_runtime" in metrics or 0 < self.max_steps <= step
        self.tracking.on_trainer_log(metrics, step, closing=closing, job_figures=job_figures)

    def cost_figures(
        self, step: int, *, window_step_seconds: Optional[float] = None, ledger: Optional[dict] = None
    ) -> dict:
        figures = self.money.cost_figures(
            step,
            steps=self.steps,
            upload_seconds=self.checkpoints.upload_seconds(),
            window_step_seconds=window_step_seconds,
            ledger=ledger,
        )
        return figures if self.bench is None else dict(figures, **self.bench.figures())

    # ---- 4-5. how the attempt ends ----------------------------------------------------
    def stop(self, reason: StopReason) -> int:
        """After an emergency checkpoint: preempted (requeue) or budget exhausted (stop)."""
        if self.beat.fenced_error is not None:
            raise self.beat.fenced_error
        self.end(reason.exit_class)
        if reason.exit_class is ExitClass.BUDGET_EXHAUSTED and self.main:
            print(f"stopped: {reason}; the final checkpoint is committed and the job will not be requeued", flush=True)
        return cast(int, exitcodes.outcome(reason.exit_class).exit_code)  # a stop: preempted or budget

    def finish(self, trainer, eval_ds) -> int:
        """5. Final weights committed, held-out evaluation, the attempt closed as completed."""
        cfg, job = self.cfg, self.job
        weights_step = self.quality.after_training(trainer, self.step)  # an early stop; checkpoint.final=best's weights
        saved = self.checkpoints.save_final(
            trainer,
            weights_step,
            config_yaml=self.resolved.yaml,
            upload=job.checkpoint.save_final_weights,
            to_mlflow=self.tracking if job.tracking.log_final_weights else None,
        )
        if self.bench is not None:
            self.bench.after_final(trainer, weights_step)
        metrics = self.recipe.evaluate(trainer, cfg, eval_ds) if job.train.eval_at_end else {}
        if not self.main:
            return exitcodes.COMPLETED
        self.quality.print_final(metrics)
        self.record.update_quality(metrics)
        self.tracking.log_metrics(metrics, self.step)
        self.end(ExitClass.COMPLETED, final_metrics=metrics)
        if saved:
            print(f"final weights: {self.checkpoints.final_uri()}", flush=True)
        return exitcodes.COMPLETED

    def end(self, exit_class: ExitClass, *, final_metrics: Optional[dict] = None) -> None:
        """Close the attempt in the ledger; log the final cost figures, the cost report and the redacted
        config to MLflow; tag the run with its status; close the run (statuses: ``exitcodes.OUTCOMES``)."""
        if not self.record.writes:
            return
        ledger = self.record.end(exit_class, self.step, self.money.attempt_cost_usd())
        row = exitcodes.outcome(exit_class)
        if not self.money.wait_for_alerts():
            log.warning("a budget alert was still being sent when the attempt ended; it may not arrive")
        if not self.tracking.active:
            return
        self.tracking.close_with_report(
            job=self.run_name,
            step=self.step,
            status=row.ledger_status,
            tracker_status=row.mlflow_status,
            ledger=ledger,
            figures=self.cost_figures(self.step, ledger=ledger),
            money=self.money,
            **self.quality.report(final_metrics),
            config_yaml=self.resolved.yaml,
            bench_records=None if self.bench is None else list(self.bench.records.values()),
        )

    @property
    def began(self) -> bool:  # it took a fence in the ledger, so its end may be recorded
        return bool(self.record.fence)

    def fail(self, exit_class: ExitClass) -> None:
        """Best effort: record a failed attempt; the ledger may be what failed."""
        self.record.fail(exit_class, self.step, self.money.attempt_cost_usd())
        self.tracking.close(exitcodes.outcome(exit_class).mlflow_status or "FAILED", flush_timeout_s=10)


def recipe_extras(cfg: Any, checkpoints: Any) -> dict:
    """What a recipe keeps in storage beside the checkpoints: DPO's stored reference log-probs, GRPO's rewards."""
    extra = (
        {"ref_log_probs": checkpoints.ref_log_probs()}
        if cfg.recipe.name == "dpo" and cfg.recipe.precompute_ref_log_probs
        else {}
    )
    if cfg.recipe.name == "grpo":
        extra["reward_cache"] = checkpoints.reward_cache()
    return extra


class Heartbeat:
    """Every ``every_seconds`` of training: the step and the attempt's cost to the ledger. Another attempt's
    fence, or storage unreachable for ``storage.retry_for``, asks the attempt to save what it can and stop."""

    def __init__(self, record: Any, money: Any, preemption: Any, *, every_seconds: float):
        self.record, self.money, self.preemption, self.every_seconds = record, money, preemption, every_seconds
        self.fenced_error: Optional[Exception] = None
        self._last = time.monotonic()

    def maybe(self, step: int) -> None:
        if time.monotonic() - self._last >= self.every_seconds:
            self.beat(step)

    def beat(self, step: int) -> None:
        self._last = time.monotonic()
        try:
            fenced = self.record.heartbeat(step, self.money.attempt_cost_usd())
        except TransientStorageError as err:  # unreachable for storage.retry_for: save what it can, stop as preempted
            self.preemption.request(f"storage outage: {err}")
            return
        if fenced is not None:  # another attempt took over: save nothing more, stop
            self.fenced_error = fenced
            self.preemption.request(f"fenced: {fenced}")
