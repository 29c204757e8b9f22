"""The Trainer callback through which the orchestrator steers a recipe.

It decides *when* the Trainer saves (wall-clock interval, every N steps, a
preemption notice, an exhausted budget) and hands the folder the Trainer wrote
to the job, which commits it to object storage. Saving itself stays the
Trainer's: model or adapter, optimizer, scheduler, scaler, RNG per rank and the
trainer state (step, epoch) that positions the sampler on resume.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from orchestrator.core import ranks as distributed

if TYPE_CHECKING:  # the ports are handed in (orchestrator.attempt.ports): nothing here imports the attempt
    from orchestrator.attempt.ports import CheckpointInterval, StepClock

log = logging.getLogger(__name__)


class JobHooks(Protocol):
    """What the callback needs from the job (implemented by the worker)."""

    def stop_reason(self) -> str | None:
        """'preempted' or 'budget' when training must save and stop now, else None."""

    def commit(self, folder: Path, step: int, *, wait: bool) -> None:
        """Take the Trainer's checkpoint folder and commit it (wait=True: before returning)."""

    def on_metrics(self, metrics: dict, step: int) -> None: ...

    def on_step(self, step: int) -> None: ...


def restore_trainable_dtypes(model, optimizer, dtypes: dict) -> int:
    """Put trainable parameters (and their optimizer state) back in the dtype the recipe built them in.

    On resume the Trainer reloads a PEFT adapter with ``load_adapter``, which
    upcasts LoRA weights to fp32; TRL builds QLoRA adapters in bf16. Training on
    from fp32 would part from the uninterrupted run. The checkpoint holds the
    bf16 values, so casting back is exact. Returns how many parameters were cast.
    """
    import torch

    cast = 0
    for name, param in model.named_parameters():
        want = dtypes.get(name)
        if want is None or param.dtype == want:
            continue
        param.data = param.data.to(want)
        if optimizer is not None:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if torch.is_tensor(value) and value.is_floating_point() and key != "step":
                    state[key] = value.to(want)
        cast += 1
    if cast:
        log.info("restored the build dtype of %d trainable parameters after loading the checkpoint", cast)
    return cast


def skip_zip_crc32():
    """Have ``torch.save`` skip the zip CRC-32 of each record during the Trainer's save; returns the old setting.

    Every checkpoint file gets a SHA-256 in the manifest, verified before
    anything is loaded, so the CRC is a second, weaker check that costs the
    training loop ~0.1 s per 200 MB. ``torch.load`` reads such files as usual.
    """
    try:
        from torch.utils.serialization import config
    except ImportError:  # older torch: nothing to switch
        return None
    was = config.save.compute_crc32
    config.save.compute_crc32 = False
    return was


def restore_zip_crc32(was) -> None:
    if was is None:
        return
    from torch.utils.serialization import config

    config.save.compute_crc32 = was


def is_new_best(args, state, metrics: dict) -> bool:
    """Whether ``metrics`` beat the best ``metric_for_best_model`` so far, as the Trainer's
    ``_determine_best_metric`` (which runs after the callbacks) will decide."""
    name = args.metric_for_best_model
    if not name:
        return False
    value = metrics.get(name if name.startswith("eval_") else f"eval_{name}")
    if value is None:
        return False
    best = state.best_metric
    return best is None or (value > best if args.greater_is_better else value < best)


class OrchestratorCallback(TrainerCallback):
    """``interval``: the timed saves' ``CheckpointInterval`` (read at every step: the checkpoint schedule may set
    it); ``steps``: the attempt's ``StepClock``, which this callback feeds (``orchestrator.attempt.ports``)."""

    def __init__(
        self,
        hooks: JobHooks,
        *,
        interval: "CheckpointInterval",
        steps: "StepClock",
        every_steps: int = 0,
        stop_after_steps: int = 0,
        save_best: bool = False,
        clock=time.monotonic,
    ):
        self.hooks = hooks
        self.save_best = save_best  # checkpoint.final=best: a checkpoint at each new best evaluation
        self.stop_after_steps = stop_after_steps
        self._steps_this_attempt = 0
        self.interval = interval
        self.steps = steps
        self.every_steps = every_steps
        self.clock = clock
        self._last_save = clock()
        self._stop_reason: str | None = None
        self._training = False
        self._save_started = 0.0

    def on_init_end(self, args, state, control, model=None, **kwargs):
        # dtypes of the trainable parameters as the recipe built them (TRL keeps QLoRA adapters in bf16)
        if model is not None:
            self._trainable_dtypes = {n: p.dtype for n, p in model.named_parameters() if p.requires_grad}

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._training = True
        self._last_save = self.clock()
        if model is not None and getattr(self, "_trainable_dtypes", None):
            restore_trainable_dtypes(model, optimizer, self._trainable_dtypes)

    def on_step_begin(self, args, state, control, **kwargs):
        self.steps.step_began()

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.step_ended()
        self._steps_this_attempt += 1
        self.hooks.on_step(state.global_step)
        self.steps.resume()
        if self.stop_after_steps and self._steps_this_attempt >= self.stop_after_steps:
            control.should_training_stop = True
            return control
        # rank 0 decides; every rank must save (DeepSpeed's save is collective) and stop at the same step
        decision = self._decide(state.global_step) if distributed.is_main() else None
        save, reason = distributed.broadcast(decision)
        if reason:
            self._stop_reason = reason
            control.should_save = True
            control.should_training_stop = True
            log.warning("%s: saving an emergency checkpoint at step %d, then stopping", reason, state.global_step)
        elif save:
            control.should_save = True
        if control.should_save:
            self._begin_save()
        return control

    def _begin_save(self) -> None:
        self._save_started = self.clock()
        self._crc32_was = skip_zip_crc32()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        """checkpoint.final=best: a new best evaluation during training is saved (retention keeps it) and
        its step recorded in the trainer state (``best_global_step``, which the Trainer sets only with
        its own save strategies), so a resumed attempt knows it too."""
        if not (self.save_best and self._training and metrics and state.global_step > 0):
            return control
        if not is_new_best(args, state, metrics):
            return control
        state.best_global_step = state.global_step
        if not control.should_save:
            control.should_save = True
            self._begin_save()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self._training = False  # the end-of-training evaluation is no candidate

    def _decide(self, step: int) -> tuple[bool, str | None]:
        reason = self.hooks.stop_reason()
        if reason:
            return True, reason
        every = self.interval.seconds
        if every is not None and self.clock() - self._last_save >= every:
            return True, None
        return bool(self.every_steps > 0 and step % self.every_steps == 0), None

    def on_save(self, args, state, control, **kwargs):
        restore_zip_crc32(getattr(self, "_crc32_was", None))
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        self.hooks.commit(folder, state.global_step, wait=self._stop_reason is not None)
        now = self.clock()
        self.steps.saved(now - self._save_started)
        log.info("checkpoint save at step %d stalled training for %.2fs", state.global_step, now - self._save_started)
        self._last_save = now
        self.steps.resume()  # the save's stall is not the data loader's
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            self.hooks.on_metrics({k: v for k, v in logs.items() if isinstance(v, (int, float))}, state.global_step)
        self.steps.resume()
        return control

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason
