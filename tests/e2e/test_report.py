"""`orchestrator report` against a real MLflow server: the table lists every job, the chart is written and logged."""
from __future__ import annotations

import json
import time
import uuid

import pandas
import pytest

from mlflow import MlflowClient

from orchestrator.cli import report
from orchestrator.config.schema import TrackingConfig
from orchestrator.tracking.run import JobTracker

SAME_ITEMS = {"harness_version": "0.4.9", "task_hash": "ab12cd34", "seed": 1234}  # both points scored these


def _job(uri, experiment, name, recipe, quality_metric, quality, cost, preemptions, usd_per_point=None):
    tracker = JobTracker(
        TrackingConfig(uri=uri, experiment=experiment),
        job_name=name,
        tags={"recipe": recipe, "model": "qwen2.5-0.5b", "quality_metric": quality_metric},
    )
    tracker.start()
    metrics = {quality_metric: quality, "cost_usd": cost, "attempts": preemptions + 1, "preemptions": preemptions}
    if usd_per_point is not None:  # as a job logs it: its cost over the points gained since before training
        metrics["usd_per_quality_point"] = usd_per_point
    tracker.log_metrics(metrics, step=100)
    assert tracker.close()


@pytest.mark.e2e
@pytest.mark.mlflow
@pytest.mark.mlflow
def test_report_lists_jobs_and_logs_the_chart(mlflow_server, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    experiment = f"report-{uuid.uuid4().hex[:8]}"
    _job(mlflow_server.uri, experiment, "sft-run", "sft", "eval_accuracy", 0.80, 4.0, 2, usd_per_point=4.0 / 50)
    _job(mlflow_server.uri, experiment, "dpo-run", "dpo", "eval_reward_accuracy", 0.65, 1.3, 0)
    out = tmp_path / "chart.png"
    argv = ["--tracking-uri", mlflow_server.uri, "--experiment", experiment, "--out", str(out)]

    assert report.main(argv) == 0
    table = capsys.readouterr().out
    lines = {line.split()[0]: line for line in table.splitlines() if line.strip()}
    assert {"sft-run", "dpo-run"} <= set(lines)
    assert "eval_accuracy=0.800" in lines["sft-run"] and "4.00" in lines["sft-run"]
    assert "0.080" in lines["sft-run"]  # $4.00 / 50 points gained (0.30 -> 0.80), not / 80
    # a job that logged no gain (no "before" value) has no price per point
    assert "eval_reward_accuracy=0.650" in lines["dpo-run"] and lines["dpo-run"].split()[-1] == "-"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "View run" not in table  # MLflow's own link, without the training view; the report's has it
    assert f"-reports': {mlflow_server.uri}/#/experiments/" in table and "?workflowType=machine_learning" in table

    # A second report reuses the one "report" run, in an experiment of its own: it is never among the jobs.
    assert report.main(argv) == 0
    assert "report " not in capsys.readouterr().out.split("\n\n")[0]
    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name(experiment)
    assert sorted(r.info.run_name for r in client.search_runs([exp.experiment_id])) == ["dpo-run", "sft-run"]
    reports = client.get_experiment_by_name(f"{experiment}-reports")
    assert reports.tags["mlflow.experimentKind"] == "custom_model_development"  # MLflow's training view
    report_runs = client.search_runs([reports.experiment_id])
    assert [r.info.run_name for r in report_runs] == [report.REPORT_RUN_NAME]
    assert [a.path for a in client.list_artifacts(report_runs[0].info.run_id)] == ["cost_vs_quality.png"]


def test_a_wrong_tracking_uri_fails_within_seconds_naming_it(capsys, monkeypatch):
    from tests.helpers.net import free_port

    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    uri = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    assert report.main(["--tracking-uri", uri, "--experiment", "any"]) == 2
    assert time.monotonic() - started < 10
    assert uri in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.mlflow
def test_unknown_experiment_says_how_to_fix_it(mlflow_server, capsys):
    assert report.main(["--tracking-uri", mlflow_server.uri, "--experiment", "no-such-experiment"]) == 2
    assert "--experiment" in capsys.readouterr().err


def _bench_job(uri, experiment, name, scores, cost_per_eval=0.01, stderr=0.03):
    """A job's run as the in-job evaluation logs it: the base at step 0, each checkpoint's score with its
    stderr and ``cost_usd`` at the same step; ``cost_usd`` also at other steps (the training's own logs)."""
    tracker = JobTracker(TrackingConfig(uri=uri, experiment=experiment), job_name=name,
                         tags={"recipe": "sft", "model": "tiny", "quality_metric": "eval_accuracy"})
    tracker.start()
    for i, acc in enumerate(scores):
        metrics = {"bench/tiny_arith_mc/acc": acc, "bench/tiny_arith_mc/acc_stderr": stderr}
        if i:
            tracker.log_metrics({"cost_usd": cost_per_eval * i - 0.005}, step=10 * i - 5)
            metrics["cost_usd"] = cost_per_eval * i
        tracker.log_metrics(metrics, step=10 * i)
    assert tracker.close()


@pytest.mark.e2e
@pytest.mark.mlflow
def test_report_gives_each_job_a_verdict_with_its_numbers_and_charts_score_against_dollars(
        mlflow_server, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    experiment = f"verdict-{uuid.uuid4().hex[:8]}"
    _bench_job(mlflow_server.uri, experiment, "gaining", [0.30, 0.45, 0.60, 0.75])
    _bench_job(mlflow_server.uri, experiment, "flat", [0.30, 0.50, 0.52, 0.51, 0.53])
    _bench_job(mlflow_server.uri, experiment, "hurting", [0.60, 0.50, 0.40])
    bench = tmp_path / "bench.png"
    argv = ["--tracking-uri", mlflow_server.uri, "--experiment", experiment, "--out", str(tmp_path / "c.png"),
            "--bench-out", str(bench)]

    assert report.main(argv) == 0
    out = capsys.readouterr().out
    verdicts = {line.split()[1].rstrip(":"): line for line in out.splitlines() if line.startswith("verdict ")}
    assert verdicts == {
        "gaining": "verdict gaining: continue (tiny_arith_mc/acc: +45.0+-8.3 points over the last 3 evaluation(s) "
                   "(steps 0-30: 0.300 -> 0.750, from the two standard errors) for $0.0300: $0.0007/pt, still "
                   "gaining beyond noise)",
        "flat": "verdict flat: stop (tiny_arith_mc/acc: +3.0+-8.3 points over the last 3 evaluation(s) "
                "(steps 10-40: 0.500 -> 0.530, from the two standard errors) for $0.0300: flat within noise)",
        "hurting": "verdict hurting: change (tiny_arith_mc/acc: -20.0+-8.3 points against the base (0.600 -> 0.400, "
                   "from the two standard errors) after $0.0200: worse beyond noise)",
    }
    assert "benchmark chart of 12 evaluation(s)" in out and bench.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name(f"{experiment}-reports")
    (report_run,) = client.search_runs([exp.experiment_id])
    assert sorted(a.path for a in client.list_artifacts(report_run.info.run_id)) == [
        "bench_vs_usd.json", "bench_vs_usd.png", "cost_vs_quality.png"]
    # the score against dollars also as a table MLflow draws itself (a chart of its own in the run's view)
    assert {"path": "bench_vs_usd.json", "type": "table"} in json.loads(
        client.get_run(report_run.info.run_id).data.tags["mlflow.loggedArtifacts"])
    table = pandas.read_json(client.download_artifacts(report_run.info.run_id, "bench_vs_usd.json", str(tmp_path)),
                             orient="split")
    gaining = table[table["job"] == "gaining"]
    assert list(gaining["cost_usd"]) == pytest.approx([0.0, 0.01, 0.02, 0.03])
    assert list(gaining["score"]) == pytest.approx([0.30, 0.45, 0.60, 0.75])

    # a threshold on dollars per point stops the job still gaining; the table is replaced, not appended to
    assert report.main(argv + ["--max-usd-per-point", "0.0005"]) == 0
    assert "verdict gaining: stop (" in capsys.readouterr().out
    again = pandas.read_json(client.download_artifacts(report_run.info.run_id, "bench_vs_usd.json",
                                                       str(tmp_path / "again")), orient="split")
    assert len(again) == len(table) == 12


def _items_job(uri, experiment, name, runs, *, items: bool):
    """A job's run with the base (step 0) and one checkpoint (step 10), each with its per-item values (the
    ``bench/items/`` artifacts an in-job evaluation and ``orchestrator eval`` log) when ``items``."""
    from orchestrator.evaluation import curve

    tracker = JobTracker(TrackingConfig(uri=uri, experiment=experiment), job_name=name,
                         tags={"recipe": "sft", "model": "tiny", "quality_metric": "eval_accuracy"})
    tracker.start()
    for step, values in runs:
        n, mean = len(values), sum(values) / len(values)
        stderr = (sum((v - mean) ** 2 for v in values) / (n - 1) / n) ** 0.5
        tracker.log_metrics({"bench/tiny_arith_mc/acc": mean, "bench/tiny_arith_mc/acc_stderr": stderr,
                             **({"cost_usd": 0.01} if step else {})}, step=step)
        if items:
            tracker.log_dict_artifact(curve.items_payload(step, {"tiny_arith_mc": {"acc": values}}, SAME_ITEMS),
                                      curve.items_artifact(step))
    assert tracker.close()


@pytest.mark.e2e
@pytest.mark.mlflow
def test_the_verdict_is_paired_over_the_same_items_where_the_run_holds_them(mlflow_server, tmp_path, capsys,
                                                                             monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    experiment = f"paired-{uuid.uuid4().hex[:8]}"
    # the checkpoint is right on the base's 30 items and 10 more: +10 points, +-13.2 unpaired, +-5.9 paired
    runs = [(0, [1.0] * 30 + [0.0] * 70), (10, [1.0] * 40 + [0.0] * 60)]
    _items_job(mlflow_server.uri, experiment, "with-items", runs, items=True)
    _items_job(mlflow_server.uri, experiment, "scores-only", runs, items=False)
    argv = ["--tracking-uri", mlflow_server.uri, "--experiment", experiment, "--out", str(tmp_path / "c.png"),
            "--bench-out", str(tmp_path / "b.png"), "--plateau-evaluations", "1"]

    assert report.main(argv) == 0
    verdicts = {line.split()[1].rstrip(":"): line for line in capsys.readouterr().out.splitlines()
                if line.startswith("verdict ")}
    assert verdicts == {
        "with-items": "verdict with-items: continue (tiny_arith_mc/acc: +10.0+-5.9 points over the last 1 "
                      "evaluation(s) (steps 0-10: 0.300 -> 0.400, paired over 100 items) for $0.0100: $0.0010/pt, "
                      "still gaining beyond noise)",
        "scores-only": "verdict scores-only: stop (tiny_arith_mc/acc: +10.0+-13.2 points over the last 1 "
                       "evaluation(s) (steps 0-10: 0.300 -> 0.400, from the two standard errors) for $0.0100: flat "
                       "within noise)",
    }

    # per-item values edited into something unsound are left out: that verdict falls back to the standard errors
    from orchestrator.evaluation import curve

    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([exp.experiment_id], filter_string="tags.job = 'with-items'")
    bad = tmp_path / "step_000000010.json"
    bad.write_text('{"step": 10, "samples": {"tiny_arith_mc": {"acc": ["1"]}}}')
    client.log_artifact(run.info.run_id, str(bad), curve.ITEMS_FOLDER)
    assert report.main(argv) == 0
    out = capsys.readouterr()
    assert "verdict with-items: stop (tiny_arith_mc/acc: +10.0+-13.2 points" in out.out, out.out


@pytest.mark.e2e
@pytest.mark.mlflow
def test_only_the_compared_evaluations_per_item_values_are_downloaded(mlflow_server, monkeypatch):
    """A job with six evaluations and a verdict over the last 2: the report downloads the per-item values of the
    base, the last and the one 2 before it (the points the verdict pairs), not all six; the verdict is paired."""
    from orchestrator.evaluation import curve

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    experiment = f"few-items-{uuid.uuid4().hex[:8]}"
    runs = [(10 * i, [1.0] * (30 + 5 * i) + [0.0] * (70 - 5 * i)) for i in range(6)]
    _items_job(mlflow_server.uri, experiment, "six-evals", runs, items=True)
    client = MlflowClient(mlflow_server.uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    fetched = []
    download = client.download_artifacts
    monkeypatch.setattr(client, "download_artifacts", lambda run_id, path, dst: fetched.append(path) or download(
        run_id, path, dst))

    (points,) = report._bench_points(client, run, window=2).values()
    assert sorted(fetched) == [curve.items_artifact(s) for s in (0, 30, 50)], fetched
    assert [p.items is not None for p in points] == [True, False, False, True, False, True]
    assert "paired over 100 items" in curve.judge(points, window=2).reason


def test_a_run_logged_before_the_metric_sections_is_still_read(tmp_path, monkeypatch):
    from mlflow.entities import Metric

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("old", artifact_location=(tmp_path / "art").as_uri())
    run = client.create_run(experiment, tags={"job": "old-job", "quality_metric": "eval_accuracy"}).info.run_id
    client.log_batch(run, metrics=[Metric(k, v, 0, 10) for k, v in {
        "cost_usd": 2.0, "attempts": 3, "preemptions": 2, "eval_accuracy": 0.7, "usd_per_quality_point": 0.1}.items()],
                     synchronous=True)
    (row,) = report.collect_jobs(client, experiment)
    assert (row.attempts, row.preemptions, row.cost_usd, row.quality, row.usd_per_point) == (3, 2, 2.0, 0.7, 0.1)
