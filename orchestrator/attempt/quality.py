"""The attempt's held-out quality: the "before training" value, early stopping, which weights end in ``final/``.

The evaluations themselves are the Trainer's (``recipes.evaluation``): every ``train.eval_steps``,
at the start of a fresh job (``eval_on_start``: the "before" value against which USD per quality
point is counted) and at the end. This part

* asks for the "before" evaluation on a fresh start and records its value in the ledger
  (``quality.<metric>_before``), so a resumed attempt still knows it;
* after training, tells an early stop (``EarlyStoppingCallback``'s counter reached
  ``train.early_stopping_patience``) from a run to ``max_steps``: the job ends completed, with the
  reason printed, in the ledger (``quality.stopped_early``) and as the MLflow tag ``stop_reason``;
* with ``checkpoint.final=best``, loads the best evaluation's checkpoint (kept by retention) back
  into the trainer before the final weights are written and evaluated;
* hands the closing report the metric, its value and its "before".
"""

from __future__ import annotations

import logging
from typing import Any, Optional

log = logging.getLogger(__name__)

# the held-out numbers each evaluation leaves in the ledger (``quality.evals``)
EVAL_RECORDED = ("eval_loss", "eval_perplexity", "eval_accuracy", "eval_reward_accuracy", "eval_reward_margin")


