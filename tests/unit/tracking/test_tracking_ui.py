"""What a user sees of a job in MLflow's own UI: the metrics in sections, the headline figures at the top
level, the verdict in the description, the committed checkpoints as a table, system metrics on a GPU job.

Against a local SQLite store (the same MlflowClient calls as against a server), so no server is started."""
from __future__ import annotations

import json
import logging
import re
import types
import uuid

import pytest
from mlflow import MlflowClient

from orchestrator.attempt.reporting import AttemptTracking
from orchestrator.config.schema import TrackingConfig
from orchestrator.money.cost import Price
from orchestrator.tracking.run import JobTracker
from orchestrator.records.ledger_record import LedgerRecord


@pytest.fixture
def store_uri(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _tracker(uri: str, **tags) -> JobTracker:
    tracker = JobTracker(TrackingConfig(uri=uri, experiment=f"ui-{uuid.uuid4().hex[:8]}"), job_name="job-a",
                         tags={"quality_metric": "eval_accuracy", **tags})
    tracker.start()
    return tracker


def _money() -> types.SimpleNamespace:
    price = Price(usd_per_hour_total=2.0, usd_per_gpu_hour=2.0, on_demand_usd_per_hour_total=4.0, spot=True, cloud="aws", gpus=1,
                  source="test")
    return types.SimpleNamespace(price=price, figures=types.SimpleNamespace(tokens_per_step=100.0,
                                                                           measured_tokens_per_step=None))


def _close(tracking: AttemptTracking, **extra) -> None:
    ledger = LedgerRecord.decode({"step": 60, "attempts": [{"fence": 1, "exit_class": "completed", "cost_usd": 1.5}]},
                                 "job-a/ledger.json")
    figures = {"cost_usd": 1.5, "attempts": 1, "preemptions": 0, "gpu_hours": 0.75, "step_time_s": 0.2,
               "attempt_checkpoint_stall_s": 0.1}
    tracking.close_with_report(job="job-a", step=60, status="completed", tracker_status="FINISHED", ledger=ledger,
                               figures=figures, money=_money(), quality_metric="eval_accuracy", quality=0.8,
                               quality_before=0.5, config_yaml="a: 1\n", **extra)


def test_the_jobs_own_metrics_sit_in_sections_and_the_headline_figures_at_the_top(store_uri, capsys):
    tracker = _tracker(store_uri)
    tracking = AttemptTracking(tracker)
    tracking.on_trainer_log({"loss": 1.2, "learning_rate": 1e-4, "eval_loss": 0.9}, 10, closing=False,
                            job_figures=lambda closing: {"step_time_s": 0.2, "peak_memory_bytes": 10,
                                                         "cost_usd": 0.5, "usd_per_step": 0.05})
    tracking.log_metrics({"restart_total_s": 3.0, "checkpoint_interval_s": 60.0}, 10)
    _close(tracking)
    metrics = MlflowClient(store_uri).get_run(tracker.run_id).data.metrics
    # the Trainer's keep TRL's names; ours are grouped
    assert {"loss", "learning_rate", "eval_loss"} <= set(metrics)
    assert {"ops/step_time_s", "ops/peak_memory_bytes", "ops/restart_total_s", "ops/checkpoint_interval_s",
            "ops/attempts", "ops/preemptions", "ops/attempt_checkpoint_stall_s", "cost/usd_per_step",
            "cost/gpu_hours"} <= set(metrics), sorted(metrics)
    assert not {"step_time_s", "gpu_hours", "attempts", "usd_per_quality_point"} & set(metrics), sorted(metrics)
    # the headline: the final cost, the score, what a point of it cost
    assert metrics["cost_usd"] == pytest.approx(1.5)
    assert metrics["score"] == pytest.approx(0.8)
    assert metrics["score_gain_points"] == pytest.approx(30.0)
    assert metrics["usd_per_point"] == pytest.approx(1.5 / 30)


def _job_cfg(gpus: int, system_metrics) -> tuple:
    cfg = types.SimpleNamespace(recipe=types.SimpleNamespace(name="sft"), model=types.SimpleNamespace(name_or_path="m"),
                                compute=types.SimpleNamespace(gpu_type="h100" if gpus else "none", gpus_per_node=gpus,
                                                              spot=True))
    return cfg, TrackingConfig(experiment=f"ui-{uuid.uuid4().hex[:8]}", log_system_metrics=system_metrics,
                               system_metrics_every="1s")


@pytest.mark.parametrize("gpus,setting,sampled", [(1, None, True), (0, None, False), (1, False, False),
                                                  (0, True, True)])
def test_system_metrics_are_on_for_a_gpu_job_unless_turned_off(store_uri, monkeypatch, gpus, setting, sampled):
    import time

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)
    cfg, tracking_cfg = _job_cfg(gpus, setting)
    tracking = AttemptTracking.from_config(cfg, tracking_cfg, main=True, run_name="job-a", ledger={}, params={},
                                           quality_metric="eval_accuracy", job_metrics_every_s=0)
    tracking.start()
    client = MlflowClient(store_uri)
    deadline = time.monotonic() + (15 if sampled else 0)
    while True:
        logged = [k for k in client.get_run(tracking.tracker.run_id).data.metrics if k.startswith("system/")]
        if logged or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    tracking.close("FINISHED")
    assert bool(logged) == sampled, logged
    assert (tracking.tracker._system_monitor is not None) == sampled


