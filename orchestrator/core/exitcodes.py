"""How an attempt ended: one table from each outcome to its exit code, ledger status, MLflow status and requeue class.

External engines key on the exit codes: Slurm requeues, SkyPilot's
``recover_on_exit_codes``, Kubernetes' ``podFailurePolicy``. Everything else
that names an outcome (the worker closing its attempt, the supervisor, the
requeue policy, the ledger, ``orchestrator status``) reads ``OUTCOMES`` instead
of spelling it again. After SkyPilot's ``ManagedJobStatus``: one enum, each
member with one meaning, and the transitions in one place.
"""

from __future__ import annotations

import atexit
import enum
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Optional

COMPLETED = 0
CRASHED = 1  # any other non-zero code also means crashed
BUDGET_EXHAUSTED = 3
CONFIG_ERROR = 4  # config or data error: never retried
CAPS_REACHED = 5  # the ledger's requeue caps are spent: never retried
FENCED = 6  # another attempt holds a newer fence: this one stepped aside
OUT_OF_MEMORY = 7
PREEMPTED = 75  # EX_TEMPFAIL: an emergency checkpoint was committed; requeue
LOST_NODE = 128 + signal.SIGKILL  # a multi-node world broke: what a killed process exits with (vanished)
# the tools' own codes (``orchestrator <command>``, docs/cli.md), beside a job's
USAGE_ERROR = 2  # argparse's own code for a bad command line; the commands use it for every user error
FAILED = 1  # the command ran; its answer is a failure (``checkpoints --verify`` found a bad checkpoint)


class ExitClass(str, enum.Enum):
    """How an attempt ended (the ledger's ``exit_class``; "running" while it lives).

    COMPLETED, BUDGET_EXHAUSTED, CONFIG_ERROR, CAPS_REACHED and FENCED are final;
    PREEMPTED and VANISHED are requeued without charge against the failure cap
    (only against ``requeue.max_preemptions``); CRASHED and OUT_OF_MEMORY count
    against ``requeue.max_failures``, and OUT_OF_MEMORY also against
    ``requeue.max_oom_retries`` (default 0: the same config runs out again).
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


class RequeueClass(str, enum.Enum):
    """What an outcome means to the requeue policy (``orchestrator.policy.requeue``)."""

    FINAL = "final"  # never requeued
    PREEMPTION = (
        "preemption"  # requeued at once; charged to requeue.max_preemptions; never trips the crash-loop breaker
    )
    FAILURE = "failure"  # requeued after a backoff; charged to requeue.max_failures; counts toward a crash loop
    OUT_OF_MEMORY = "out_of_memory"  # a failure that is also charged to requeue.max_oom_retries


@dataclass(frozen=True)
class Outcome:
    """One row of the table.

    ``exit_code``: what the worker exits with (None: nobody exits, the process was
    killed). ``ledger_status``: the job's status in the ledger once this attempt
    ended (None: the attempt may not write, its job belongs to whoever fenced it).
    ``mlflow_status``: how the attempt closes the job's MLflow run (None: it
    cannot or must not close it). ``requeue``: the policy's class.
    """

    exit_class: ExitClass
    exit_code: Optional[int]
    ledger_status: Optional[str]
    mlflow_status: Optional[str]
    requeue: RequeueClass

    @property
    def final(self) -> bool:
        return self.requeue is RequeueClass.FINAL

    @property
    def failure(self) -> bool:
        return self.requeue in (RequeueClass.FAILURE, RequeueClass.OUT_OF_MEMORY)

    @property
    def preemption(self) -> bool:
        return self.requeue is RequeueClass.PREEMPTION


_R = RequeueClass
OUTCOMES: dict[ExitClass, Outcome] = {
    o.exit_class: o
    for o in (
        Outcome(ExitClass.COMPLETED, COMPLETED, "completed", "FINISHED", _R.FINAL),
        Outcome(ExitClass.PREEMPTED, PREEMPTED, "preempted", "KILLED", _R.PREEMPTION),
        Outcome(ExitClass.VANISHED, None, "preempted", None, _R.PREEMPTION),
        Outcome(ExitClass.CRASHED, CRASHED, "failed", "FAILED", _R.FAILURE),
        Outcome(ExitClass.OUT_OF_MEMORY, OUT_OF_MEMORY, "failed", "FAILED", _R.OUT_OF_MEMORY),
        Outcome(ExitClass.BUDGET_EXHAUSTED, BUDGET_EXHAUSTED, "budget_exhausted", "KILLED", _R.FINAL),
        Outcome(ExitClass.CONFIG_ERROR, CONFIG_ERROR, "config_error", "FAILED", _R.FINAL),
        Outcome(ExitClass.CAPS_REACHED, CAPS_REACHED, "caps_reached", None, _R.FINAL),
        Outcome(ExitClass.FENCED, FENCED, None, None, _R.FINAL),
    )
}

RUNNING = "running"  # an attempt's exit_class, and the job's status, while an attempt lives
RUN_STATUSES = (RUNNING, *dict.fromkeys(o.ledger_status for o in OUTCOMES.values() if o.ledger_status))
# Statuses a refused start leaves alone: the job already ended for a reason worth keeping.
FINAL_RUN_STATUSES = frozenset(o.ledger_status for o in OUTCOMES.values() if o.final and o.ledger_status)
FINAL_CLASSES = frozenset(c for c, o in OUTCOMES.items() if o.final)
PREEMPTION_CLASSES = frozenset(c for c, o in OUTCOMES.items() if o.preemption)
FAILURE_CLASSES = frozenset(c for c, o in OUTCOMES.items() if o.failure)
_BY_CODE = {o.exit_code: c for c, o in OUTCOMES.items() if o.exit_code is not None}


def outcome(exit_class: ExitClass | str) -> Outcome:
    """The table's row for ``exit_class`` (an ExitClass or its value). Raises ValueError for an unknown one."""
    return OUTCOMES[ExitClass(exit_class)]


