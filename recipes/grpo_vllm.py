"""GRPO with vLLM after a resume: the rollouts must come from the restored policy, never from stale weights.

What TRL 1.16 does itself: ``GRPOTrainer._last_loaded_step`` starts at -1 in every new trainer and
each generation first calls ``vllm_generation.sync_weights()`` when ``state.global_step`` differs
from it, so the first rollout after a resume follows a push of the (restored) policy, in colocate
and server mode alike. What it lacks: any check that the generation side holds the weights of the
step it is about to sample for. TRL's ``VLLMClient`` reads no weight version back from the server
(``get_server_info`` is its configuration), so the version is kept here, on the trainer's side: the
step of the last push that returned. Before every rollout the version must equal the current step
and, after a resume, be at least the checkpoint's step; a rollout that would be sampled from other
weights (a push that failed half-way and was swallowed, a generation path that skips the push) is
refused with an error instead of being trained on. Not run on a GPU here (no CUDA in this project's CI).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

log = logging.getLogger(__name__)


class StaleGenerationWeights(RuntimeError):
    """The generation server's weights are not the policy's of the step being sampled for."""


def check_weight_version(pushed_step: Optional[int], step: int, resumed_step: Optional[int]) -> None:
    """Raise unless the weights pushed to vLLM are those of ``step`` (and not older than the checkpoint resumed)."""
    if pushed_step is None:
        raise StaleGenerationWeights(
            f"no weights were pushed to vLLM in this attempt before the rollout at step {step}"
            "; it would sample from the server's initial weights"
        )
    if resumed_step is not None and pushed_step < resumed_step:
        raise StaleGenerationWeights(
            f"vLLM holds the weights of step {pushed_step}, older than the checkpoint resumed (step {resumed_step})"
        )
    if pushed_step != step:
        raise StaleGenerationWeights(f"vLLM holds the weights of step {pushed_step}, the rollout is for step {step}")


class WeightVersion:
    """Wraps a trainer's ``vllm_generation``: records each push's step, checks it before each generation."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.pushed_step: Optional[int] = None
        self.resumed_step: Optional[int] = None
        generation = trainer.vllm_generation
        self._push, self._generate = generation.sync_weights, generation.generate
        generation.sync_weights, generation.generate = self.sync_weights, self.generate

    def resumed(self, step: int) -> None:
        """The checkpoint's step: the server must get a push of at least this step before its first rollout."""
        self.resumed_step, self.pushed_step = int(step), None

    def sync_weights(self, *args, **kwargs):
        self.pushed_step = None  # a push that raises leaves no version: the next rollout is refused
        out = self._push(*args, **kwargs)
        self.pushed_step = int(self.trainer.state.global_step)
        return out

    def generate(self, *args, **kwargs):
        check_weight_version(self.pushed_step, int(self.trainer.state.global_step), self.resumed_step)
        if self.resumed_step is not None:
            log.info(
                "vLLM holds the policy of step %d (pushed after resuming from step %d)",
                self.pushed_step,
                self.resumed_step,
            )
            self.resumed_step = None
        return self._generate(*args, **kwargs)
