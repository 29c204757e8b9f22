"""``checkpoint.every=auto``: the attempt's checkpoint interval from Young/Daly, re-derived as C is measured.

The decision itself is ``orchestrator.policy.interval`` (pure, shared with the
simulator and the planner); this module feeds it the attempt's inputs and acts:

- C, the cost of one checkpoint to training: the Trainer's save stall (the
  callback measures it) plus what the background upload takes from training
  (steps taken while an upload is in flight, less the same number of steps
  without one). Until this attempt has measured a checkpoint, C is the one an
  earlier attempt measured (in the ledger), else an estimate: the snapshot's
  size over a local write rate.
- M, from the rate of preemptions: the job's own spot attempts in the ledger
  (how long each held its machine; preempted with an honoured notice,
  ``preempted``, or without, ``vanished``) blended with the catalog's prior,
  ``compute.preemptions_per_hour`` overriding both, on on-demand capacity too.

T is derived when training begins, again after the first measured checkpoint
when it began from an estimate, and whenever the running mean of C moves by
more than ``REDERIVE_WHEN_CHANGED`` from the C it was derived with; each
derivation is logged (``checkpoint_interval_s``), written to the attempt's
ledger entry and to MLflow (metrics and the ``checkpoint.interval`` tag).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from transformers import TrainerCallback

from orchestrator.policy.history import measured_cost_seconds, spot_lifetimes
from orchestrator.policy.interval import (
    SNAPSHOT_WRITE_BYTES_PER_SECOND,
    IntervalDecision,
    checkpoint_interval,
    estimate_preemptions,
    estimated_checkpoint_seconds,
)

log = logging.getLogger(__name__)

REDERIVE_WHEN_CHANGED = 0.25  # re-derive T when the measured C moves this much (a share of the C in use)


class CheckpointCost:
    """C as measured in this attempt: mean save stall + the upload's slowdown of training, per checkpoint."""

    def __init__(self) -> None:
        self.stalls: list[float] = []
        self._busy = [0, 0.0]  # steps taken while an upload was in flight, their seconds
        self._idle = [0, 0.0]

    def observe_step(self, seconds: float, uploading: bool) -> None:
        sums = self._busy if uploading else self._idle
        sums[0] += 1
        sums[1] += seconds

    def observe_save(self, stall_seconds: float) -> None:
        self.stalls.append(max(0.0, stall_seconds))

    def upload_seconds_per_checkpoint(self) -> float:
        if not (self.stalls and self._busy[0] and self._idle[0]):
            return 0.0
        slower = self._busy[1] / self._busy[0] - self._idle[1] / self._idle[0]
        return max(0.0, slower) * self._busy[0] / len(self.stalls)

    def seconds(self) -> Optional[float]:
        if not self.stalls:
            return None
        return sum(self.stalls) / len(self.stalls) + self.upload_seconds_per_checkpoint()