def final_codes() -> list[int]:
    """Exit codes after which no engine may start another attempt, ascending."""
    return sorted(o.exit_code for o in OUTCOMES.values() if o.final and o.exit_code is not None)


# The signals that ask an attempt to save and stop (a scheduler's or a person's preemption): the
# worker turns them into its preemption flag, the supervisor and the ranks' launcher forward them.
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def classify_exit(returncode: int) -> ExitClass:
    """Map a child's return code (negative: killed by that signal) to its class.

    A worker killed by SIGTERM/SIGINT/SIGUSR1 before it could checkpoint, or by
    SIGKILL, is counted as VANISHED (an interruption from outside), not a crash;
    the supervisor tells a kernel OOM kill apart by the cgroup's counter
    (``orchestrator.process.supervisor``), which a return code cannot show.
    """
    if returncode in _BY_CODE:
        return _BY_CODE[returncode]
    if returncode < 0 and -returncode in (signal.SIGKILL, *PREEMPTION_SIGNALS):
        return ExitClass.VANISHED
    if returncode in (128 + signal.SIGKILL, 128 + signal.SIGTERM):
        return ExitClass.VANISHED
    return ExitClass.CRASHED


# the ledger stores the values: the interrupted classes as they are spelled there
INTERRUPTED_CLASSES = frozenset(c.value for c in PREEMPTION_CLASSES)


def exit_without_teardown(code: int) -> None:
    """End the process as ``sys.exit`` would, without the interpreter's teardown of torch, transformers and
    the rest (about 1.5 s of freeing modules at the end of every attempt on an idle core, far more on a loaded
    one, while the supervisor and the next attempt wait; the same at a launcher's end once its supervisor imported the
    stack to fork attempts). What a normal exit does first is done here in the
    same order (``shut_down_as_at_exit``); then ``os._exit``."""
    shut_down_as_at_exit()
    os._exit(code)


def shut_down_as_at_exit() -> None:
    """What an interpreter's exit does before its teardown: threading's exit hooks (they tell
    ``concurrent.futures`` pools to stop, so joining their workers cannot hang), non-daemon threads joined,
    ``atexit`` handlers run (MLflow's, logging's flush), streams flushed."""
    for hook in reversed(list(getattr(threading, "_threading_atexits", []))):
        hook()
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(30)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
            pass
