"""``orchestrator report``: every job of an experiment, its cost and quality, and a chart.

Reads MLflow only. Each job is one run (tagged ``job``) carrying:
    tags     recipe, model, quality_metric (the name of its main quality metric)
    metrics  cost_usd, ops/attempts, ops/preemptions, and the metric named by quality_metric
             (a fraction in [0, 1], e.g. eval_accuracy or eval_reward_accuracy), usd_per_point
             (the cost over the points gained since before training); names: ``orchestrator.tracking.names``

The chart (cost against quality, one labelled point per job) is written to
``--out`` and logged as ``cost_vs_quality.png`` to one run named "report"
(tagged ``orchestrator.kind=report``) in an experiment of its own, ``<experiment>-reports``, reused by
each invocation, so the latest chart is one click from the jobs it describes, no job's run is touched
after it ended, and the jobs' runs table lists only jobs. The benchmark scores against dollars go there
too, as the chart ``bench_vs_usd.png`` and the table ``bench_vs_usd.json`` (a table artifact, as
``MlflowClient.log_table`` writes one, which MLflow's UI draws).

A URI that does not answer fails within seconds, naming it (a TCP probe first; MLflow's own HTTP
retries would hold the command for minutes).

A sweep's parent run (``orchestrator.kind=sweep``) is not a job: it gets a line and its own chart, best-so-far
score against cumulative dollars, ``<out stem>_sweep_<name>.png`` (``orchestrator.sweep.report``), logged
to the report run too.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Optional

from orchestrator.core.console import Parser, fail
from orchestrator.core.redaction import scrub_text
from orchestrator.evaluation import curve
from orchestrator.evaluation.stats import report_cell
from orchestrator.tracking.names import metric_name
from orchestrator.tracking.run import JOB_TAG, KIND_TAG, log_table, run_page_url

log = logging.getLogger(__name__)

REPORT_RUN_NAME = "report"
REPORT_KIND = "report"
CHART_ARTIFACT = "cost_vs_quality.png"
BENCH_CHART_ARTIFACT = "bench_vs_usd.png"
BENCH_TABLE_ARTIFACT = "bench_vs_usd.json"
REPORTS_EXPERIMENT_SUFFIX = "-reports"
PROBE_TIMEOUT_S = 5.0
DEFAULT_EXPERIMENT = "spot-orchestrator"
COLUMNS = (
    "job",
    "recipe",
    "model",
    "status",
    "attempts",
    "preemptions",
    "cost_usd",
    "quality",
    "usd_per_point",
    "benchmarks",
)


@dataclass
class JobRow:
    job: str
    recipe: str
    model: str
    status: str
    attempts: Optional[int]
    preemptions: Optional[int]
    cost_usd: Optional[float]
    quality_metric: str
    quality: Optional[float]
    # USD per percentage point gained over the "before training" value, as the job logged it
    # (``orchestrator.money.report.usd_per_quality_point``); None when it had no gain or no "before"
    usd_per_point: Optional[float] = None
    benchmarks: str = "-"  # bench/<task>/<metric> with its 95% interval and the gain over the base (docs/quality.md)
    # per task/metric, every evaluation's (step, cost so far, score, stderr), the base's at $0 (curve.from_history)
    bench: dict = field(default_factory=dict)


def _number(run, key: str) -> Optional[float]:
    """The metric ``key`` (its MLflow name, ``tracking.names.metric_name``: ``attempts`` is ``ops/attempts``),
    else the metric or tag of that plain name (a run logged before the metrics had sections)."""
    for name in (metric_name(key), key):
        if name in run.data.metrics:
            return float(run.data.metrics[name])
    try:
        return float(run.data.tags[key])
    except (KeyError, ValueError):
        return None


def collect_jobs(client, experiment_id: str, *, window: int = curve.DEFAULT_WINDOW) -> list[JobRow]:
    """Every job's row; ``window``: the verdict's (per-item values are fetched only for the points it compares)."""
    # Filtered here, not in the query: a tag filter would also drop runs without the tag.
    runs = client.search_runs([experiment_id], max_results=5000)
    rows = []
    for run in runs:
        tags = run.data.tags
        if tags.get(KIND_TAG) in (
            REPORT_KIND,
            "sweep",
        ):  # a sweep's parent run: its own chart (orchestrator.sweep.report)
            continue
        quality_metric = tags.get("quality_metric", "")
        attempts = _number(run, "attempts")
        preemptions = _number(run, "preemptions")
        rows.append(
            JobRow(
                job=tags.get(JOB_TAG) or run.info.run_name or run.info.run_id,
                recipe=tags.get("recipe", "?"),
                model=tags.get("model", "?"),
                status=run.info.status,
                attempts=None if attempts is None else int(attempts),
                preemptions=None if preemptions is None else int(preemptions),
                cost_usd=_number(run, "cost_usd"),
                quality_metric=quality_metric,
                quality=_number(run, quality_metric) if quality_metric else None,
                usd_per_point=_number(run, "usd_per_quality_point"),  # the headline usd_per_point
                benchmarks=report_cell(run.data.metrics),
                bench=_bench_points(client, run, window=window),
            )
        )
    return sorted(rows, key=lambda r: r.job)


def _bench_points(client, run, *, window: int = curve.DEFAULT_WINDOW) -> dict:
    keys = [k for k in run.data.metrics if k.startswith("bench/")]
    if not keys:
        return {}
    history = {k: client.get_metric_history(run.info.run_id, k) for k in [*keys, "cost_usd"]}
    steps = _compared_steps(curve.from_history(history), window)
    return curve.from_history(history, _bench_items(client, run.info.run_id, steps))


def _compared_steps(series: dict, window: int) -> set[int]:
    """The steps the verdict compares (``curve.judge``): per metric its first point, its last and the one
    ``window`` evaluations before the last; only their per-item values are downloaded, not every evaluation's."""
    wanted = set()
    for points in series.values():
        if points:
            wanted |= {points[0].step, points[-1].step, points[max(0, len(points) - 1 - window)].step}
    return wanted


