"""Benchmark scores of checkpoints in real jobs: moto's S3 server, a real MLflow server, the tiny model and the
shipped task ``tiny_arith_mc``.

A job evaluating every 2nd commit is SIGKILLed twice (the second kill lands in or next to an evaluation): its one
MLflow run has ``bench/tiny_arith_mc/acc`` at exactly the evaluated steps (and the base at 0), once each, with
``cost_usd`` beside them; its final score equals an uninterrupted twin's. The twin finds the base model's cached
result edited in storage, refuses it, evaluates the base again and gets the same score.
"""
from __future__ import annotations

import collections
import json
import random
import signal
import uuid

import pytest
from mlflow import MlflowClient

from tests.helpers import jobs

EVAL = ["eval.tasks=[tiny_arith_mc]", "eval.every=2", "eval.limit=40", "checkpoint.every=off",
        "checkpoint.every_steps=5", "train.max_steps=30"]  # 30: room for the second kill after a resume


def _overrides(storage: jobs.Storage, mlflow_uri: str, experiment: str, run: str) -> list[str]:
    fast = [o for o in jobs.FAST if not o.startswith(("tracking.", "checkpoint.every", "train.max_steps"))]
    return fast + storage.overrides() + EVAL + [
        f"run.name={run}", "tracking.enabled=true", f"tracking.uri={mlflow_uri}", f"tracking.experiment={experiment}"]


def _results(store, run: str) -> dict[str, dict]:
    keys = [k for k in store.list(f"{run}/bench/") if k.endswith(".json") and not k.endswith("progress.json")]
    return {k.rsplit("/", 1)[1][:-5]: json.loads(store.get_bytes(k)) for k in keys}


def _base_key(store) -> str:
    keys = [k for k in store.list("_bench/") if k.endswith("/base.json")]
    assert len(keys) == 1, keys
    return keys[0]