class CheckpointSchedule(TrainerCallback):
    """Sets the attempt's ``CheckpointInterval``, which the orchestrator callback reads (main rank; after it in the
    Trainer's callbacks, so each step's time and each save's stall are measured when this reads them).

    ``interval``: the attempt's ``auto`` interval; ``steps``: its ``StepClock``; ``record``: its ledger record
    (earlier attempts in, decisions out); ``tracking``: its MLflow run; ``full_model``: whether a checkpoint holds
    every weight; ``uploading()``: whether a checkpoint's upload is in flight; ``compute``: this attempt's
    ``compute`` config (on-demand: no preemptions expected unless ``compute.preemptions_per_hour`` says);
    ``catalog``: the price catalog (the prior).
    """

    def __init__(
        self,
        *,
        interval: Any,
        steps: Any,
        record: Any,
        tracking: Any,
        full_model: bool,
        uploading: Callable[[], bool],
        compute: Any,
        catalog: dict,
        min_seconds: float,
        max_seconds: float,
    ):
        from orchestrator.money.cost import preemption_prior_per_hour

        self.interval, self.steps, self.record, self.tracking = interval, steps, record, tracking
        self.full_model, self.uploading = full_model, uploading
        # an explicit rate wins on any capacity (a Slurm partition with PreemptMode=REQUEUE preempts jobs priced
        # on-demand); without one, on-demand capacity is not preempted: T is held at checkpoint.max_every
        self.prior_per_hour, self.prior_source = preemption_prior_per_hour(compute, catalog)
        self.override = compute.preemptions_per_hour
        self.min_seconds, self.max_seconds = min_seconds, max_seconds
        self.cost = CheckpointCost()
        self.decision: Optional[IntervalDecision] = None
        self._source = ""  # where the C in use came from: "estimated" | "measured"

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        earlier = measured_cost_seconds(self.record.prior_attempts)
        if earlier is not None:
            self.derive(earlier, "measured", state.global_step, why="measured by an earlier attempt")
        else:
            from orchestrator.checkpoint.snapshot import estimate_snapshot_bytes

            size = estimate_snapshot_bytes(model, full_model=self.full_model) if model else 0
            self.derive(
                estimated_checkpoint_seconds(size),
                "estimated",
                state.global_step,
                why=f"estimated: {size / 1e6:.1f} MB at {SNAPSHOT_WRITE_BYTES_PER_SECOND / 1e6:.0f} MB/s",
            )

    def on_step_end(self, args, state, control, **kwargs):
        seconds = self.steps.last_step_seconds  # the step clock's (the first step and saves left out)
        if seconds is not None:
            self.cost.observe_step(seconds, self.uploading())

    def on_save(self, args, state, control, **kwargs):
        stalls = self.steps.save_stall_seconds
        if stalls:
            self.cost.observe_save(stalls[-1])
        measured = self.cost.seconds()
        used = self.decision.checkpoint_cost_seconds if self.decision else None
        first = len(self.cost.stalls) == 1 and self._source != "measured"  # the estimate gives way at once
        if measured is not None and (first or not used or abs(measured - used) > REDERIVE_WHEN_CHANGED * used):
            self.derive(
                measured,
                "measured",
                state.global_step,
                why=f"measured over {len(self.cost.stalls)} checkpoint(s) of this attempt",
            )

    def derive(self, cost_seconds: float, source: str, step: int, *, why: str) -> IntervalDecision:
        seen = list(spot_lifetimes(self.record.prior_attempts)) if self.prior_source != "on-demand" else []
        estimate = estimate_preemptions(seen, self.prior_per_hour, override_per_hour=self.override)
        self._source = source
        # the same decision as the simulator's and the planner's: over the job's own lifetimes where it has
        # some (real lifetimes are far from exponential), Young/Daly at the rate when the rate is given
        self.decision = decision = checkpoint_interval(
            cost_seconds,
            estimate,
            min_seconds=self.min_seconds,
            max_seconds=self.max_seconds,
            lifetimes=None if self.override is not None else seen,
        )
        self.interval.set(decision.seconds)
        prior = "compute.preemptions_per_hour" if self.override is not None else self.prior_source
        text = f"{decision.explain()}; C {why}; prior from {prior}"
        log.info("checkpoint_interval_s=%.0f: %s", decision.seconds, text)
        finite = decision.mean_seconds_between_losses != float("inf")
        self.record.note(
            checkpoint_interval=dict(
                checkpoint_interval_s=decision.seconds,
                checkpoint_cost_s=cost_seconds,
                cost_source=source,
                mean_s_between_losses=decision.mean_seconds_between_losses if finite else None,
                preemptions_per_hour=estimate.per_hour,
                notice_share=estimate.notice_share,
                bound=decision.bound,
                explanation=text,
                step=step,
            )
        )
        metrics = {
            "checkpoint_interval_s": decision.seconds,
            "checkpoint_cost_s": cost_seconds,
            "preemptions_per_hour": estimate.per_hour,
            "preemption_notice_share": estimate.notice_share,
        }
        if finite:
            metrics["mean_s_between_lossy_preemptions"] = decision.mean_seconds_between_losses
        self.tracking.log_metrics(metrics, step)
        self.tracking.set_tag("checkpoint.interval", text)
        return decision