def _bench_items(client, run_id: str, steps: set[int]) -> dict[int, tuple]:
    """Per evaluated step of ``steps``, the per-item values the run holds (``bench/items/``): the verdict's gains
    are paired where both points have them. One that does not read back sound is left out (that gain is unpaired)."""
    import json

    out: dict = {}
    wanted = {curve.items_artifact(step) for step in steps}
    try:
        files = [a.path for a in client.list_artifacts(run_id, curve.ITEMS_FOLDER) if a.path in wanted]
    except Exception as err:  # noqa: BLE001 - no items: the verdict falls back to the two standard errors
        log.warning(
            "cannot list %s of run %s (%s); its verdict uses unpaired intervals",
            curve.ITEMS_FOLDER,
            run_id,
            type(err).__name__,
        )
        return out
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            try:
                with open(client.download_artifacts(run_id, path, tmp)) as fh:
                    found = curve.read_items(json.load(fh))
            except (OSError, ValueError) as err:
                found = None
                log.warning("%s of run %s unreadable (%s)", path, run_id, err)
            if found is None or curve.items_artifact(found[0]) != path:
                log.warning("%s of run %s is not a sound record of per-item values; left out", path, run_id)
                continue
            out[found[0]] = found[1:]
    return out


def verdict_lines(rows: list[JobRow], *, window: int, max_usd_per_point: Optional[float]) -> list[str]:
    """``verdict <job>: continue|stop|change (<each metric's numbers>)`` for every job with benchmark points."""
    lines = []
    for r in rows:
        found = curve.job_verdict(r.bench, window=window, max_usd_per_point=max_usd_per_point)
        if found is not None:
            lines.append(f"verdict {r.job}: {found[0]} ({found[1]})")
    return lines


