"""Durations in config values (``90s``, ``15m``, ``1h``, ``off``), with no Hydra import.

Storage, preemption and the backends parse durations; they import this module,
not the config boundary, so they don't pull Hydra in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
# checkpoint.every=auto: the bounds of the interval it derives, unless checkpoint.min_every / max_every say
MIN_EVERY, MAX_EVERY = "1m", "1h"
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str | int | float, *, key: str = "duration") -> float:
    """'90s' -> 90.0, '15m' -> 900.0, '1h' -> 3600.0; 'off'/'0' -> 0.0.

    Raises ValueError naming ``key`` and the accepted forms.
    """
    if isinstance(text, (int, float)):
        return float(text)
    if str(text).strip().lower() in {"off", "none", "no", "false", ""}:
        return 0.0
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"{key}={text!r} is not a duration. Write a number with a unit: 90s, 15m, 1h (or 'off').")
    return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]


def parse_deadline(text: object) -> tuple[str, float]:
    """``run.deadline``: ("after", seconds from the job's first attempt) for ``52h``; ("at", unix time) for an
    ISO-8601 time (UTC when it names no zone). Raises ValueError with the accepted forms."""
    from datetime import datetime, timezone

    value = str(text).strip()
    try:
        seconds = parse_duration(value, key="run.deadline")
        if seconds > 0:
            return "after", seconds
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"run.deadline={text!r} is neither a duration from the job's first attempt (52h, 90m) nor "
            "an ISO-8601 time (2026-12-24T18:00:00+00:00). Write one of those."
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return "at", when.timestamp()


AUTO = "auto"  # checkpoint.every=auto: the interval is derived (``orchestrator.policy.interval.checkpoint_interval``)


@dataclass(frozen=True)
class Every:
    """``checkpoint.every`` parsed: ``auto`` (Young/Daly, bounded by ``checkpoint.min_every/max_every``), or a
    wall-clock interval in seconds (0: off). Parsed once, by ``parse``; the parts read ``auto`` and ``seconds``."""

    auto: bool
    seconds: float  # the fixed interval; 0 when off or auto

    @classmethod
    def parse(cls, text: object, *, key: str = "checkpoint.every") -> "Every":
        """``auto`` | a duration (``15m``, ``90s``) | ``0``/``off``. Raises ValueError naming ``key``."""
        if str(text).strip().lower() == AUTO:
            return cls(auto=True, seconds=0.0)
        return cls(auto=False, seconds=parse_duration(text if isinstance(text, (int, float)) else str(text), key=key))

    @property
    def off(self) -> bool:
        """No wall-clock checkpoints (``checkpoint.every=0``/``off``; ``checkpoint.every_steps`` may still save)."""
        return not self.auto and self.seconds <= 0
