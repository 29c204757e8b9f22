"""Benchmark score against cumulative dollars: the points, the chart (PNG) and the verdict a user decides on.

A point is one evaluation: the training step, the job's cost when it was evaluated (the base model at $0), the
score and its standard error. The same points come from stored results (the job's own chart, ``from_records``)
or from a run's MLflow history (``orchestrator report``, ``from_history``).

The verdict per metric, over the points in step order (``window`` = K evaluations, ``max_usd_per_point`` a
threshold or None):

- ``change``: the last score is worse than the base beyond noise (the method is hurting);
- ``continue``: the last K evaluations still gain beyond noise, at no more than the threshold per point;
- ``stop``: flat within noise over the last K evaluations, or past the point where a point costs more than the
  threshold;
- ``continue`` too while there are fewer than K evaluations after the base and no gain beyond noise yet (too
  few to call a plateau), said so.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional, cast

from orchestrator.evaluation.stats import Z95, gain, items_agree
from orchestrator.records.bench_result import BenchResult

log = logging.getLogger(__name__)

CHART_ARTIFACT = "bench/score_vs_usd.png"
ITEMS_FOLDER = "bench/items"  # per evaluated step, its per-item values: what makes the report's gains paired
DEFAULT_WINDOW = 3


def items_artifact(step: int) -> str:
    return f"{ITEMS_FOLDER}/step_{int(step):09d}.json"


def items_of(identity: dict) -> Optional[str]:
    """Which items an evaluation scored: its harness version, task configuration hash and seed (a result record's
    ``identity``). Two evaluations' per-item values are paired only when this is the same: equal counts are not
    the same items (another task version, limit or few-shot seed). None without all three."""
    parts = [identity.get(k) for k in ("harness_version", "task_hash", "seed")]
    if not all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in parts):
        return None
    return "/".join(str(p) for p in parts)


def items_payload(step: int, samples: dict, identity: dict) -> dict:
    """The artifact ``items_artifact(step)`` holds: ``samples[task][metric]`` = per-item values in item order, and
    ``items_of`` the items they are of (``items_of(identity)``)."""
    return {"step": int(step), "items_of": items_of(identity), "samples": samples}


def read_items(payload: Any) -> Optional[tuple[int, str, dict[str, tuple]]]:
    """``(step, items_of, {"task/metric": values})`` of an items artifact read back from MLflow (untrusted: None
    unless a whole step, the items' identity and lists of finite numbers; one written without the identity, by
    an earlier version, is None too: its values are not paired)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("samples"), dict):
        return None
    step, of = payload.get("step"), payload.get("items_of")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0 or not isinstance(of, str) or not of:
        return None
    out = {}
    for task, metrics in payload["samples"].items():
        if not isinstance(metrics, dict):
            return None
        for metric, values in metrics.items():
            if not isinstance(values, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
            ):
                return None
            out[f"{task}/{metric}"] = tuple(float(v) for v in values)
    return step, of, out


@dataclass(frozen=True)
class Point:
    step: int
    usd: float
    value: float
    stderr: Optional[float]
    items: Optional[tuple] = None  # the per-item values (the harness's samples), for a paired gain
    items_of: Optional[str] = None  # which items they are (``items_of``): pairs only with a point of the same

    @property
    def score(self) -> dict:
        return {"value": self.value, "stderr": self.stderr}


@dataclass(frozen=True)
class Verdict:
    decision: str  # continue | stop | change
    reason: str


def from_records(records: Iterable[BenchResult]) -> dict[str, list[Point]]:
    """Per ``task/metric``, the points of stored results (``results.ResultStore``'s), one per step."""
    by_step: dict[str, dict[int, Point]] = {}
    for record in records:
        step = record.step
        usd = 0.0 if step == 0 else record.cost_usd
        if usd is None:
            continue
        for task, scores in record.scores.items():
            for metric, score in scores.items():
                items = record.items(task, metric)
                by_step.setdefault(f"{task}/{metric}", {})[step] = Point(
                    step,
                    float(usd),
                    score.value,
                    score.stderr,
                    tuple(items) if items else None,
                    items_of(record.identity) if items else None,
                )
    return {key: [steps[s] for s in sorted(steps)] for key, steps in sorted(by_step.items())}