def bench_section(rows: list[JobRow], args, log_chart) -> None:
    """The verdicts and the chart of every job's benchmark score against its dollars (only with points)."""
    series = {f"{r.job} {key}": points for r in rows for key, points in r.bench.items() if points}
    if not series:
        return
    print(
        "\n" + "\n".join(verdict_lines(rows, window=args.plateau_evaluations, max_usd_per_point=args.max_usd_per_point))
    )
    drawn = curve.plot(series, args.bench_out)
    log_chart(args.bench_out, BENCH_CHART_ARTIFACT, table=bench_table(rows))
    print(f"benchmark chart of {drawn} evaluation(s): {args.bench_out}")


def bench_table(rows: list[JobRow]) -> dict[str, list]:
    """Every job's benchmark points as columns (job, metric, step, cost_usd, score, stderr): the table MLflow
    draws score against dollars from."""
    table: dict[str, list] = {"job": [], "metric": [], "step": [], "cost_usd": [], "score": [], "stderr": []}
    for r in rows:
        for key, points in r.bench.items():
            for p in points:
                for column, value in zip(table, (r.job, key, p.step, p.usd, p.value, p.stderr)):
                    table[column].append(value)
    return table


def format_table(rows: list[JobRow]) -> str:
    def cell(value, fmt="{}") -> str:
        return "-" if value is None else fmt.format(value)

    lines = [
        (
            r.job,
            r.recipe,
            r.model,
            r.status,
            cell(r.attempts),
            cell(r.preemptions),
            cell(r.cost_usd, "{:.2f}"),
            "-" if r.quality is None else f"{r.quality_metric}={r.quality:.3f}",
            cell(r.usd_per_point, "{:.3f}"),
            r.benchmarks,
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(COLUMNS)]
    out = ["  ".join(h.ljust(w) for h, w in zip(COLUMNS, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines]
    return "\n".join(out)


def plot_cost_vs_quality(rows: list[JobRow], out_path: str) -> int:
    """Write the scatter; returns how many jobs had both a cost and a quality to plot."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a training box or in CI
    import matplotlib.pyplot as plt

    points = [(r.cost_usd, r.quality, r) for r in rows if r.cost_usd is not None and r.quality is not None]
    fig, ax = plt.subplots(figsize=(7, 5))
    for cost, quality, r in points:
        ax.scatter(cost, quality)
        ax.annotate(f"{r.job} ({r.recipe})", (cost, quality), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel("cost (USD)")
    ax.set_ylabel("quality (each job's quality_metric)")
    ax.set_title("cost vs quality" if points else "cost vs quality (no job has both yet)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return len(points)


def _report_run_id(client, experiment: str, uri: str) -> tuple[str, str]:
    """(experiment id, run id) of the one report run of ``experiment``'s jobs, in ``<experiment>-reports``."""
    from orchestrator.tracking.run import ensure_experiment

    experiment_id = ensure_experiment(client, experiment + REPORTS_EXPERIMENT_SUFFIX, uri)
    found = client.search_runs([experiment_id], filter_string=f"tags.`{KIND_TAG}` = '{REPORT_KIND}'", max_results=1)
    if found:
        return experiment_id, found[0].info.run_id
    run = client.create_run(experiment_id, tags={KIND_TAG: REPORT_KIND}, run_name=REPORT_RUN_NAME)
    client.set_terminated(run.info.run_id)
    return experiment_id, run.info.run_id


def unreachable(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """Why an ``http(s)`` tracking URI's host does not accept a connection within ``timeout_s`` (None: it does,
    or the URI is not a server's)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
            return None
    except (OSError, ValueError) as err:
        return f"{type(err).__name__}: {err}"


def _open(uri: str, experiment: str):
    """(client, experiment) or the exit code of the error, printed."""
    from mlflow import MlflowClient

    from orchestrator.tracking.run import MLFLOW_HTTP_ENV_DEFAULTS

    why = unreachable(uri)
    if why is not None:
        return fail(
            f"cannot reach MLflow at {scrub_text(uri)} ({scrub_text(why)}). "
            "Check --tracking-uri or MLFLOW_TRACKING_URI."
        )
    for name, value in MLFLOW_HTTP_ENV_DEFAULTS.items():  # a server that answers, slowly, fails in seconds too
        os.environ.setdefault(name, value)
    try:
        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(experiment)
    except Exception as err:
        return fail(
            f"cannot reach MLflow at {scrub_text(uri)} ({type(err).__name__}). "
            "Check --tracking-uri or MLFLOW_TRACKING_URI."
        )
    if found is None:
        return fail(
            f"no experiment {experiment!r} at {scrub_text(uri)}. "
            "Pass --experiment with the name your jobs used (tracking.experiment)."
        )
    return client, found


def main(argv: Optional[list[str]] = None) -> int:
    parser = Parser(prog="orchestrator report", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tracking-uri", help="MLflow URI (default: $MLFLOW_TRACKING_URI, else ./.cache/mlflow SQLite)"
    )
    parser.add_argument(
        "--experiment", default=DEFAULT_EXPERIMENT, help=f"MLflow experiment (default: {DEFAULT_EXPERIMENT})"
    )
    parser.add_argument("--out", default="cost_vs_quality.png", help="where to write the chart")
    parser.add_argument(
        "--bench-out", default="bench_vs_usd.png", help="where to write the chart of benchmark score against dollars"
    )
    parser.add_argument(
        "--plateau-evaluations",
        type=_positive_int,
        default=curve.DEFAULT_WINDOW,
        metavar="K",
        help="verdict stop when the last K evaluations gain nothing beyond noise (default: 3)",
    )
    parser.add_argument(
        "--max-usd-per-point",
        type=float,
        default=None,
        metavar="USD",
        help="verdict stop when the last K evaluations cost more than this per point gained",
    )
    args = parser.parse_args(argv)

    from orchestrator.config.schema import TrackingConfig
    from orchestrator.tracking.run import resolve_tracking_uri

    # An explicit --tracking-uri beats the environment; otherwise the same rule as jobs use.
    uri = args.tracking_uri or resolve_tracking_uri(TrackingConfig())
    opened = _open(uri, args.experiment)
    if isinstance(opened, int):
        return opened
    client, experiment = opened
    from orchestrator.sweep.report import report_sweeps

    rows = collect_jobs(client, experiment.experiment_id, window=args.plateau_evaluations)
    sweep_lines, sweep_charts = report_sweeps(client, experiment.experiment_id, args.out)
    if not rows:
        print(f"no jobs in experiment {args.experiment!r} yet")
        return 0
    print(format_table(rows))
    plotted = plot_cost_vs_quality(rows, args.out)
    reports_id, run_id = _report_run_id(client, args.experiment, uri)

    def log_chart(path: str, name: str, table: Optional[dict] = None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            # Logged under a fixed name whatever --out says, so the report run holds one current chart.
            staged = os.path.join(tmp, name)
            shutil.copyfile(path, staged)
            client.log_artifact(run_id, staged)
        if table is not None:
            log_table(client, run_id, table, BENCH_TABLE_ARTIFACT)

    log_chart(args.out, CHART_ARTIFACT)
    for chart in sweep_charts:
        client.log_artifact(run_id, chart)
    if sweep_lines:
        print("\n" + "\n".join(sweep_lines))
    page = run_page_url(uri, reports_id, run_id)
    print(
        f"\nchart of {plotted} job(s): {args.out} (also logged to MLflow run {run_id!r}, named {REPORT_RUN_NAME!r}, "
        f"in the experiment {args.experiment + REPORTS_EXPERIMENT_SUFFIX!r}{': ' + page if page else ''})"
    )
    bench_section(rows, args, log_chart)
    return 0


def _positive_int(text: str) -> int:
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of evaluations of at least 1 (e.g. 3)")
    return int(text)


if __name__ == "__main__":
    sys.exit(main())
