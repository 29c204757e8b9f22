"""`orchestrator report` on a sweep's parent run: one line per sweep, and its best-so-far score against dollars as
a chart beside --out; the parent is not listed as a job. MLflow's own SQLite store (no server)."""
from __future__ import annotations

import time

from mlflow import MlflowClient
from mlflow.entities import Metric

from orchestrator.cli import report
from orchestrator.sweep.report import sweep_curves


def test_report_charts_each_sweeps_score_against_dollars(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("lr", artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(experiment, tags={"sweep": "lr", "orchestrator.kind": "sweep"}, run_name="lr").info.run_id
    child = client.create_run(experiment, tags={"job": "lr-t0", "mlflow.parentRunId": parent, "quality_metric": "q"},
                              run_name="lr-t0").info.run_id
    client.log_batch(child, metrics=[Metric("cost_usd", 0.5, 0, 0), Metric("q", 0.5, 0, 0)], synchronous=True)
    now = int(time.time() * 1000)
    points = [(1, 0.10, 2.5), (2, 0.25, 2.1), (3, 0.40, 2.1), (4, 0.90, 1.7)]  # step, spent_usd, best_eval_loss
    for step, usd, best in points:
        client.log_batch(parent, metrics=[Metric("spent_usd", usd, now, step), Metric("best_eval_loss", best, now, step),
                                          Metric("best_trial", 1, now, step)], synchronous=True)

    [curve] = sweep_curves(client, experiment)
    assert (curve.name, curve.metric) == ("lr", "eval_loss")
    assert curve.points == [(usd, best) for _, usd, best in points]

    out = tmp_path / "report.png"
    assert report.main(["--tracking-uri", uri, "--experiment", "lr", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"sweep lr: best eval_loss=1.7000 after $0.9000 (4 points); chart {tmp_path / 'report_sweep_lr.png'}" in printed
    assert (tmp_path / "report_sweep_lr.png").stat().st_size > 1000
    rows = [line.split()[0] for line in printed.splitlines()[1:] if line and not line.startswith(("sweep", "chart"))]
    assert rows == ["lr-t0"]  # the sweep's parent run is not a job row
