"""Held-out quality end to end: a real job on chat-format data, a real ``mlflow server``.

The SFT quality metric is the exact match of the whole answer (the user's data: ``recipe.eval_metric=auto``
picks ``exact_match``, not the built-in task's first-number matcher); it is measured before training
(the Trainer's ``eval_on_start``), every ``train.eval_steps`` as curves in MLflow, and at the end; USD
per quality point is the job's cost over the points gained since before training.
"""
from __future__ import annotations

import json
import random
import uuid

import pytest
from mlflow import MlflowClient

from tests.helpers import jobs


def _chat_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"messages": [{"role": "user", "content": f"{a} + {b} ="},
                                  {"role": "assistant", "content": str(a + b)}]})
    return rows


@pytest.mark.e2e
@pytest.mark.mlflow
def test_chat_data_quality_rises_with_training_and_usd_per_point_counts_the_gain(mlflow_server, tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _chat_rows(400, seed=5)))
    storage = jobs.Storage(str(tmp_path / "runs"))
    experiment, run = f"quality-{uuid.uuid4().hex[:8]}", "chat-quality"
    overrides = [o for o in jobs.FAST if not o.startswith(("tracking.", "train.max_steps", "data."))] + [
        "data=jsonl", f"data.path={data}", "train.max_steps=120", "train.eval_steps=40", f"run.name={run}",
        "tracking.enabled=true", f"tracking.uri={mlflow_server.uri}", f"tracking.experiment={experiment}",
    ] + storage.overrides()
    env = jobs.job_env(tmp_path, {"ORCH_STEP_DELAY_SECONDS": "0"})
    env.pop("MLFLOW_TRACKING_URI", None)
    result = jobs.run_job(overrides, tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    quality = jobs.ledger(storage, run)["quality"]
    before, after = quality["eval_accuracy_before"], quality["eval_accuracy"]
    assert before < after, quality  # the whole answer, exactly: the metric moves with training

    client = MlflowClient(tracking_uri=mlflow_server.uri)
    exp = client.get_experiment_by_name(experiment)
    (mlrun,) = client.search_runs([exp.experiment_id], filter_string=f"tags.job = '{run}'")
    assert mlrun.data.tags["quality_metric"] == "eval_accuracy"
    curve = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, "eval_accuracy")}
    assert sorted(curve) == [0, 40, 80, 120], curve  # before, every train.eval_steps, the end
    assert curve[0] == pytest.approx(before) and curve[120] == pytest.approx(after)
    for key in ("eval_loss", "eval_perplexity"):
        steps = [m.step for m in client.get_metric_history(mlrun.info.run_id, key)]
        assert {0, 40, 80, 120} <= set(steps), (key, steps)

    cost = mlrun.data.metrics["cost_usd"]
    per_point = mlrun.data.metrics["usd_per_point"]
    assert per_point == pytest.approx(cost / ((after - before) * 100))
    assert per_point != pytest.approx(cost / (after * 100))  # not over the absolute value
    assert "before training: " in result.stdout and "points); $" in result.stdout
