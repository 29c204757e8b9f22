"""The sweep's part of ``orchestrator report``: each sweep's best-so-far score against the dollars spent.

Reads the sweep's parent run (tagged ``orchestrator.kind=sweep``, ``orchestrator.sweep.tracking``): its
``best_<metric>`` and ``spent_usd`` histories, logged at the same steps. One line per sweep, and one chart
per sweep (a step line: the leader's metric against cumulative USD) beside ``--out``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from orchestrator.tracking.run import KIND_TAG

SWEEP_KIND = "sweep"


@dataclass
class SweepCurve:
    name: str
    metric: str
    points: list[tuple[float, float]]  # (cumulative USD, best-so-far metric), in the order they were logged


def sweep_curves(client, experiment_id: str) -> list[SweepCurve]:
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{KIND_TAG}` = '{SWEEP_KIND}'", max_results=500)
    curves = []
    for run in runs:
        best = [
            k for k in run.data.metrics if k.startswith("best_") and k not in ("best_trial", "best_step", "best_rung")
        ]
        if not best:
            continue
        spent = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "spent_usd")}
        history = sorted(client.get_metric_history(run.info.run_id, best[0]), key=lambda m: (m.step, m.timestamp))
        points = [
            (spent[m.step], m.value)
            for m in history
            if m.step in spent and math.isfinite(spent[m.step]) and math.isfinite(m.value)
        ]
        curves.append(SweepCurve(run.data.tags.get("sweep") or run.info.run_name, best[0][len("best_") :], points))
    return sorted(curves, key=lambda c: c.name)


def chart_path(out: str, name: str) -> str:
    path = Path(out)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return str(path.with_name(f"{path.stem}_sweep_{safe}.png"))


def plot_curve(curve: SweepCurve, out_path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    if curve.points:
        xs, ys = zip(*curve.points)
        ax.step(xs, ys, where="post", marker="o")
    ax.set_xlabel("spent (USD, cumulative)")
    ax.set_ylabel(f"best {curve.metric} so far")
    ax.set_title(f"sweep {curve.name}: score against dollars")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def report_sweeps(client, experiment_id: str, out: str) -> tuple[list[str], list[str]]:
    """(lines to print, chart files written): one of each per sweep in the experiment."""
    lines, files = [], []
    for curve in sweep_curves(client, experiment_id):
        path = chart_path(out, curve.name)
        plot_curve(curve, path)
        files.append(path)
        if curve.points:
            usd, value = curve.points[-1]
            lines.append(
                f"sweep {curve.name}: best {curve.metric}={value:.4f} after ${usd:.4f} "
                f"({len(curve.points)} points); chart {path}"
            )
        else:
            lines.append(f"sweep {curve.name}: no rung result yet; chart {path}")
    return lines, files
