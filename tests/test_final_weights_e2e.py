"""Where the final weights go, end to end: a real job (``python -m orchestrator.launch``), moto S3 storage
and a real ``mlflow server``.

``checkpoint.save_final_weights=false`` keeps them out of ``<storage>/<run>/final/``;
``tracking.log_final_weights=true`` puts them in the MLflow run under ``final_weights/``.
"""
from __future__ import annotations

import uuid

from mlflow import MlflowClient
from safetensors.torch import load_file

from tests import jobs


def test_final_weights_go_to_mlflow_and_not_to_storage_when_asked(s3_server, s3_bucket, mlflow_server, tmp_path):
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    experiment, run = f"final-{uuid.uuid4().hex[:8]}", "weights"
    overrides = jobs.with_overrides(
        jobs.FAST + storage.overrides(), "train.max_steps=10", f"run.name={run}", "tracking.enabled=true",
        f"tracking.uri={mlflow_server.uri}", f"tracking.experiment={experiment}",
        "checkpoint.save_final_weights=false", "tracking.log_final_weights=true")
    env = jobs.job_env(tmp_path)
    env.pop("MLFLOW_TRACKING_URI", None)
    done = jobs.run_job(overrides, tmp_path, env=env, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert jobs.ledger(storage, run)["status"] == "completed"
    assert storage.store().list(f"{run}/final/") == [], "checkpoint.save_final_weights=false still saved them"
    assert "final weights:" not in done.stdout

    client = MlflowClient(tracking_uri=mlflow_server.uri)
    (mlrun,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    logged = {a.path for a in client.list_artifacts(mlrun.info.run_id, "final_weights")}
    assert {"final_weights/adapter_model.safetensors", "final_weights/adapter_config.json"} <= logged, logged
    local = client.download_artifacts(mlrun.info.run_id, "final_weights/adapter_model.safetensors", str(tmp_path))
    tensors = load_file(local)
    assert tensors and all("lora_" in name for name in tensors), sorted(tensors)[:5]
