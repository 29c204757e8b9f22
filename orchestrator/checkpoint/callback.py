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
from typing import Protocol

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

log = logging.getLogger("orchestrator.checkpoint")


class JobHooks(Protocol):
    """What the callback needs from the job (implemented by the worker)."""

    def stop_reason(self) -> str | None:
        """'preempted' or 'budget' when training must save and stop now, else None."""

    def commit(self, folder: Path, step: int, *, wait: bool) -> None:
        """Take the Trainer's checkpoint folder and commit it (wait=True: before returning)."""

    def on_metrics(self, metrics: dict, step: int) -> None: ...

    def on_step(self, step: int) -> None: ...


class OrchestratorCallback(TrainerCallback):
    def __init__(self, hooks: JobHooks, *, every_seconds: float, every_steps: int = 0, clock=time.monotonic):
        self.hooks = hooks
        self.every_seconds = every_seconds
        self.every_steps = every_steps
        self.clock = clock
        self._last_save = clock()
        self._stop_reason: str | None = None
        self.save_stall_seconds: list[float] = []
        self._save_started = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self._last_save = self.clock()

    def on_step_end(self, args, state, control, **kwargs):
        self.hooks.on_step(state.global_step)
        reason = self.hooks.stop_reason()
        if reason:
            self._stop_reason = reason
            control.should_save = True
            control.should_training_stop = True
            log.warning("%s: saving an emergency checkpoint at step %d, then stopping", reason, state.global_step)
        elif self.every_seconds > 0 and self.clock() - self._last_save >= self.every_seconds:
            control.should_save = True
        elif self.every_steps > 0 and state.global_step % self.every_steps == 0:
            control.should_save = True
        if control.should_save:
            self._save_started = self.clock()
        return control

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if not folder.is_dir():  # e.g. a save on a non-zero rank
            return control
        self.hooks.commit(folder, state.global_step, wait=self._stop_reason is not None)
        now = self.clock()
        self.save_stall_seconds.append(now - self._save_started)
        self._last_save = now
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            self.hooks.on_metrics({k: v for k, v in logs.items() if isinstance(v, (int, float))}, state.global_step)
        return control

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason
