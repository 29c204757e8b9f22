"""What the attempt's steering parts share, instead of the runner: the step clock and the checkpoint interval.

- ``StepClock``: one time measurement per optimizer step, taken by the Trainer callback
  (``orchestrator.checkpoint.callback``) and read by the cost figures, the trial, the checkpoint
  schedule and the capacity watch; the save stalls with it.
- ``CheckpointInterval``: how often the Trainer callback saves by the clock. Fixed
  (``checkpoint.every``, or off) or ``auto``, which the checkpoint schedule sets once it has decided;
  "off" and "not decided yet" are two states, not one ``0.0``.

The third port, ``request_stop(reason)`` (save, then stop), is the preemption handler's ``request``.
"""

from __future__ import annotations

import time
from typing import Callable, Optional


class StepClock:
    """Per-step timing of this attempt, fed by the Trainer callback; the first step of an attempt (warm-up) and
    whatever is not a step (a save, a log, the job's per-step hooks) are left out.

    The callback calls ``step_began`` at a step's start, ``step_ended`` at its end and ``resume`` after
    anything that is not training; ``saved(stall)`` after each checkpoint save.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._began: Optional[float] = None
        self._last_end: Optional[float] = None
        # [steps, step seconds, data-wait seconds] since the last timing_metrics(), and over the whole attempt:
        # running sums, so a read costs the same at step 100 and at step 100 000
        self._window = [0, 0.0, 0.0]
        self._all = [0, 0.0, 0.0]
        self.last_step_seconds: Optional[float] = None  # the newest step's seconds (None: it was not measured)
        self.save_stall_seconds: list[float] = []

    def step_began(self) -> None:
        self._began = self.clock()

    def step_ended(self) -> Optional[float]:
        """The step's seconds from the previous step's end: the gap before it began is mostly the data loader."""
        now = self.clock()
        if self._began is None or self._last_end is None:
            self.last_step_seconds = None
            return None
        step_s, wait_s = now - self._last_end, self._began - self._last_end
        for sums in (self._window, self._all):
            sums[0] += 1
            sums[1] += step_s
            sums[2] += wait_s
        self.last_step_seconds = step_s
        return step_s

    def resume(self) -> None:
        """Training goes on from now: what happened since the last step's end is not the next step's."""
        self._last_end = self.clock()

    def saved(self, stall_seconds: float) -> None:
        self.save_stall_seconds.append(max(0.0, float(stall_seconds)))

    def timing_metrics(self, *, reset: bool = True, whole_run: bool = False) -> dict:
        """Mean step time and data-loader wait (seconds) since the last call, or over the attempt."""
        steps, step_s, wait_s = self._all if whole_run else self._window
        if not steps:
            return {}
        if reset and not whole_run:
            self._window = [0, 0.0, 0.0]
        return {"step_time_s": step_s / steps, "data_wait_s": wait_s / steps}

    def steady_seconds_per_step(self) -> Optional[float]:
        """Mean seconds per step over the attempt (None: none measured yet)."""
        return self.timing_metrics(reset=False, whole_run=True).get("step_time_s")


class CheckpointInterval:
    """Seconds of training between the Trainer callback's timed saves.

    ``fixed(s)``: ``checkpoint.every`` (``off()`` when 0); ``auto()``: ``checkpoint.every=auto``, with no interval
    until the checkpoint schedule ``set``s one. ``seconds`` is None while there is no interval (off, or not decided).
    """

    def __init__(self, seconds: Optional[float] = None, *, auto: bool = False):
        self.auto = auto
        self._seconds = seconds if seconds is not None and seconds > 0 else None

    @classmethod
    def fixed(cls, seconds: float) -> "CheckpointInterval":
        return cls(seconds)

    @classmethod
    def off(cls) -> "CheckpointInterval":
        return cls(None)

    @classmethod
    def derived(cls) -> "CheckpointInterval":
        return cls(None, auto=True)

    @property
    def seconds(self) -> Optional[float]:
        return self._seconds

    @property
    def decided(self) -> bool:
        return not self.auto or self._seconds is not None

    def set(self, seconds: float) -> None:
        """The checkpoint schedule's decision (``auto`` only: a fixed interval is the user's)."""
        if not self.auto:
            raise ValueError("a fixed checkpoint interval (checkpoint.every) is not re-derived")
        if not seconds > 0:
            raise ValueError(f"a derived checkpoint interval must be positive, got {seconds!r}")
        self._seconds = float(seconds)

    def __repr__(self) -> str:
        if self._seconds is None:
            return "CheckpointInterval(auto, not decided)" if self.auto else "CheckpointInterval(off)"
        return f"CheckpointInterval({'auto, ' if self.auto else ''}{self._seconds:g}s)"
