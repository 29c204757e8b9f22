"""A sweep in a real MLflow server: one parent run, a nested child run per trial (each trial's own job run),
best-so-far against cumulative dollars on the parent, the trial table and the decisions as its artifacts; a
rerun of the same command resumes the parent, makes no second one; `orchestrator report` charts the sweep's score
against dollars. Issue 22's proof: a 4 x 4 grid (16 children) of 2-step trials of the tiny model, four at once; the
parent's dollars never fall and its best-so-far only improves, point by point."""
from __future__ import annotations

import json
import uuid

import mlflow.artifacts
import pytest
from mlflow import MlflowClient

from tests.helpers import jobs

pytestmark = pytest.mark.e2e

GRID = ["-m", "train.learning_rate=1e-3,2e-3,3e-3,5e-3", "recipe.lora_r=2,4,8,16", "sweep.budget_usd=2",
        "sweep.max_parallel=4", "sweep.metric=eval_loss", "train.max_steps=2", "train.logging_steps=1",
        "data.num_examples=40", "checkpoint.every=off", "checkpoint.every_steps=2", "preemption.provider=none",
        "train.eval_at_end=false", "tracking.enabled=true"]
N = 16


def test_a_sweep_is_one_parent_run_with_a_child_run_per_trial(mlflow_server, tmp_path):
    name = f"sw-{uuid.uuid4().hex[:6]}"
    cmd = jobs.launch_cmd(GRID + [f"sweep.name={name}", f"storage.uri={tmp_path / 'runs'}",
                                  f"run.work_dir={tmp_path / 'work'}", f"tracking.uri={mlflow_server.uri}"])
    env = jobs.job_env(tmp_path)
    env.pop("MLFLOW_TRACKING_URI", None)
    for _ in range(2):  # the second launch resumes the finished sweep: nothing runs, no run is made
        done = jobs.run_cmd(cmd, tmp_path, env=env, timeout=1500)  # forked from the warm zygote, as jobs are
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
    assert sorted(r.data.tags["job"] for r in children) == sorted(f"{name}-t{k}" for k in range(N))
    assert all(r.data.tags.get("mlflow.parentRunId") == parent.info.run_id for r in children)

    best = sorted(client.get_metric_history(parent.info.run_id, "best_eval_loss"), key=lambda m: m.step)
    spent_points = client.get_metric_history(parent.info.run_id, "spent_usd")
    spent = {m.step: m.value for m in spent_points}
    assert len(spent) == len(spent_points)  # one point per step: no step holds two figures
    assert best and all(m.step in spent for m in best)  # each best-so-far point has its dollars beside it
    dollars = [spent[s] for s in sorted(spent)]
    assert dollars == sorted(dollars) and 0 < dollars[-1] <= 2.0, dollars  # cumulative dollars never fall
    curve = [m.value for m in best]
    assert curve == sorted(curve, reverse=True), curve  # eval_loss is minimized: the best so far only falls
    trial_losses = [t["values"]["0"] for t in state["trials"]]
    assert len(trial_losses) == N and curve[-1] == pytest.approx(min(trial_losses))
    assert len(set(curve)) > 1  # the leader changed as trials reported, charted against the dollars then

    folder = mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, artifact_path="sweep",
                                                 dst_path=str(tmp_path / "art"), tracking_uri=mlflow_server.uri)
    table = json.loads(open(f"{folder}/trials.json").read())
    assert [t["run_name"] for t in table["trials"]] == [f"{name}-t{k}" for k in range(N)]
    assert all(t["status"] == "completed" and t["spent_usd"] > 0 for t in table["trials"])
    decisions = json.loads(open(f"{folder}/decisions.json").read())["decisions"]
    assert sorted(d["trial"] for d in decisions) == list(range(N))

    # orchestrator report: the sweep's score-against-dollars chart, beside the jobs' table (the parent is no job)
    out = tmp_path / "report.png"
    report = jobs.run_cmd([jobs.PYTHON, "-m", "orchestrator", "report", "--tracking-uri", mlflow_server.uri,
                           "--experiment", name, "--out", str(out)], tmp_path, env=env, timeout=300)
    assert report.returncode == 0, report.stdout + report.stderr
    line = next(x for x in report.stdout.splitlines() if x.startswith(f"sweep {name}: best eval_loss="))
    assert f"{min(trial_losses):.4f}" in line and f"${dollars[-1]:.4f}" in line
    assert (tmp_path / f"report_sweep_{name}.png").stat().st_size > 1000
    assert not any(x.startswith(name + " ") for x in report.stdout.splitlines())  # the table: trials only
