"""Errors a user can cause.

Each UserError carries the ExitClass it means (and through ``exitcodes.OUTCOMES``
its exit code). They are printed as one clear paragraph, with no traceback;
bugs keep theirs. What any exception that ends an attempt means is
``orchestrator.attempt.failure.classify_exception``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, cast

from orchestrator.core import exitcodes
from orchestrator.core.exitcodes import ExitClass


class UserError(Exception):
    """A problem the user can fix; ``str(err)`` names it and says how."""

    exit_class = ExitClass.CONFIG_ERROR

    @property
    def exit_code(self) -> int:
        return cast(int, exitcodes.outcome(self.exit_class).exit_code)  # every UserError class has one


class ConfigError(UserError):
    """A bad key, type, choice or value in the composed config."""


class DataError(UserError):
    """A missing file or a dataset without the recipe's columns."""


class CapsReached(UserError):
    exit_class = ExitClass.CAPS_REACHED


class BudgetExhausted(UserError):
    exit_class = ExitClass.BUDGET_EXHAUSTED


class Fenced(UserError):
    """Another attempt of the same job took a newer fence."""

    exit_class = ExitClass.FENCED


class AlreadyCompleted(UserError):
    """The job completed earlier: nothing to do, which is a success (exit 0)."""

    exit_class = ExitClass.COMPLETED


def out_of_memory_fix(cfg: Any = None, bigger: Optional[Sequence[str]] = None) -> str:
    """The fix for an out-of-memory stop: smaller batch, gradient checkpointing, a bigger GPU.

    ``bigger``: the catalog's GPUs with more memory (``orchestrator.money.cost.bigger_gpus``), when known."""
    if cfg is None:
        return (
            "lower train.per_device_batch_size (raise train.gradient_accumulation_steps to keep the effective "
            "batch), set train.gradient_checkpointing=true, or pick a GPU with more memory "
            "(`orchestrator plan` lists the ones that fit)"
        )
    batch = int(cfg.train.per_device_batch_size)
    accumulation = int(cfg.train.gradient_accumulation_steps)
    steps = [
        f"lower train.per_device_batch_size={max(1, batch // 2)} with "
        f"train.gradient_accumulation_steps={accumulation * 2} (same effective batch)"
    ]
    if not cfg.train.gradient_checkpointing:
        steps.append("set train.gradient_checkpointing=true")
    steps.append(
        f"pick a GPU with more memory ({', '.join(bigger)}; `orchestrator plan` with your overrides shows which fit)"
        if bigger
        else "shard the model (distributed=zero3) or run `orchestrator plan` for a GPU that fits"
    )
    return ", ".join(steps[:-1]) + ", or " + steps[-1]
