"""Exit codes of a training attempt, and the class each one means.

External engines key on these: Slurm requeues, SkyPilot's
``recover_on_exit_codes``, Kubernetes' ``podFailurePolicy``.
"""
from __future__ import annotations

import enum

COMPLETED = 0
BUDGET_EXHAUSTED = 3
CONFIG_ERROR = 4  # config or data error: never retried
CAPS_REACHED = 5  # the ledger's requeue caps are spent: never retried
FENCED = 6  # another attempt holds a newer epoch: this one stepped aside
OUT_OF_MEMORY = 7
PREEMPTED = 75  # EX_TEMPFAIL: an emergency checkpoint was committed; requeue


class ExitClass(str, enum.Enum):
    """How an attempt ended.

    COMPLETED, BUDGET_EXHAUSTED, CONFIG_ERROR, CAPS_REACHED and FENCED are final;
    PREEMPTED and VANISHED are requeued without charge against the failure cap
    (only against ``requeue.max_preemptions``); CRASHED and OUT_OF_MEMORY count
    against ``requeue.max_failures``.
    """

    COMPLETED = "completed"
    PREEMPTED = "preempted"
    VANISHED = "vanished"  # no exit was recorded: the machine or process group disappeared (SIGKILL)
    CRASHED = "crashed"
    OUT_OF_MEMORY = "out_of_memory"
    BUDGET_EXHAUSTED = "budget_exhausted"
    CONFIG_ERROR = "config_error"
    CAPS_REACHED = "caps_reached"
    FENCED = "fenced"


_BY_CODE = {
    COMPLETED: ExitClass.COMPLETED,
    PREEMPTED: ExitClass.PREEMPTED,
    BUDGET_EXHAUSTED: ExitClass.BUDGET_EXHAUSTED,
    CONFIG_ERROR: ExitClass.CONFIG_ERROR,
    CAPS_REACHED: ExitClass.CAPS_REACHED,
    FENCED: ExitClass.FENCED,
    OUT_OF_MEMORY: ExitClass.OUT_OF_MEMORY,
}


def classify_exit(returncode: int) -> ExitClass:
    """Map a child's return code (negative: killed by that signal) to its class.

    A worker killed by SIGTERM/SIGINT/SIGUSR1 before it could checkpoint, or by
    SIGKILL, is counted as VANISHED (an interruption from outside), not a crash.
    """
    import signal

    if returncode in _BY_CODE:
        return _BY_CODE[returncode]
    if returncode < 0 and -returncode in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        return ExitClass.VANISHED
    if returncode in (128 + signal.SIGKILL, 128 + signal.SIGTERM):
        return ExitClass.VANISHED
    return ExitClass.CRASHED


FINAL_CLASSES = frozenset(
    {ExitClass.COMPLETED, ExitClass.BUDGET_EXHAUSTED, ExitClass.CONFIG_ERROR, ExitClass.CAPS_REACHED, ExitClass.FENCED}
)

# Attempts ended from outside (a notice honoured, or the machine gone): requeued against
# requeue.max_preemptions, counted as preemptions in the cost figures. The ledger stores the values.
INTERRUPTED = frozenset({ExitClass.PREEMPTED, ExitClass.VANISHED})
INTERRUPTED_CLASSES = frozenset(c.value for c in INTERRUPTED)