class QualityWatch:
    """Args:
    cfg: the job's config.
    record: the attempt's ledger record (the main rank's writes; a follower's do nothing).
    checkpoints: the attempt's checkpoint controller (the best checkpoint's download).
    tracking: the attempt's MLflow side (the stop reason's tag).
    """

    def __init__(self, cfg: Any, *, record: Any, checkpoints: Any, tracking: Any):
        from recipes.evaluation import quality_metric

        self.cfg = cfg
        self.record = record
        self.checkpoints = checkpoints
        self.tracking = tracking
        self.metric = quality_metric(cfg)
        # what early stopping and checkpoint.final=best select on (a benchmark metric: the benchmark watch's)
        self.select_name = str(cfg.train.early_stopping_metric or "") or self.metric.name
        self.before_key = f"{self.metric.name}_before"
        self.stop_reason: Optional[str] = None
        self._expect_before = False

    @property
    def name(self) -> str:
        return self.metric.name

    # ---- before training ----------------------------------------------------------
    def ask_before(self, trainer, *, fresh: bool) -> None:
        """On a fresh start (no checkpoint restored) the Trainer evaluates once before its first step.

        Only fresh starts: a resumed attempt has its "before" in the ledger, and its RNG comes back from
        the checkpoint, so the evaluation an uninterrupted run made at step 0 is neither redone nor missed.
        """
        cfg = self.cfg
        # recipe=grpo evaluates at the end only, by generation (TRL's GRPO evaluation samples and scores rewards)
        wanted = (cfg.train.eval_at_end or cfg.train.eval_steps > 0) and cfg.recipe.name != "grpo"
        self._expect_before = bool(fresh and wanted and cfg.train.trial_steps <= 0)
        trainer.args.eval_on_start = self._expect_before

    def observe(self, metrics: dict, step: int) -> None:
        """Every Trainer log: each evaluation's numbers by step into the ledger (``quality.evals``: what a sweep's
        rungs decide by); the step-0 evaluation's value is the job's "before"."""
        evals = {k: float(v) for k, v in metrics.items() if k in EVAL_RECORDED and isinstance(v, (int, float))}
        if evals and self.record.writes:
            self.record.record_eval(step, evals)
        if not (self._expect_before and step == 0 and self.metric.name in metrics):
            return
        self._expect_before = False
        value = float(metrics[self.metric.name])
        if self.record.writes:
            print(f"held-out {self.metric.name} before training: {value:.4f}", flush=True)
            self.record.update_quality({self.before_key: value})

    # ---- after training -------------------------------------------------------------
    def after_training(self, trainer, step: int) -> int:
        """Before the final weights are written: the early stop's reason; ``checkpoint.final=best``'s weights.
        Returns the step whose weights the model now holds (``step``, the last, unless the best was loaded)."""
        self.stop_reason = early_stop_reason(trainer, self.cfg, self.select_name)
        if self.stop_reason and self.record.writes:
            print(f"stopped early: {self.stop_reason}; the job ends completed", flush=True)
            self.record.update_quality({"stopped_early": self.stop_reason})
            self.tracking.set_tag("stop_reason", self.stop_reason)
        if self.cfg.checkpoint.final == "best" and self.load_best(trainer):
            return int(trainer.state.best_global_step)
        return step

    def load_best(self, trainer) -> bool:
        """The best evaluation's checkpoint, verified, into the trainer's model (the Trainer's own
        ``_load_best_model``, as ``load_best_model_at_end`` does); the last weights stay when there is none.
        Returns whether the model now holds another step's weights than the last."""
        state = trainer.state
        step = state.best_global_step
        if step is None:
            log.warning(
                "checkpoint.final=best: no evaluation during training chose a best step; final/ holds the last weights"
            )
            return False
        if step == state.global_step:
            if self.record.writes:
                print(
                    f"final weights: the last step {step} is the best evaluation "
                    f"({self.select_name}={state.best_metric:.4f})",
                    flush=True,
                )
            return False
        local = self.checkpoints.fetch_step(step)
        if local is None:
            log.warning(
                "checkpoint.final=best: the checkpoint of the best step %d is not usable; final/ holds the "
                "last weights (step %d)",
                step,
                state.global_step,
            )
            return False
        state.best_model_checkpoint = str(local)
        trainer._load_best_model()
        restore_build_dtypes(trainer)
        if self.record.writes:
            print(
                f"final weights: the best checkpoint (step {step}, {self.select_name}={state.best_metric:.4f}), "
                f"not the last (step {state.global_step})",
                flush=True,
            )
        return True

    # ---- the closing report -------------------------------------------------------------
    def report(self, final_metrics: Optional[dict]) -> dict:
        """``quality_metric``, ``quality`` (after training), ``quality_before`` and whether it is a fraction
        (USD per point needs one), for the cost report."""
        return {
            "quality_metric": self.metric.name,
            "quality": (final_metrics or {}).get(self.metric.name),
            "quality_before": self.record.quality().get(self.before_key),
            "quality_is_fraction": self.metric.fraction,
        }

    def print_final(self, metrics: dict) -> None:
        before = self.record.quality().get(self.before_key)
        after = metrics.get(self.metric.name)
        if after is not None:
            label = "accuracy" if self.metric.name == "eval_accuracy" else self.metric.name
            print(
                f"held-out {label} before training: {'-' if before is None else f'{before:.3f}'}; after: {after:.3f}",
                flush=True,
            )
        print("final metrics: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()), flush=True)


def early_stop_reason(trainer, cfg, metric: str) -> Optional[str]:
    """Why ``EarlyStoppingCallback`` (or the benchmark watch, on a benchmark metric) ended training (None: it did
    not)."""
    from transformers import EarlyStoppingCallback

    bench = next(
        (c.early_stop_reason for c in trainer.callback_handler.callbacks if getattr(c, "early_stop_reason", None)), None
    )
    if bench:
        return bench
    patience = int(cfg.train.early_stopping_patience)
    stopper = next((c for c in trainer.callback_handler.callbacks if isinstance(c, EarlyStoppingCallback)), None)
    if stopper is None or patience <= 0 or stopper.early_stopping_patience_counter < patience:
        return None
    state = trainer.state
    return (
        f"{metric} has not improved on its best ({state.best_metric:.4f}) by more than "
        f"{cfg.train.early_stopping_threshold} for {patience} evaluations; training ended at step "
        f"{state.global_step} of {cfg.train.max_steps}"
    )


def restore_build_dtypes(trainer) -> None:
    """Loading an adapter upcasts it to fp32; put back the dtypes the recipe built (see the callback's own)."""
    from orchestrator.checkpoint.callback import OrchestratorCallback, restore_trainable_dtypes

    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, OrchestratorCallback) and getattr(cb, "_trainable_dtypes", None):
            restore_trainable_dtypes(trainer.model, None, cb._trainable_dtypes)
