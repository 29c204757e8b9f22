"""The finished job in MLflow, end to end: a real job (``python -m orchestrator.launch``), moto S3 storage, a real
``mlflow server``, and the run page rendered by headless Chromium.

One job serves both tests (a module fixture; the tests share an xdist group, so they run on one worker):
- ``checkpoint.save_final_weights=false`` keeps the weights out of ``<storage>/<run>/final/``;
  ``tracking.log_final_weights=true`` makes them the MLflow run's logged model.
- The run page the job links to opens in MLflow's model-training view and shows the run's cost and quality
  metrics, its description (the cost summary), its training data with the dataset fingerprint, and its commit;
  its Artifacts tab shows the benchmark chart (``bench/score_vs_usd.png``) as an image the browser decoded.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow import MlflowClient
from safetensors.torch import load_file

from tests.helpers import browser, jobs

pytestmark = pytest.mark.xdist_group("final-weights-job")
# where the run page's screenshot is copied, when set (for a person to look at)
SCREENSHOT_ENV = "ORCH_UI_SCREENSHOT"
# in the page: the chart's <img> once decoded, its natural size, and the share of its pixels painted (opaque)
# and inked (darker than the white ground), read back through a canvas
CHART_PIXELS = """(() => {
  const i = [...document.images].find(i => i.alt === 'bench/score_vs_usd.png' && i.complete && i.naturalWidth > 0);
  if (!i) return null;
  const c = document.createElement('canvas');
  c.width = i.naturalWidth; c.height = i.naturalHeight;
  const g = c.getContext('2d'); g.drawImage(i, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  let painted = 0, ink = 0;
  for (let k = 0; k < d.length; k += 4) {
    if (d[k + 3] === 255) painted++;
    if (d[k + 3] > 0 && d[k] + d[k + 1] + d[k + 2] < 600) ink++;
  }
  const n = d.length / 4;
  return {size: [c.width, c.height], painted: painted / n, ink: ink / n};
})()"""


@dataclass
class FinishedJob:
    storage: jobs.Storage
    run: str
    experiment: str
    overrides: list
    log: str
    client: MlflowClient
    tmp: Path

    def mlflow_run(self):
        exp = self.client.get_experiment_by_name(self.experiment)
        (mlrun,) = self.client.search_runs([exp.experiment_id])
        return exp, mlrun


@pytest.fixture(scope="module")
def finished_job(s3_server, mlflow_server, tmp_path_factory) -> FinishedJob:
    tmp = tmp_path_factory.mktemp("final-weights")
    bucket = f"orch-test-{uuid.uuid4().hex[:16]}"
    s3_server.client().create_bucket(Bucket=bucket)
    storage = jobs.Storage(f"s3://{bucket}/runs", s3_server.endpoint_url)
    experiment, run = f"final-{uuid.uuid4().hex[:8]}", "weights"
    overrides = jobs.with_overrides(
        jobs.FAST + storage.overrides(), "train.max_steps=10", f"run.name={run}", "tracking.enabled=true",
        f"tracking.uri={mlflow_server.uri}", f"tracking.experiment={experiment}",
        "checkpoint.save_final_weights=false", "tracking.log_final_weights=true",
        # the base and the final weights scored on 20 items: the run page's benchmark metric and chart
        "eval.tasks=[tiny_arith_mc]", "eval.limit=20")
    env = jobs.job_env(tmp)
    env.pop("MLFLOW_TRACKING_URI", None)
    done = jobs.run_job(overrides, tmp, env=env, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    return FinishedJob(storage, run, experiment, overrides, log, MlflowClient(tracking_uri=mlflow_server.uri), tmp)


@pytest.mark.e2e
@pytest.mark.mlflow
def test_final_weights_go_to_mlflow_as_the_runs_logged_model_and_not_to_storage(finished_job, mlflow_server):
    job = finished_job
    assert jobs.ledger(job.storage, job.run)["status"] == "completed"
    assert job.storage.store().list(f"{job.run}/final/") == [], "checkpoint.save_final_weights=false still saved them"
    assert "final weights:" not in job.log

    exp, mlrun = job.mlflow_run()
    models = [m for m in job.client.search_logged_models([exp.experiment_id]) if m.source_run_id == mlrun.info.run_id]
    assert [(m.name, str(m.status)) for m in models] == [("final-adapter", "READY")], models
    assert [o.model_id for o in mlrun.outputs.model_outputs] == [models[0].model_id]
    logged = {f.path for f in job.client.list_logged_model_artifacts(models[0].model_id)}
    assert {"adapter_model.safetensors", "adapter_config.json", "config.yaml"} <= logged, logged
    import mlflow.artifacts

    local = mlflow.artifacts.download_artifacts(f"{models[0].artifact_location}/adapter_model.safetensors",
                                                dst_path=str(job.tmp / "model"), tracking_uri=mlflow_server.uri)
    tensors = load_file(local)
    assert tensors and all("lora_" in name for name in tensors), sorted(tensors)[:5]

    # each evaluation's per-item values (the base at 0, the final weights at 10), which the report pairs over
    from orchestrator.cli.report import _bench_points
    from orchestrator.evaluation import curve

    items = sorted(a.path for a in job.client.list_artifacts(mlrun.info.run_id, curve.ITEMS_FOLDER))
    assert items == [curve.items_artifact(0), curve.items_artifact(10)], items
    base, final = _bench_points(job.client, mlrun)["tiny_arith_mc/acc"]
    assert len(base.items) == len(final.items) == 20 and sum(final.items) / 20 == pytest.approx(final.value)
    assert "paired over 20 items" in curve.judge([base, final]).reason


@pytest.mark.browser
@pytest.mark.e2e
@pytest.mark.mlflow
def test_the_run_page_shows_cost_quality_dataset_and_commit_in_a_real_browser(finished_job):
    from orchestrator.app.compose import compose_config
    from recipes.data import fingerprint, load_datasets

    job = finished_job
    exp, mlrun = job.mlflow_run()
    # what the job hands a person: the link in its log and in the closing report
    links = set(re.findall(r"MLflow run page: (\S+)", job.log))
    assert len(links) == 1, links
    url = links.pop()
    assert url.endswith(f"/#/experiments/{exp.experiment_id}/runs/{mlrun.info.run_id}?workflowType=machine_learning")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"

    # the facts behind the page, through MLflow's API
    train, _ = load_datasets(compose_config([o for o in job.overrides if o.startswith("data.")]).data, "sft")
    data_fp = fingerprint(train)
    (data_input,) = mlrun.inputs.dataset_inputs
    assert (data_input.dataset.name, data_input.dataset.digest) == ("synthetic-arithmetic", data_fp[:36])
    assert {t.key: t.value for t in data_input.tags} == {"mlflow.data.context": "train"}
    assert mlrun.data.tags["dataset_fingerprint"] == data_fp
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=jobs.REPO, capture_output=True, text=True).stdout.strip()
    assert mlrun.data.tags["mlflow.source.git.commit"] == head
    metrics = mlrun.data.metrics
    assert metrics["cost_usd"] > 0 and 0 <= metrics["eval_accuracy"] <= 1, metrics
    note = mlrun.data.tags["mlflow.note.content"]
    assert f"${metrics['cost_usd']:,.4f}" in note and f"eval_accuracy = {metrics['eval_accuracy']:.4f}" in note, note

    # the page as Chromium renders it
    shot = job.tmp / "mlflow-run.png"
    text = browser.render(url, shot)
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copyfile(shot, os.environ[SCREENSHOT_ENV])
    # the model-training view (its side bar: Runs, Models, Model registry), not the GenAI one (Judges, Evaluation runs)
    assert "Model registry" in text and "Judges" not in text and "Evaluation runs" not in text, text[:1500]
    # cost and quality (a 10-step job gains no accuracy, so it has no USD per point: that is over the gain)
    for key in ("cost_usd", "cost/usd_per_step", "eval_accuracy", "eval_perplexity", "score", "score_gain_points"):
        assert re.search(rf"(?<![\w/]){key} [-0-9.e]+", text), f"metric {key} not shown with a value: {text[:3000]}"
    assert f"synthetic-arithmetic ({data_fp[:36]}) train" in text.replace("Train", "train"), text[:3000]
    assert "completed at step 10 after 1 attempt(s)" in text and f"cost ${metrics['cost_usd']:,.4f}" in text
    assert f"orchestrator.worker {head[:7]}" in text, text[:3000]  # the source and its commit
    assert "final-adapter Ready" in text, text[:3000]  # the logged model
    # the benchmark score with its error on the run page, and the chart of score against dollars among its artifacts
    for key in ("bench/tiny_arith_mc/acc", "bench/tiny_arith_mc/acc_stderr"):
        assert re.search(rf"{re.escape(key)} [0-9.e-]+", text), f"metric {key} not shown with a value: {text[:3000]}"
    charts = [a.path for a in job.client.list_artifacts(mlrun.info.run_id, "bench") if a.path.endswith(".png")]
    assert charts == ["bench/score_vs_usd.png"], charts
    png = Path(job.client.download_artifacts(mlrun.info.run_id, charts[0], str(job.tmp / "chart"))).read_bytes()
    size = list(struct.unpack(">II", png[16:24]))  # the PNG's IHDR: width, height

    # the chart itself on the run page (its Artifacts tab, the chart selected), drawn by the browser: MLflow's
    # image view fetches the artifact and shows it as an <img alt="<path>">; polled, so a slow server only waits
    chart_url = url.replace("?", f"/artifacts/{charts[0]}?", 1)
    with browser.Page(chart_url) as page:
        shown = page.wait_for(CHART_PIXELS, what="the benchmark chart on the run page")
        page.screenshot(job.tmp / "mlflow-chart.png")
    # the whole chart the job drew, decoded by the browser: every pixel painted (a truncated PNG leaves rows
    # blank), lines and text on a white ground
    assert shown["size"] == size and shown["painted"] == 1.0 and 0.01 < shown["ink"] < 0.5, (shown, size)
