"""A sweep in a real MLflow server: one parent run, a nested child run per trial (each trial's own job run),
best-so-far against cumulative dollars on the parent, the trial table and the decisions as its artifacts; a
rerun of the same command resumes the parent, makes no second one; `orchestrator report` charts the sweep's score
against dollars. Kept small: a 2 x 2 grid of 4-step trials,
two at once."""
from __future__ import annotations

import json
import subprocess
import uuid

import mlflow.artifacts
import pytest
from mlflow import MlflowClient

from tests.helpers import jobs

pytestmark = pytest.mark.e2e

GRID = ["-m", "train.learning_rate=1e-3,3e-3", "recipe.lora_r=4,8", "sweep.budget_usd=2", "sweep.max_parallel=2",
        "sweep.metric=eval_loss", "train.max_steps=4", "train.logging_steps=2", "data.num_examples=80",
        "checkpoint.every=off", "checkpoint.every_steps=2", "preemption.provider=none", "train.eval_at_end=false",
        "tracking.enabled=true"]


def test_a_sweep_is_one_parent_run_with_a_child_run_per_trial(mlflow_server, tmp_path):
    name = f"sw-{uuid.uuid4().hex[:6]}"
    cmd = jobs.launch_cmd(GRID + [f"sweep.name={name}", f"storage.uri={tmp_path / 'runs'}",
                                  f"run.work_dir={tmp_path / 'work'}", f"tracking.uri={mlflow_server.uri}"])
    env = jobs.job_env(tmp_path)
    env.pop("MLFLOW_TRACKING_URI", None)
    for _ in range(2):  # the second launch resumes the finished sweep: nothing runs, no run is made
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    client = MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name(name)  # tracking.experiment defaults to the sweep's name
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("sweep") == name]
    assert len(parents) == 1, [r.data.tags for r in runs]
    parent = parents[0]
    state = json.loads((tmp_path / "runs" / name / "sweep.json").read_text())
    assert state["mlflow_run_id"] == parent.info.run_id and parent.info.status == "FINISHED"
    children = [r for r in runs if r is not parent]
    assert sorted(r.data.tags["job"] for r in children) == [f"{name}-t{k}" for k in range(4)]
    assert all(r.data.tags.get("mlflow.parentRunId") == parent.info.run_id for r in children)

    best = client.get_metric_history(parent.info.run_id, "best_eval_loss")
    spent = {m.step: m.value for m in client.get_metric_history(parent.info.run_id, "spent_usd")}
    assert best and all(m.step in spent for m in best)  # each best-so-far point has its dollars beside it
    dollars = [spent[s] for s in sorted(spent)]
    assert dollars == sorted(dollars) and 0 < dollars[-1] <= 2.0
    trial_losses = [t["values"]["0"] for t in state["trials"]]
    assert max(best, key=lambda m: m.step).value == pytest.approx(min(trial_losses))

    folder = mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, artifact_path="sweep",
                                                 dst_path=str(tmp_path / "art"), tracking_uri=mlflow_server.uri)
    table = json.loads(open(f"{folder}/trials.json").read())
    assert [t["run_name"] for t in table["trials"]] == [f"{name}-t{k}" for k in range(4)]
    assert all(t["status"] == "completed" and t["spent_usd"] > 0 for t in table["trials"])
    decisions = json.loads(open(f"{folder}/decisions.json").read())["decisions"]
    assert sorted(d["trial"] for d in decisions) == [0, 1, 2, 3]

    # orchestrator report: the sweep's score-against-dollars chart, beside the jobs' table (the parent is no job)
    out = tmp_path / "report.png"
    report = subprocess.run([jobs.PYTHON, "-m", "orchestrator", "report", "--tracking-uri", mlflow_server.uri,
                             "--experiment", name, "--out", str(out)], env=env, capture_output=True, text=True,
                            timeout=300)
    assert report.returncode == 0, report.stdout + report.stderr
    line = next(x for x in report.stdout.splitlines() if x.startswith(f"sweep {name}: best eval_loss="))
    assert f"{min(trial_losses):.4f}" in line and f"${dollars[-1]:.4f}" in line
    assert (tmp_path / f"report_sweep_{name}.png").stat().st_size > 1000
    assert not any(x.startswith(name + " ") for x in report.stdout.splitlines())  # the table: trials only
