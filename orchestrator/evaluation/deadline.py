"""``run.deadline`` in ``orchestrator eval``: the eval job stops before it, with what is done stored.

The same key as a training job's finish-by (``orchestrator/core/durations.py``): an ISO-8601 time, or a
duration from the job's first attempt (the ledger's; from the eval command's start for a job with no attempt).
An evaluation starts only if it can end by then, judged by the longest one so far in this run (the first one
starts whenever the deadline has not passed); the checkpoints left are counted and named in the last line, and
the command exits 0 (a rerun with a later deadline goes on from the stored results).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional


def deadline_at(text: Optional[str], ledger: dict, now: float) -> Optional[float]:
    """``run.deadline`` as a unix time (None without one)."""
    from orchestrator.core.durations import parse_deadline

    if text is None:
        return None
    kind, value = parse_deadline(text)
    if kind == "at":
        return value
    starts = [a.get("started_at") for a in ledger.get("attempts") or []]
    starts = [float(s) for s in starts if isinstance(s, (int, float)) and math.isfinite(s)]
    return (min(starts) if starts else now) + value


class EvalDeadline:
    def __init__(self, at: Optional[float], clock: Callable[[], float] = time.time):
        self.at, self.clock, self.longest = at, clock, 0.0

    @classmethod
    def of(cls, cfg: Any, ledger: dict, clock: Callable[[], float] = time.time) -> "EvalDeadline":
        return cls(deadline_at(cfg.run.deadline, ledger, clock()), clock)

    def allows_another(self) -> bool:
        """Whether one more evaluation, as long as the longest so far, ends by the deadline."""
        return self.at is None or self.clock() + self.longest <= self.at

    def took(self, seconds: float) -> None:
        self.longest = max(self.longest, float(seconds))