def from_history(history: dict[str, list], items: Optional[dict[int, tuple]] = None) -> dict[str, list[Point]]:
    """Per ``task/metric``, the points of a run's MLflow history (``{key: [mlflow Metric]}``): each
    ``bench/<task>/<metric>`` point with its ``_stderr`` and the ``cost_usd`` logged with it (same step, the
    nearest in time), the base's (step 0) at $0; ``items``: per step, ``(items_of, {"task/metric": values})``
    (``read_items``)."""
    items = items or {}
    costs: dict[int, list] = {}
    for m in history.get("cost_usd", []):
        costs.setdefault(m.step, []).append(m)
    out = {}
    for key in sorted(k for k in history if k.startswith("bench/") and not k.endswith("_stderr")):
        stderr = {m.step: m.value for m in history.get(f"{key}_stderr", [])}
        points = []
        for m in sorted(history[key], key=lambda m: m.step):
            near = min(costs.get(m.step, []), key=lambda c: abs(c.timestamp - m.timestamp), default=None)
            if m.step == 0 or near is not None:
                of, values = items.get(m.step, (None, {}))
                mine = values.get(key[len("bench/") :])
                if mine and not items_agree(m.value, mine):  # not the items this score is the mean of
                    log.warning(
                        "%s: the %d per-item values of %s (mean %.4f) are not those of its score %.4f; "
                        "its gains are not paired over them",
                        items_artifact(m.step),
                        len(mine),
                        key,
                        sum(mine) / len(mine),
                        m.value,
                    )
                    mine = None
                points.append(
                    Point(
                        m.step,
                        0.0 if m.step == 0 else cast(Any, near).value,
                        m.value,
                        stderr.get(m.step),
                        mine,
                        of if mine else None,
                    )
                )
        out[key[len("bench/") :]] = points
    return out


def judge(
    points: list[Point], *, window: int = DEFAULT_WINDOW, max_usd_per_point: Optional[float] = None
) -> Optional[Verdict]:
    """The verdict on one metric's points (the base first); None with no evaluation after the base."""
    if len(points) < 2 or points[0].step != 0:
        return None
    base, last = points[0], points[-1]
    overall = _gain(last, base)
    if overall.points < 0 and overall.beyond_noise:
        return Verdict(
            "change",
            f"{overall.points:+.1f}+-{overall.half_width:.1f} points against the base "
            f"({_inputs(base, last, overall)}) after ${last.usd:.4f}: worse beyond noise",
        )
    ref = points[max(0, len(points) - 1 - window)]
    recent, usd = _gain(last, ref), last.usd - ref.usd
    span = (
        f"over the last {len(points) - 1 - points.index(ref)} evaluation(s) (steps {ref.step}-{last.step}: "
        f"{_inputs(ref, last, recent)})"
    )
    moved = f"{recent.points:+.1f}+-{recent.half_width:.1f} points {span} for ${usd:.4f}"
    if recent.beyond_noise and recent.points > 0:
        per_point = usd / recent.points
        if max_usd_per_point is not None and per_point > max_usd_per_point:
            return Verdict("stop", f"{moved}: ${per_point:.4f}/pt, past ${max_usd_per_point:.4f}/pt")
        return Verdict("continue", f"{moved}: ${per_point:.4f}/pt, still gaining beyond noise")
    if len(points) - 1 < window:
        return Verdict(
            "continue",
            f"{moved}: within noise, but only {len(points) - 1} evaluation(s) after the "
            f"base (a plateau needs {window})",
        )
    return Verdict("stop", f"{moved}: flat within noise")


def _gain(after: Point, before: Point):
    """Paired over the same items where both points have per-item values of the same items (as the final gain),
    else from the two standard errors."""
    if after.items_of is None or after.items_of != before.items_of:
        return gain(after.score, before.score)
    return gain(after.score, before.score, list(after.items or ()), list(before.items or ()))


def _inputs(before: Point, after: Point, g) -> str:
    return f"{before.value:.3f} -> {after.value:.3f}, {g.basis}"


def job_verdict(series: dict[str, list[Point]], **kwargs) -> Optional[tuple[str, str]]:
    """One decision per job: ``change`` if any metric says so, else ``continue`` if any does, else ``stop``;
    with every metric's numbers."""
    verdicts = {key: v for key, v in ((k, judge(p, **kwargs)) for k, p in series.items()) if v is not None}
    if not verdicts:
        return None
    decisions = {v.decision for v in verdicts.values()}
    decision = next(d for d in ("change", "continue", "stop") if d in decisions)
    return decision, "; ".join(f"{key}: {v.reason}" for key, v in sorted(verdicts.items()))


def plot(series: dict[str, list[Point]], out_path: str, *, title: str = "benchmark score against dollars") -> int:
    """Write the chart: one line per label, each point with its 95% error bar; returns the points drawn."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a training box or in CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    drawn = 0
    for label, points in sorted(series.items()):
        if not points:
            continue
        errors = [0.0 if p.stderr is None else Z95 * p.stderr for p in points]
        ax.errorbar([p.usd for p in points], [p.value for p in points], yerr=errors, marker="o", capsize=3, label=label)
        drawn += len(points)
    ax.set_xlabel("cumulative cost (USD; the base model at $0)")
    ax.set_ylabel("benchmark score (95% error bars)")
    ax.set_title(title if drawn else f"{title} (no evaluation yet)")
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return drawn


def render(records: Iterable[BenchResult], *, title: str) -> bytes:
    """The PNG of ``plot`` over stored results' points (a job's own chart)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/chart.png"
        plot(from_records(records), path, title=title)
        with open(path, "rb") as fh:
            return fh.read()
