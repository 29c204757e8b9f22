"""The requeue policy: whether, and after how long, a job gets another attempt.

Counted apart, after SkyPilot: preemptions (PREEMPTED, VANISHED) are charged
only against ``requeue.max_preemptions``; failures (CRASHED, OUT_OF_MEMORY)
against ``requeue.max_failures`` and wait an exponential backoff with full
jitter. A crash-loop breaker stops a job whose last ``crash_loop_threshold``
attempts all ended no further than the checkpoint they started from. Final
classes (completed, config error, budget exhausted, caps reached, fenced) are
never requeued.

The same counts guard the start of every attempt (``refuse_reason``), so the
caps hold whoever restarts the job: the supervisor, Slurm, SkyPilot,
Kubernetes, or a person re-running the command.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from orchestrator.exitcodes import FINAL_CLASSES, INTERRUPTED, ExitClass

PREEMPTION_CLASSES = INTERRUPTED  # requeued against requeue.max_preemptions
FAILURE_CLASSES = frozenset({ExitClass.CRASHED, ExitClass.OUT_OF_MEMORY})
RUNNING = "running"  # an attempt in the ledger that has not recorded its end


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


def attempt_class(attempt: Mapping[str, Any]) -> Optional[ExitClass]:
    """The ExitClass of a ledger attempt; None for an unknown class.

    An attempt still marked "running" is counted as VANISHED: once a new
    decision is being made, nothing will ever record its end.
    """
    value = attempt.get("exit_class")
    if value == RUNNING:
        return ExitClass.VANISHED
    try:
        return ExitClass(value)
    except ValueError:
        return None


def _made_no_progress(attempt: Mapping[str, Any]) -> bool:
    """True when the attempt ended no further than the checkpoint it started from.

    Progress is the newest checkpoint it committed (``checkpoint_step_end``):
    steps trained past it are lost when the attempt dies, so an attempt that
    crashes before its first checkpoint made none. Attempts recorded without
    that field fall back to ``step_end``; one that never recorded its last
    step is taken as having made none.
    """
    start = attempt.get("checkpoint_step_at_start") or 0
    end = attempt.get("checkpoint_step_end", attempt.get("step_end"))
    return end is None or end <= start


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
        self.backoff_base_seconds = float(requeue_cfg.backoff_base_seconds)
        self.backoff_max_seconds = float(requeue_cfg.backoff_max_seconds)
        self.crash_loop_threshold = int(requeue_cfg.crash_loop_threshold)
        if min(self.max_preemptions, self.max_failures) < 0:
            raise ValueError("requeue.max_preemptions and requeue.max_failures must be >= 0 (0: never requeue).")
        if min(self.backoff_base_seconds, self.backoff_max_seconds) < 0:
            raise ValueError("requeue.backoff_base_seconds and requeue.backoff_max_seconds must be >= 0.")
        if self.crash_loop_threshold < 1:
            raise ValueError(
                "requeue.crash_loop_threshold must be >= 1: it counts consecutive attempts without "
                "progress, and stopping after zero of them would stop every job."
            )

    # -- counting ---------------------------------------------------------

    @staticmethod
    def count(attempts: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
        """(preemptions, failures) among ``attempts``."""
        classes = [attempt_class(a) for a in attempts]
        return (
            sum(c in PREEMPTION_CLASSES for c in classes),
            sum(c in FAILURE_CLASSES for c in classes),
        )

    def no_progress_streak(self, attempts: Sequence[Mapping[str, Any]]) -> int:
        """How many of the latest attempts in a row, none completed, made no progress."""
        streak = 0
        for attempt in reversed(attempts):
            if attempt_class(attempt) == ExitClass.COMPLETED or not _made_no_progress(attempt):
                break
            streak += 1
        return streak

    def backoff_seconds(self, failures: int, rng: Optional[random.Random] = None) -> float:
        """Full-jitter backoff before retry number ``failures`` (1-based).

        Uniform in [0, min(backoff_max_seconds, backoff_base_seconds * 2**(failures-1))].
        """
        ceiling = min(self.backoff_max_seconds, self.backoff_base_seconds * 2 ** max(0, failures - 1))
        return (rng or random).uniform(0.0, ceiling)

    def _crash_loop_reason(self, attempts: Sequence[Mapping[str, Any]]) -> Optional[str]:
        streak = self.no_progress_streak(attempts)
        if streak < self.crash_loop_threshold:
            return None
        step = attempts[-1].get("checkpoint_step_at_start") or 0
        return (
            f"crash loop: the last {streak} attempts made no progress past the checkpoint at step {step} "
            f"(requeue.crash_loop_threshold={self.crash_loop_threshold}); see the last attempt's log"
        )

    # -- decisions --------------------------------------------------------

    def decide(self, attempts: Sequence[Mapping[str, Any]], *, rng: Optional[random.Random] = None) -> Decision:
        """Decide after the last of ``attempts`` ended.

        Args:
            attempts: the ledger's attempts, oldest first; the last one is the
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
            return _stop(f"unknown exit class {last.get('exit_class')!r}")
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
        if failures >= self.max_failures:
            return _stop(f"{failures} failures reached requeue.max_failures={self.max_failures}")
        delay = self.backoff_seconds(failures, rng)
        reason = f"{last_class.value}; retrying in {delay:.1f}s"
        return Decision(True, reason, delay, f"requeue [{failures}/{self.max_failures}]: {reason}")

    def refuse_reason(self, ledger: Mapping[str, Any]) -> Optional[str]:
        """Why a new attempt must not start, or None when it may.

        Args:
            ledger: the run's ledger; only ``ledger["attempts"]`` is read.
                Call this before recording the new attempt.

        Returns a reason when a cap is already spent or the crash-loop breaker
        has tripped, with what to change to go on anyway. The worker exits with
        ``exitcodes.CAPS_REACHED`` on a reason.
        """
        attempts = list(ledger.get("attempts") or [])
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
    ExitClass.FENCED: "fenced: another attempt of this job holds a newer epoch",
}


def _stop(reason: str) -> Decision:
    return Decision(False, reason, 0.0, f"not requeued: {reason}")
