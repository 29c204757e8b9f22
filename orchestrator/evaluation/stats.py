"""The gain of a score over the base model's, with its 95% interval, and dollars per point only beyond noise.

Paired over the same items where both results hold per-item values (the harness's samples): the interval of the
mean difference, 1.96 standard errors of the per-item differences. Otherwise from the two standard errors as if
independent (wider). Points are percentage points of a fraction-valued metric (x 100).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from orchestrator.records.bench_result import ITEMS_TOLERANCE, BenchResult, items_agree

Z95 = 1.959963984540054
__all__ = ["ITEMS_TOLERANCE", "Z95", "Gain", "gain", "gains", "items_agree", "report_cell"]


@dataclass(frozen=True)
class Gain:
    points: float  # after - before, x 100
    half_width: float  # the 95% interval is points +- half_width
    paired: bool
    items: int = 0  # the items paired over (0: unpaired)

    @property
    def basis(self) -> str:
        """What the interval rests on, for a line a person reads."""
        return f"paired over {self.items} items" if self.paired else "from the two standard errors"

    @property
    def beyond_noise(self) -> bool:
        return abs(self.points) > self.half_width

    def usd_per_point(self, cost_usd: float) -> Optional[float]:
        """Dollars per point gained: only for a gain whose interval excludes 0."""
        if not self.beyond_noise or self.points <= 0:
            return None
        return float(cost_usd) / self.points

    def verdict(self, cost_usd: float) -> str:
        per_point = self.usd_per_point(cost_usd)
        if per_point is None:
            return f"{self.points:+.1f} points: no gain beyond noise (+-{self.half_width:.1f} points)"
        return f"{self.points:+.1f} points (+-{self.half_width:.1f}), ${per_point:.6f} per point"


def gain(
    after: dict,
    before: dict,
    after_items: Optional[Sequence[float]] = None,
    before_items: Optional[Sequence[float]] = None,
) -> Gain:
    """``after``/``before``: ``{"value", "stderr"}``; ``*_items``: per-item values over the same items, used only
    where each score is their mean (``items_agree``: else the per-item values are not that score's evidence)."""
    if (
        after_items
        and before_items
        and len(after_items) == len(before_items)
        and len(after_items) > 1
        and items_agree(after.get("value"), after_items)
        and items_agree(before.get("value"), before_items)
    ):
        diffs = [a - b for a, b in zip(after_items, before_items)]
        n = len(diffs)
        mean = sum(diffs) / n
        var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
        return Gain(points=100 * mean, half_width=100 * Z95 * math.sqrt(var / n), paired=True, items=n)
    se = math.sqrt(float(after.get("stderr") or 0.0) ** 2 + float(before.get("stderr") or 0.0) ** 2)
    return Gain(points=100 * (after["value"] - before["value"]), half_width=100 * Z95 * se, paired=False)


def gains(after: BenchResult, before: BenchResult) -> dict:
    """Per ``task/metric`` of two stored results (their scores and per-item values), the gain of ``after`` over
    ``before``: paired only when both scored the same items (same harness version, task hash and seed)."""
    same_items = after.identity == before.identity
    out = {}
    for task, metrics in after.scores.items():
        for metric, score in metrics.items():
            base = before.score(task, metric)
            if base is None:
                continue
            if not same_items:
                out[f"{task}/{metric}"] = gain(score.encode(), base.encode())
                continue
            out[f"{task}/{metric}"] = gain(
                score.encode(), base.encode(), after.items(task, metric), before.items(task, metric)
            )
    return out


def report_cell(metrics: dict) -> str:
    """A job's benchmark column from its run's latest metrics: each score with its 95% interval, and the gain
    over the base with its interval and USD per point (or "within noise")."""
    cells = []
    for key in sorted(k for k in metrics if k.startswith("bench/") and not k.endswith("_stderr")):
        name = key[len("bench/") :]
        text = f"{name}={metrics[key]:.3f}"
        if metrics.get(f"{key}_stderr") is not None:
            text += f"+-{Z95 * metrics[key + '_stderr']:.3f}"
        gain_points, interval = metrics.get(f"bench_gain/{name}"), metrics.get(f"bench_gain/{name}_interval")
        if gain_points is not None and interval is not None:
            per_point = metrics.get(f"bench_usd_per_point/{name}")
            text += f" ({gain_points:+.1f}+-{interval:.1f} pts, " + (
                f"${per_point:.4f}/pt)" if per_point is not None else "within noise)"
            )
        cells.append(text)
    return "; ".join(cells) or "-"