@pytest.mark.e2e
def test_bench_points_at_the_evaluated_steps_once_each_across_sigkills(s3_server, s3_bucket, mlflow_server, tmp_path):
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    store, experiment = storage.store(), f"bench-{uuid.uuid4().hex[:8]}"
    env = jobs.job_env(tmp_path)
    env.pop("MLFLOW_TRACKING_URI", None)
    rc, log, _ = jobs.interrupt_then_finish(_overrides(storage, mlflow_server.uri, experiment, "killed"), tmp_path,
                                            storage, "killed", random.Random("bench"), [signal.SIGKILL, signal.SIGKILL],
                                            env=env)
    assert rc == 0, log[-4000:]
    assert [a["exit_class"] for a in jobs.ledger(storage, "killed")["attempts"]] == ["vanished", "vanished", "completed"]
    results = _results(store, "killed")
    # checkpoints 10, 20 and 30 (every 2nd of every 5 steps; names carry the attempt's fence) and the final weights
    assert sorted(r["step"] for name, r in results.items() if name != "final") == [10, 20, 30], sorted(results)
    final_manifest = json.loads(store.get_bytes("killed/final/manifest.json"))
    assert results["final"]["step"] == final_manifest["step"] == 30
    expected = {0: 1, **{r["step"]: 1 for r in results.values()}}

    client = MlflowClient(tracking_uri=mlflow_server.uri)
    exp = client.get_experiment_by_name(experiment)
    (mlrun,) = client.search_runs([exp.experiment_id], filter_string="tags.job = 'killed'")
    history = collections.Counter(m.step for m in client.get_metric_history(mlrun.info.run_id, "bench/tiny_arith_mc/acc"))
    assert history == expected, history  # the base at 0, each evaluated checkpoint and the final weights once
    stderr_steps = sorted(m.step for m in client.get_metric_history(mlrun.info.run_id, "bench/tiny_arith_mc/acc_stderr"))
    assert stderr_steps == sorted(expected), stderr_steps
    cost_steps = collections.Counter(m.step for m in client.get_metric_history(mlrun.info.run_id, "cost_usd"))
    assert cost_steps[10] == 1 and cost_steps[20] == 1, cost_steps
    assert mlrun.data.tags["bench_harness_version"] == "0.4.13" and mlrun.data.tags["bench_tasks"] == "tiny_arith_mc"
    # the final gain over the base with its interval, once, at the final step; the verdict in the job's output
    gains = client.get_metric_history(mlrun.info.run_id, "bench_gain/tiny_arith_mc/acc_interval")
    assert [m.step for m in gains] == [results["final"]["step"]] and gains[0].value > 0, gains
    assert "benchmark tiny_arith_mc/acc: " in log
    # the chart of score against dollars, redrawn at each new point under one name across the restarts
    charts = [a.path for a in client.list_artifacts(mlrun.info.run_id, "bench") if a.path.endswith(".png")]
    assert charts == ["bench/score_vs_usd.png"], charts
    png = client.download_artifacts(mlrun.info.run_id, "bench/score_vs_usd.png", str(tmp_path / "chart"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    text = client.download_artifacts(mlrun.info.run_id, "cost_report.txt", str(tmp_path / "a"))
    assert "benchmark evaluation (this attempt, not training):" in open(text).read()

    # an uninterrupted twin: the base's cached score edited in storage is refused, evaluated again, identical
    key = _base_key(store)
    base = json.loads(store.get_bytes(key))
    edited = json.loads(json.dumps(base))
    edited["scores"]["tiny_arith_mc"]["acc"]["value"] = 0.99
    store.put_bytes(key, json.dumps(edited).encode())
    done = jobs.run_job(_overrides(storage, mlflow_server.uri, experiment, "calm"), tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"benchmark result {key} ignored (its content does not match its hash" in done.stdout + done.stderr
    assert json.loads(store.get_bytes(key))["scores"] == base["scores"]
    calm = _results(store, "calm")
    assert calm["final"]["scores"] == results["final"]["scores"], (calm["final"]["scores"], results["final"]["scores"])
    at_10 = [r for r in results.values() if r["step"] == 10]
    assert [r["samples"] for r in calm.values() if r["step"] == 10] == [at_10[0]["samples"]]


@pytest.mark.e2e
def test_a_shared_base_score_stored_as_a_string_is_evaluated_again_not_a_crash_of_every_job(tmp_path):
    """Issue 41: a score stored as a string in the shared ``_bench/<key>/base.json`` (its digest recomputed)
    crashed every job on that model and task set at train begin, retried as a crash. The job now refuses that
    result with a warning naming it, evaluates the base again and completes."""
    import hashlib

    from orchestrator.app.compose import compose_config
    from orchestrator.evaluation import spec
    from orchestrator.evaluation.watch import base_key

    runs = tmp_path / "runs"
    overrides = [o for o in jobs.FAST if not o.startswith(("checkpoint.every", "train.max_steps"))] + [
        "eval.tasks=[tiny_arith_mc]", "eval.every=0", "eval.limit=10", "checkpoint.every=off",
        "checkpoint.every_steps=0", "train.max_steps=4", f"storage.uri={runs}", "run.name=victim"]
    cfg = compose_config(overrides)
    tasks = spec.resolve(cfg.eval)
    body = {"version": 1, "checkpoint": "base", "step": 0, "manifest_sha256": f"base:{base_key(cfg, tasks)}",
            "harness_version": tasks.harness_version, "task_hash": tasks.config_hash, "seed": int(cfg.eval.seed),
            "scores": {"tiny_arith_mc": {"acc": {"value": "0.35", "stderr": 0.1}}}, "samples": {},
            "seconds": 1.0, "cost_usd": None}
    body["sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    key = runs / "_bench" / base_key(cfg, tasks) / "base.json"
    key.parent.mkdir(parents=True)
    key.write_text(json.dumps(body))
    done = jobs.run_job(overrides, tmp_path, env=jobs.job_env(tmp_path), timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "score tiny_arith_mc/acc is '0.35', not a finite number" in done.stdout + done.stderr
    assert isinstance(json.loads(key.read_text())["scores"]["tiny_arith_mc"]["acc"]["value"], float)
