"""The requeue policy: whether, and after how long, a job gets another attempt.

Counted apart, after SkyPilot, by each outcome's requeue class in
``exitcodes.OUTCOMES``: preemptions (PREEMPTED, VANISHED) are charged only
against ``requeue.max_preemptions`` and never count toward a crash loop;
failures (CRASHED, OUT_OF_MEMORY) against ``requeue.max_failures`` and wait an
exponential backoff with full jitter. Out of memory is also charged against
``requeue.max_oom_retries`` (default 0): the same config runs out of memory the
same way, so by default the first one stops the job with the fix. A crash-loop
breaker stops a job whose last ``crash_loop_threshold`` failures all ended no
further than the checkpoint they started from (preemptions in between neither
count nor reset it). Final classes (completed, config error, budget exhausted,
caps reached, fenced) are never requeued.

The same counts guard the start of every attempt (``refuse_reason``), so the
caps hold whoever restarts the job: the supervisor, Slurm, SkyPilot,
Kubernetes, or a person re-running the command.

The policy reads the ledger decoded (``orchestrator.records.ledger_record``): attempts are ``AttemptEntry``
values, the ledger a ``LedgerRecord``, each field typed and bounded before it gets here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from orchestrator.core.errors import (
    AlreadyCompleted,
    BudgetExhausted,
    CapsReached,
    UserError,
    out_of_memory_fix,
)
from orchestrator.core.exitcodes import (
    FAILURE_CLASSES,
    FINAL_CLASSES,
    PREEMPTION_CLASSES,
    RUNNING,
    ExitClass,
)
from orchestrator.records.ledger_record import AttemptEntry, LedgerRecord


@dataclass(frozen=True)
class Decision:
    """What to do after an attempt ended.

    ``delay_seconds`` is how long to wait before the next attempt (0 when not
    requeued); ``log_line`` is the one line to print, "requeue [n/max]: ..."
    or "not requeued: ...".
    """

    requeue: bool
    reason: str
    delay_seconds: float
    log_line: str


def attempt_class(attempt: AttemptEntry) -> Optional[ExitClass]:
    """The ExitClass of a ledger attempt; None for an unknown class.

    An attempt still marked "running" is counted as VANISHED: once a new
    decision is being made, nothing will ever record its end.
    """
    value = attempt.exit_class
    if value == RUNNING:
        return ExitClass.VANISHED
    try:
        return ExitClass(value)
    except ValueError:
        return None


def _made_no_progress(attempt: AttemptEntry) -> bool:
    """True when the attempt ended no further than the checkpoint it started from.

    Progress is the newest checkpoint it committed (``checkpoint_step_end``):
    steps trained past it are lost when the attempt dies, so an attempt that
    crashes before its first checkpoint made none. Attempts recorded without
    that field fall back to ``step_end``; one that never recorded its last
    step (decoded as 0) is taken as having made none.
    """
    end = attempt.checkpoint_step_end if attempt.checkpoint_step_end is not None else attempt.step_end
    return end <= attempt.checkpoint_step_at_start


class RequeuePolicy:
    """Decisions over a run's attempts, with the caps of one ``requeue`` config.

    Args:
        requeue_cfg: the ``requeue`` group (RequeueConfig or DictConfig):
            max_preemptions, max_failures, backoff_base_seconds,
            backoff_max_seconds, crash_loop_threshold.

    Raises:
        ValueError: a negative cap or backoff, or a threshold below 1.
    """

    def __init__(self, requeue_cfg: Any):
        self.max_preemptions = int(requeue_cfg.max_preemptions)
        self.max_failures = int(requeue_cfg.max_failures)
        self.max_oom_retries = int(requeue_cfg.max_oom_retries)
        self.backoff_base_seconds = float(requeue_cfg.backoff_base_seconds)
        self.backoff_max_seconds = float(requeue_cfg.backoff_max_seconds)
        self.crash_loop_threshold = int(requeue_cfg.crash_loop_threshold)
        if min(self.max_preemptions, self.max_failures, self.max_oom_retries) < 0:
            raise ValueError(
                "requeue.max_preemptions, requeue.max_failures and requeue.max_oom_retries must be >= 0 "
                "(0: never requeue)."
            )
        if min(self.backoff_base_seconds, self.backoff_max_seconds) < 0:
            raise ValueError("requeue.backoff_base_seconds and requeue.backoff_max_seconds must be >= 0.")
        if self.crash_loop_threshold < 1:
            raise ValueError(
                "requeue.crash_loop_threshold must be >= 1: it counts consecutive attempts without "
                "progress, and stopping after zero of them would stop every job."
            )

    # -- counting ---------------------------------------------------------

    @staticmethod
    def count(attempts: Sequence[AttemptEntry]) -> tuple[int, int]:
        """(preemptions, failures) among ``attempts``; out-of-memory attempts are failures."""
        classes = [attempt_class(a) for a in attempts]
        return (
            sum(c in PREEMPTION_CLASSES for c in classes),
            sum(c in FAILURE_CLASSES for c in classes),
        )

    @staticmethod
    def count_oom(attempts: Sequence[AttemptEntry]) -> int:
        """Attempts that ran out of memory (host or accelerator)."""
        return sum(attempt_class(a) == ExitClass.OUT_OF_MEMORY for a in attempts)

    def no_progress_streak(self, attempts: Sequence[AttemptEntry]) -> int:
        """How many of the latest failures in a row made no progress.

        Walks back from the newest attempt: a completed attempt or one that made
        progress ends the streak; a failure without progress counts; any other
        attempt without progress (a preemption, a vanished machine, a fenced
        attempt) is passed over: losing capacity while loading is not a crash
        loop, and has its own cap (requeue.max_preemptions).
        """
        streak = 0
        for attempt in reversed(attempts):
            cls = attempt_class(attempt)
            if cls == ExitClass.COMPLETED or not _made_no_progress(attempt):
                break
            if cls in FAILURE_CLASSES:
                streak += 1
        return streak

    def backoff_seconds(self, failures: int, rng: Optional[random.Random] = None) -> float:
        """Full-jitter backoff before retry number ``failures`` (1-based).

        Uniform in [0, min(backoff_max_seconds, backoff_base_seconds * 2**(failures-1))].
        """
        ceiling = min(self.backoff_max_seconds, self.backoff_base_seconds * 2 ** max(0, failures - 1))
        return (rng or random).uniform(0.0, ceiling)

    def _oom_reason(self, attempts: Sequence[AttemptEntry]) -> Optional[str]:
        ooms = self.count_oom(attempts)
        if ooms == 0 or ooms <= self.max_oom_retries:
            return None
        return (
            f"out of memory in {ooms} attempt(s), and requeue.max_oom_retries={self.max_oom_retries} allows "
            f"{self.max_oom_retries} retries: the same config runs out of memory the same way. "
            f"Fix: {out_of_memory_fix()}; "
            f"or raise requeue.max_oom_retries={ooms} if the memory was taken by something else"
        )

    def _crash_loop_reason(self, attempts: Sequence[AttemptEntry]) -> Optional[str]:
        streak = self.no_progress_streak(attempts)
        if streak < self.crash_loop_threshold:
            return None
        step = attempts[-1].checkpoint_step_at_start
        return (
            f"crash loop: the last {streak} attempts made no progress past the checkpoint at step {step} "
            f"(requeue.crash_loop_threshold={self.crash_loop_threshold}); see the last attempt's log"
        )

    # -- decisions --------------------------------------------------------

    def decide(self, attempts: Sequence[AttemptEntry], *, rng: Optional[random.Random] = None) -> Decision:
        """Decide after the last of ``attempts`` ended.

        Args:
            attempts: the ledger's attempts (decoded), oldest first; the last one is the
                attempt that just ended. Earlier ones still "running" count as vanished.
            rng: source of the backoff jitter (``random`` module when None).

        Returns:
            A Decision; ``requeue`` is False for final classes, spent caps, a
            tripped crash-loop breaker or an unknown class.
        """
        if not attempts:
            return Decision(True, "no attempt yet", 0.0, "requeue [0/0]: no attempt yet")
        last = attempts[-1]
        last_class = attempt_class(last)
        if last_class is None:
            return _stop(f"unknown exit class {last.exit_class!r}")
        if last_class in FINAL_CLASSES:
            return _stop(_FINAL_REASONS[last_class])

        crash_loop = self._crash_loop_reason(attempts)
        if crash_loop:
            return _stop(crash_loop)

        preemptions, failures = self.count(attempts)
        if last_class in PREEMPTION_CLASSES:
            if preemptions >= self.max_preemptions:
                return _stop(f"{preemptions} preemptions reached requeue.max_preemptions={self.max_preemptions}")
            reason = f"{last_class.value}; no charge against failures"
            return Decision(True, reason, 0.0, f"requeue [{preemptions}/{self.max_preemptions}]: {reason}")

        # a failure: CRASHED or OUT_OF_MEMORY
        oom = self._oom_reason(attempts)
        if last_class == ExitClass.OUT_OF_MEMORY and oom:
            return _stop(oom)
        if failures >= self.max_failures:
            return _stop(f"{failures} failures reached requeue.max_failures={self.max_failures}")
        delay = self.backoff_seconds(failures, rng)
        reason = f"{last_class.value}; retrying in {delay:.1f}s"
        return Decision(True, reason, delay, f"requeue [{failures}/{self.max_failures}]: {reason}")

    def refuse_reason(self, ledger: LedgerRecord) -> Optional[str]:
        """Why a new attempt must not start, or None when it may.

            Args:
                ledger: the run's ledger, decoded; only its ``attempts`` are read.
                    Call this before recording the new attempt.

        Returns a reason when a cap is already spent or the crash-loop breaker
            has tripped, with what to change to go on anyway. ``start_refusal``
            turns it into CapsReached (exit ``exitcodes.CAPS_REACHED``).
        """
        attempts = list(ledger.attempts)
        preemptions, failures = self.count(attempts)
        if preemptions >= self.max_preemptions and preemptions > 0:
            return (
                f"{preemptions} preemptions already reached requeue.max_preemptions={self.max_preemptions}. "
                f"To go on, raise it (requeue.max_preemptions={preemptions + 10}) or start a new run.name."
            )
        if failures >= self.max_failures and failures > 0:
            return (
                f"{failures} failed attempts already reached requeue.max_failures={self.max_failures}. "
                f"Fix the cause, then raise it (requeue.max_failures={failures + 1}) or start a new run.name."
            )
        oom = self._oom_reason(attempts)
        if oom:
            return f"{oom}; or start a new run.name."
        crash_loop = self._crash_loop_reason(attempts)
        if crash_loop:
            streak = self.no_progress_streak(attempts)
            return (
                f"{crash_loop}. Fix the cause, then relaunch with "
                f"requeue.crash_loop_threshold={streak + 1} or a new run.name."
            )
        return None


_FINAL_REASONS = {
    ExitClass.COMPLETED: "completed",
    ExitClass.BUDGET_EXHAUSTED: "budget exhausted (raise budget.max_usd to go on)",
    ExitClass.CONFIG_ERROR: "config or data error; a retry would fail the same way",
    ExitClass.CAPS_REACHED: "requeue caps already reached",
    ExitClass.FENCED: "fenced: another attempt of this job holds a newer fence",
}


def _stop(reason: str) -> Decision:
    return Decision(False, reason, 0.0, f"not requeued: {reason}")


def start_refusal(
    ledger: LedgerRecord, policy: RequeuePolicy, *, max_usd: Optional[float] = None, final_uri: str = ""
) -> Optional[UserError]:
    """Why a new attempt of the job in ``ledger`` must not start, as the error to raise; None when it may.

    Checked in this order: the job already completed (AlreadyCompleted: exit 0,
    with where its final weights are), a spent requeue cap or a tripped breaker
    (CapsReached), a spent budget (BudgetExhausted). Pass it (partially
    applied) as ``Ledger.begin_attempt``'s ``refuse`` hook.

    Args:
        ledger: the run's ledger as ``begin_attempt`` sees it, decoded.
        policy: the job's requeue caps.
        max_usd: ``budget.max_usd`` (None: no budget).
        final_uri: where the job's final weights are (``<storage.uri>/<run.name>/final/``).
    """
    if ledger.status == "completed":
        where = f"; its final weights are at {final_uri}" if final_uri else ""
        return AlreadyCompleted(
            f"job {ledger.run_name!r} is already complete{where}. Nothing to do; use a new run.name to train again."
        )
    reason = policy.refuse_reason(ledger)
    if reason:
        return CapsReached(reason)
    spent = ledger.attempts_cost_usd
    if max_usd is not None and spent >= max_usd:
        return BudgetExhausted(
            f"budget spent: ${spent:.4f} of budget.max_usd=${max_usd}; "
            "raise budget.max_usd to let the job go on from its last checkpoint"
        )
    return None
