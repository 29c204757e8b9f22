"""Spot traces (``data/spot-traces/``) as cycles of availability intervals, for the simulator and the replay bench.

Format: ``{"metadata": {"gap_seconds": G}, "data": [0, 1, ...]}``, one value per tick of G seconds. Which value
means "a spot instance could be held at that tick" is not the file's to say: it is declared, per set, by a
``conventions.json`` in the traces' folder or a parent (``{"availability/1-node/aws-02-15-2023":
{"available_value": 1, "evidence": "..."}}``, keyed by the set's folder relative to that file), or by the caller
(``--available-value``). An undeclared trace is refused: the public sets count available instances (1 =
available), SkyNomad's converted traces (TraceEnv format) mark preemptions (1 = preempted), and the file alone
does not tell them apart. A run of available ticks is one spot lifetime; time runs on past the end, cyclically.

Prices: ``metadata.price_info.price`` / ``.on_demand_price`` (USD per hour, SkyNomad's converted traces) and a
per-tick ``prices`` array (top level or in ``metadata``) are kept when present; else the caller's catalog prices.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

CONVENTIONS_FILE = "conventions.json"
AVAILABLE_VALUES = (0, 1)


@dataclass(frozen=True)
class Trace:
    """A trace as a cycle of availability intervals ``[start, end)`` in seconds, within ``[0, period)``."""

    name: str
    gap_seconds: float
    period: float
    starts: tuple[float, ...]
    ends: tuple[float, ...]
    spot_usd: Optional[float] = None  # the trace's own prices (metadata), None: the catalog's
    on_demand_usd: Optional[float] = None
    prices: tuple[float, ...] = ()  # a spot price per tick, when the trace has them
    convention: str = ""  # where the reading of its values came from

    @classmethod
    def from_ticks(
        cls, name: str, ticks: Sequence[int], gap_seconds: float, *, available_value: int, **extra
    ) -> "Trace":
        """``ticks`` read with ``available_value`` as the value that means spot capacity (every other: none)."""
        starts, ends, begin = [], [], None
        for i, value in enumerate(list(ticks) + [None]):
            if value == available_value and begin is None:
                begin = i
            elif value != available_value and begin is not None:
                starts.append(begin * gap_seconds)
                ends.append(i * gap_seconds)
                begin = None
        return cls(name, float(gap_seconds), len(ticks) * float(gap_seconds), tuple(starts), tuple(ends), **extra)

    @property
    def ticks(self) -> int:
        return int(round(self.period / self.gap_seconds))

    @property
    def available_share(self) -> float:
        """The share of the trace's time with spot capacity."""
        return sum(e - s for s, e in zip(self.starts, self.ends)) / self.period if self.period else 0.0

    @property
    def preemptions_per_available_hour(self) -> float:
        """``available -> not`` edges (one per lifetime that ends inside the trace) per hour of capacity."""
        edges = sum(1 for e in self.ends if e < self.period)
        hours = self.available_share * self.period / 3600.0
        return edges / hours if hours else math.inf

    def available_ticks(self) -> list[bool]:
        """One flag per tick: spot capacity at that tick."""
        flags = [False] * self.ticks
        for s, e in zip(self.starts, self.ends):
            for i in range(int(round(s / self.gap_seconds)), int(round(e / self.gap_seconds))):
                flags[i] = True
        return flags

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


def declared_convention(path: Path) -> tuple[int, str]:
    """``(available_value, where it was declared)`` for a trace file, from the nearest ``conventions.json``
    above it that lists its set (its folder, or a folder above it, relative to that ``conventions.json``)."""
    path = Path(path).resolve()
    for folder in path.parents:
        doc_path = folder / CONVENTIONS_FILE
        if not doc_path.is_file():
            continue
        try:
            doc = json.loads(doc_path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{doc_path} is not readable JSON ({err}).") from None
        rel = path.parent.relative_to(folder)
        for key in [rel, *rel.parents]:  # the set's own folder first, then the folders above it
            entry = doc.get(key.as_posix()) if isinstance(doc, dict) else None
            if isinstance(entry, dict) and "available_value" in entry:
                value = entry["available_value"]
                if value not in AVAILABLE_VALUES:
                    raise ValueError(
                        f"{doc_path}: {key.as_posix()!r} has available_value {value!r}; it must be 0 or 1."
                    )
                return int(value), f"{doc_path} [{key.as_posix()}]"
    raise ValueError(
        f"{path}: no declared convention says which value means spot capacity (no {CONVENTIONS_FILE} "
        f"in its folder or a parent lists its set '{path.parent.name}'); refusing to guess. Declare it "
        f'there ({{"<set folder>": {{"available_value": 1}}}}) or pass --available-value 0|1.'
    )


def load_trace(path: Path, available_value: Optional[int] = None) -> Trace:
    """One trace file, read with ``available_value`` or, when None, its set's declared convention."""
    if available_value is not None and available_value not in AVAILABLE_VALUES:
        raise ValueError(f"available value {available_value!r}: it must be 0 or 1.")
    try:
        doc = json.loads(Path(path).read_text())
        meta = doc["metadata"]
        gap, ticks = float(meta["gap_seconds"]), [int(v) for v in doc["data"]]
        prices = tuple(float(p) for p in (doc.get("prices") or meta.get("prices") or ()))
        info = meta.get("price_info") or {}
        spot = float(info["price"]) if info.get("price") is not None else None
        on_demand = float(info["on_demand_price"]) if info.get("on_demand_price") is not None else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(
            f"{path} is not a spot trace ({type(err).__name__}: {err}); expected "
            '{"metadata": {"gap_seconds": G}, "data": [0, 1, ...]} as in data/spot-traces/.'
        ) from None
    if not math.isfinite(gap) or gap <= 0 or not ticks:
        raise ValueError(f"{path}: gap_seconds must be a finite number > 0 and data non-empty.")
    if prices and len(prices) != len(ticks):
        raise ValueError(f"{path}: {len(prices)} prices for {len(ticks)} ticks; give one price per tick.")
    if any(not math.isfinite(p) or p < 0 for p in prices + tuple(x for x in (spot, on_demand) if x is not None)):
        raise ValueError(f"{path}: prices must be finite numbers >= 0.")
    if available_value is None:
        available_value, source = declared_convention(Path(path))
    else:
        source = "--available-value"
    return Trace.from_ticks(
        str(path),
        ticks,
        gap,
        available_value=available_value,
        spot_usd=spot,
        on_demand_usd=on_demand,
        prices=prices,
        convention=f"available_value {available_value} ({source})",
    )


def load_traces(folder: str | Path, available_value: Optional[int] = None) -> list[Trace]:
    """Every ``*.json`` trace under ``folder`` (recursively; ``conventions.json`` is not one), sorted by path."""
    root = Path(folder)
    files = (
        sorted(f for f in root.rglob("*.json") if f.name != CONVENTIONS_FILE)
        if root.is_dir()
        else ([root] if root.is_file() else [])
    )
    if not files:
        raise ValueError(
            f"no trace files (*.json) in {folder}; point --traces at data/spot-traces/ or one of its folders."
        )
    return [load_trace(f, available_value) for f in files]