def test_the_description_carries_the_verdict_and_the_checkpoints_are_a_table(store_uri, tmp_path, capsys):
    from tests.helpers.bench import result

    tracker = _tracker(store_uri)
    checkpoints = [{"step": 20, "fence": 1, "time": 1765000000.0, "size": 1000, "key": "job-a/checkpoints/a"},
                   {"step": 40, "fence": 2, "time": 1765000060.0, "size": 2000, "key": "job-a/checkpoints/b"}]
    records = [result(s, cost_usd=0.01 * i, scores={"tiny": {"acc": {"value": v, "stderr": 0.03}}})
               for i, (s, v) in enumerate([(0, 0.30), (20, 0.45), (40, 0.60), (60, 0.75)])]  # the result store's
    ledger = LedgerRecord.decode({"step": 60, "checkpoints": checkpoints,
                                  "attempts": [{"fence": 1, "exit_class": "preempted", "cost_usd": 0.5},
                                               {"fence": 2, "exit_class": "completed", "cost_usd": 1.0}]},
                                 "job-a/ledger.json")
    AttemptTracking(tracker).close_with_report(
        job="job-a", step=60, status="completed", tracker_status="FINISHED", ledger=ledger,
        figures={"cost_usd": 1.5, "attempts": 2, "preemptions": 1}, money=_money(), quality_metric="eval_accuracy",
        quality=0.8, quality_before=0.5, config_yaml="a: 1\n", bench_records=records)
    client = MlflowClient(store_uri)
    run = client.get_run(tracker.run_id)
    note = run.data.tags["mlflow.note.content"]
    assert "| verdict | continue: tiny/acc: +45.0" in note, note
    assert run.data.tags["verdict"] == "continue"
    assert {"path": "checkpoints.json", "type": "table"} in json.loads(run.data.tags["mlflow.loggedArtifacts"])
    # the score against dollars as a table MLflow draws (beside the chart's PNG)
    scores = json.loads(open(client.download_artifacts(tracker.run_id, "bench/score_vs_usd.json",
                                                       str(tmp_path))).read())
    assert scores["columns"] == ["metric", "step", "cost_usd", "score", "stderr"]
    assert scores["data"] == [["tiny/acc", s, pytest.approx(usd), v, 0.03] for s, usd, v in
                              [(0, 0.0, 0.30), (20, 0.01, 0.45), (40, 0.02, 0.60), (60, 0.03, 0.75)]]
    assert {"path": "bench/score_vs_usd.json", "type": "table"} in json.loads(
        run.data.tags["mlflow.loggedArtifacts"])
    table = json.loads(open(client.download_artifacts(tracker.run_id, "checkpoints.json", str(tmp_path))).read())
    assert table["columns"] == ["step", "fence", "time", "size_bytes", "path"]
    assert table["data"] == [[20, 1, "2025-12-06T05:46:40Z", 1000, "job-a/checkpoints/a"],
                             [40, 2, "2025-12-06T05:47:40Z", 2000, "job-a/checkpoints/b"]]


@pytest.mark.e2e
@pytest.mark.mlflow
def test_the_only_run_link_printed_opens_the_training_view(mlflow_server, monkeypatch, capfd):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", raising=False)
    tracker = JobTracker(TrackingConfig(uri=mlflow_server.uri, experiment=f"ui-{uuid.uuid4().hex[:8]}"),
                         job_name="job-a")
    tracker.start()
    tracker.close()
    printed = capfd.readouterr()
    # MLflow's own "View run ... at" link has no view in it: MLflow 3.17 would open it in its GenAI view
    links = re.findall(r"/runs/\w+\S*", printed.out + printed.err)
    assert all(link.endswith("?workflowType=machine_learning") for link in links), printed
    assert tracker.run_url().endswith("?workflowType=machine_learning")
    experiment = MlflowClient(mlflow_server.uri).get_experiment(tracker.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_a_gpu_job_without_nvidia_ml_py_is_told_its_gpu_is_not_sampled(monkeypatch, caplog):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pynvml" else real(name, *a))
    cfg, tracking_cfg = _job_cfg(1, None)
    with caplog.at_level(logging.WARNING):
        AttemptTracking.from_config(cfg, tracking_cfg, main=True, run_name="job-a", ledger={}, params={},
                                    quality_metric="eval_accuracy", job_metrics_every_s=0)
    assert "pip install nvidia-ml-py" in caplog.text
