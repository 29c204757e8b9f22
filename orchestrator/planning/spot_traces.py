"""Spot traces (``data/spot-traces/``) as cycles of availability intervals, for the simulator and the replay bench.

Format: ``{"metadata": {"gap_seconds": G}, "data": [0, 1, ...]}``, one value per tick of G seconds, 0 = a spot
instance could be held at that tick. A run of 0s is one spot lifetime; time runs on past the end, cyclically.
"""
from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class Trace:
    """A trace as a cycle of availability intervals ``[start, end)`` in seconds, within ``[0, period)``."""

    name: str
    gap_seconds: float
    period: float
    starts: tuple[float, ...]
    ends: tuple[float, ...]

    @classmethod
    def from_ticks(cls, name: str, ticks: Sequence[int], gap_seconds: float) -> "Trace":
        starts, ends, begin = [], [], None
        for i, value in enumerate(list(ticks) + [1]):
            if value == 0 and begin is None:
                begin = i
            elif value != 0 and begin is not None:
                starts.append(begin * gap_seconds)
                ends.append(i * gap_seconds)
                begin = None
        return cls(name, float(gap_seconds), len(ticks) * float(gap_seconds), tuple(starts), tuple(ends))

    def spot_at(self, t: float) -> tuple[bool, float]:
        """(spot available at ``t``, when that next changes); time runs on past the period, cyclically."""
        if not self.starts:
            return False, math.inf
        if self.starts[0] == 0 and self.ends[-1] == self.period and len(self.starts) == 1:
            return True, math.inf
        base = math.floor(t / self.period) * self.period
        x = t - base
        i = bisect.bisect_right(self.starts, x) - 1
        if i >= 0 and x < self.ends[i]:
            end = self.ends[i]
            if end == self.period and self.starts[0] == 0:  # the interval runs on into the next cycle
                end = self.period + self.ends[0]
            return True, base + end
        nxt = self.starts[i + 1] if i + 1 < len(self.starts) else self.period + self.starts[0]
        return False, base + nxt


def load_trace(path: Path) -> Trace:
    try:
        doc = json.loads(Path(path).read_text())
        gap, ticks = float(doc["metadata"]["gap_seconds"]), [int(v) for v in doc["data"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a spot trace ({type(err).__name__}: {err}); expected "
                         '{"metadata": {"gap_seconds": G}, "data": [0, 1, ...]} as in data/spot-traces/.') from None
    if not math.isfinite(gap) or gap <= 0 or not ticks:
        raise ValueError(f"{path}: gap_seconds must be a finite number > 0 and data non-empty.")
    return Trace.from_ticks(str(path), ticks, gap)


def load_traces(folder: str | Path) -> list[Trace]:
    """Every ``*.json`` trace under ``folder`` (recursively), sorted by path."""
    root = Path(folder)
    files = sorted(root.rglob("*.json")) if root.is_dir() else ([root] if root.is_file() else [])
    if not files:
        raise ValueError(f"no trace files (*.json) in {folder}; point --traces at data/spot-traces/ or one of its "
                         "folders.")
    return [load_trace(f) for f in files]
