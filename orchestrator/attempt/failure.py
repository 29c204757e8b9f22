"""What an exception that ended an attempt means: its ExitClass, the message to print, whether to record it.

``classify_exception`` is what the worker calls on any exception: besides the user's errors (which carry their
class, ``orchestrator.core.errors``) it recognises a storage outage (requeued like a preemption), the config
errors only the trainer sees (transformers' and PEFT's own exceptions), a lost peer of a multi-node world and
out-of-memory errors; anything else is a bug, printed with its traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from orchestrator.core import exitcodes
from orchestrator.core.errors import UserError, out_of_memory_fix
from orchestrator.core.exitcodes import ExitClass
from orchestrator.money.cost import bigger_gpus
from orchestrator.storage.base import TransientStorageError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Classified:
    """What an exception means for the attempt.

    ``message``: the paragraph to print (for a bug: a one-line summary; the
    traceback goes to the log). ``bug``: log with the traceback. ``record``:
    the attempt's end may be written to the ledger (a fenced attempt may not).
    """

    exit_class: ExitClass
    message: str
    bug: bool = False

    @property
    def exit_code(self) -> int:
        code = exitcodes.outcome(self.exit_class).exit_code
        return code if code is not None else exitcodes.LOST_NODE  # vanished: what a killed process exits with

    @property
    def record(self) -> bool:
        # a rank that lost its world leaves the attempt to whoever restarts the world (it is vanished, not ended)
        return self.exit_class != ExitClass.VANISHED and exitcodes.outcome(self.exit_class).ledger_status is not None


def lost_peer(err: BaseException) -> Optional[BaseException]:
    """The collective library's error in ``err``'s chain when another node of a multi-node world is gone
    (torch's ``DistError`` family, or gloo's transport error), else None; always None on one node."""
    if int(os.environ.get("ORCH_NNODES", "1") or 1) <= 1:
        return None
    dist = sys.modules.get("torch.distributed")
    dist_error = getattr(dist, "DistError", None)
    for e in _chain(err):
        if (dist_error is not None and isinstance(e, dist_error)) or (
            isinstance(e, RuntimeError) and "gloo/transport" in str(e)
        ):
            return e
    return None


# Config errors that only the trainer sees, recognised by the library that raises them:
# (module prefix where the exception is raised, exception type name, the config key, the fix).
# transformers: SchedulerType(name) -> ExplicitEnum._missing_ raises ValueError("X is not a valid SchedulerType, ...");
# TrainingArguments refuses reduce_lr_on_plateau without an eval strategy; get_scheduler and the schedule
# functions raise ValueError/TypeError for schedulers that need lr_scheduler_kwargs this project does not pass.
# PEFT: NoMatchingPeftModuleError (a ValueError) when target_modules match nothing, ValueError
# "Target module ... is not supported" for a module type LoRA cannot wrap.
_SCHEDULER_FIX = (
    "train.lr_scheduler",
    "choose a transformers scheduler that needs no extra arguments: "
    "linear, cosine, cosine_with_restarts, polynomial, constant, constant_with_warmup, inverse_sqrt",
)
_TARGETS_FIX = (
    "recipe.lora_target_modules",
    "name modules the model has (print(model) lists them; for Llama and "
    "Qwen: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj), as a list: "
    "recipe.lora_target_modules=[q_proj,v_proj]",
)

# Jinja's sandbox (transformers renders chat templates in it) refusing an expression of data.chat_template that
# only some rows reach (the launch check renders a sample conversation): a retry renders the same rows.
_TEMPLATE_FIX = (
    "data.chat_template",
    "remove the expression Jinja's sandbox refused from the chat template (a "
    "template may only read the messages and format them), or drop data.chat_template for the "
    "tokenizer's own",
)


def _trainer_config_error(err: BaseException) -> Optional[tuple[str, str]]:
    """(key, fix) when ``err`` is one of the trainer-side config errors above, else None."""
    text = str(err)
    module = _raising_module(err)
    if module.startswith("peft.") and type(err).__name__ == "NoMatchingPeftModuleError":
        return _TARGETS_FIX
    if module.startswith("jinja2.") and type(err).__name__ == "SecurityError":
        return _TEMPLATE_FIX
    if isinstance(err, ValueError) and module.startswith("peft.") and text.startswith("Target module "):
        return _TARGETS_FIX
    if isinstance(err, ValueError) and module.startswith("transformers.") and "is not a valid SchedulerType" in text:
        return _SCHEDULER_FIX
    if isinstance(err, ValueError) and module.startswith("transformers.") and text.startswith("lr_scheduler_type "):
        return _SCHEDULER_FIX
    if isinstance(err, (ValueError, TypeError)) and module == "transformers.optimization":
        return _SCHEDULER_FIX
    return None


def _raising_module(err: BaseException) -> str:
    """The ``__name__`` of the module whose code raised ``err`` (its traceback's innermost frame; '' without one)."""
    tb = err.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", ""))


def _chain(err: Optional[BaseException]) -> Iterator[BaseException]:
    """``err`` and the exceptions it was raised from or during (a wrapped OOM is still an OOM)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def is_out_of_memory(err: BaseException) -> bool:
    """True for host (MemoryError) and accelerator out-of-memory errors, as accelerate recognises them."""
    for e in _chain(err):
        if isinstance(e, MemoryError):
            return True
        try:
            import torch

            if isinstance(e, torch.OutOfMemoryError):
                return True
        except ImportError:  # pragma: no cover - torch is a dependency
            pass
        try:
            from accelerate.utils.memory import should_reduce_batch_size

            if isinstance(e, Exception) and should_reduce_batch_size(e):
                return True
        except ImportError:  # pragma: no cover - accelerate is a dependency
            pass
    return False


def classify_exception(err: BaseException, cfg: Any = None) -> Classified:
    """What ``err``, which ended an attempt, means: its ExitClass and the message to print.

    Args:
        err: the exception that escaped the attempt.
        cfg: the job's config, when it was composed; makes the out-of-memory fix concrete.

    UserErrors keep their own class. Config errors that only the trainer sees
    (an unknown ``train.lr_scheduler``, LoRA target modules the model lacks)
    become CONFIG_ERROR with the key and the fix; out-of-memory errors
    OUT_OF_MEMORY with the fix; anything else is a CRASHED bug.
    """
    if isinstance(err, UserError):
        return Classified(err.exit_class, str(err))
    outage = next((e for e in _chain(err) if isinstance(e, TransientStorageError)), None)
    if outage is not None:  # like a preemption: requeued, never counted toward the crash-loop breaker
        return Classified(
            ExitClass.PREEMPTED,
            f"storage outage: {outage}. The attempt stops as preempted (exit 75) "
            "and is requeued; its next attempt settles the ledger and the spend "
            "index and resumes from the newest committed checkpoint",
        )
    for e in _chain(err):
        found = _trainer_config_error(e)
        if found:
            key, fix = found
            return Classified(
                ExitClass.CONFIG_ERROR,
                f"{key}: the trainer refused it ({type(e).__name__}: {e}). "
                f"Fix: {fix}. A retry would fail the same way.",
            )
    lost = lost_peer(err)
    if lost is not None:  # restart-the-world: requeued as the node's loss, never counted as this code's crash
        return Classified(
            ExitClass.VANISHED,
            f"another node of the world is gone ({type(lost).__name__}: "
            f"{str(lost)[:200]}); this rank stops and the world restarts",
        )
    if is_out_of_memory(err):
        kind = "host memory (RAM)" if any(isinstance(e, MemoryError) for e in _chain(err)) else "accelerator memory"
        return Classified(
            ExitClass.OUT_OF_MEMORY,
            f"out of {kind}: {type(err).__name__}: {str(err)[:300]}. The same config runs out the "
            f"same way, so it is not retried unless requeue.max_oom_retries allows it. "
            f"Fix: {out_of_memory_fix(cfg, bigger_gpus(cfg) if cfg is not None else None)}.",
            bug=True,
        )
    return Classified(ExitClass.CRASHED, f"attempt crashed: {type(err).__name__}: {err}", bug=True)


def end_attempt_on_error(err: BaseException, job: Any = None) -> int:
    """What the worker does with an exception that ended its attempt; returns the exit code.

    Classifies ``err`` (``classify_exception``); prints a user's error as one
    paragraph ("error: ...", on stderr), an already-completed job's message on
    stdout, a bug or an out-of-memory error with its traceback; records the
    attempt's end in the ledger when the attempt had begun and may still write
    (``job.fail``: not when fenced).

    Args:
        err: the exception.
        job: the attempt (``orchestrator.attempt.runner.Runner``), or None when it was never built.
    """
    result = classify_exception(err, getattr(job, "cfg", None))
    if result.bug:
        log.error("%s", result.message, exc_info=err)
    elif result.exit_class == ExitClass.COMPLETED:
        print(result.message, flush=True)
    else:
        print(f"error: {result.message}", file=sys.stderr, flush=True)
    began = job is not None and job.began
    if began and result.record and result.exit_class != ExitClass.COMPLETED:
        job.fail(result.exit_class)
    return result.exit_code
