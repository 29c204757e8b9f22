"""``orchestrator eval <storage.uri>/<run.name>``: a finished job's committed checkpoints and final weights scored
from storage (base + adapter through the harness's ``peft=``), each result stored as it lands: a rerun evaluates
nothing, a SIGKILL mid-way and a rerun give the same scores as one uninterrupted pass."""
from __future__ import annotations

import collections
import json
import signal
import uuid

import pytest
from mlflow import MlflowClient

from tests.helpers import jobs

TRAIN = ["train.max_steps=10", "checkpoint.every=off", "checkpoint.every_steps=5", "checkpoint.keep_last=2"]
EVAL = ["eval.tasks=[tiny_arith_mc]", "eval.limit=40"]


def _eval_cmd(uri: str, tracking: list[str]) -> list[str]:
    return [jobs.PYTHON, "-m", "orchestrator.cli.main", "eval", f"{uri}/trained", *EVAL, *tracking]


def _results(root) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in root.glob("trained/bench/*/*.json") if p.stem != "progress"}


@pytest.mark.e2e
def test_eval_job_scores_each_checkpoint_once_and_a_sigkill_loses_only_the_one_in_flight(mlflow_server, tmp_path):
    runs, experiment = tmp_path / "runs", f"bench-job-{uuid.uuid4().hex[:8]}"
    tracking = ["tracking.enabled=true", f"tracking.uri={mlflow_server.uri}", f"tracking.experiment={experiment}"]
    fast = [o for o in jobs.FAST if not o.startswith(("checkpoint.every", "train.max_steps", "tracking.",
                                                      "train.logging_steps"))]
    env = jobs.job_env(tmp_path)
    env.pop("MLFLOW_TRACKING_URI", None)
    # logging steps 3, 6, 9: the training logs no cost_usd at checkpoint 5's step (the closing total at 10)
    done = jobs.run_job(fast + TRAIN + tracking + [f"storage.uri={runs}", "run.name=trained", "train.logging_steps=3"],
                        tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    # killed once its first result is stored (during the second): that one stays, the rerun does the other two
    log = tmp_path / "eval.log"
    proc = jobs.start_cmd(_eval_cmd(str(runs), tracking), tmp_path, log, env=env)  # forked from the warm zygote
    jobs.wait_for(lambda: proc.poll() is not None or "(step 5): tiny_arith_mc/acc=" in log.read_text(), 300,
                  "the first result")
    assert proc.poll() is None, log.read_text()[-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    first = jobs.run_cmd(_eval_cmd(str(runs), tracking), tmp_path, env=env, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "trained: 2 evaluated, 1 already done" in first.stdout, first.stdout[-2000:]
    results = _results(runs)
    assert sorted(r["step"] for r in results.values()) == [5, 10, 10], sorted(results)  # two checkpoints, final
    again = jobs.run_cmd(_eval_cmd(str(runs), tracking), tmp_path, env=env, timeout=600)
    assert again.returncode == 0 and "trained: 0 evaluated, 3 already done" in again.stdout, again.stdout[-2000:]

    # one uninterrupted pass from scratch gives the same scores
    scores = {name: r["scores"] for name, r in results.items()}
    for path in runs.glob("trained/bench/*/*.json"):
        path.unlink()
    clean = jobs.run_cmd(_eval_cmd(str(runs), tracking), tmp_path, env=env, timeout=600)
    assert clean.returncode == 0 and "trained: 3 evaluated" in clean.stdout, clean.stdout[-2000:]
    assert {name: r["scores"] for name, r in _results(runs).items()} == scores

    # the job's one MLflow run has each evaluated step once, through a kill and three reruns
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    for key in ("bench/tiny_arith_mc/acc", "bench/tiny_arith_mc/acc_stderr"):
        steps = collections.Counter(m.step for m in client.get_metric_history(run.info.run_id, key))
        assert steps == {5: 1, 10: 1}, (key, steps)
    values = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "bench/tiny_arith_mc/acc")}
    assert values == {r["step"]: r["scores"]["tiny_arith_mc"]["acc"]["value"] for r in results.values()}
    # cost_usd beside each point, once per step: the training's cost up to that checkpoint's commit (the
    # closing total at 10 is the training's own)
    costs = client.get_metric_history(run.info.run_id, "cost_usd")
    steps = collections.Counter(m.step for m in costs)
    assert steps[5] == 1 and steps[10] == 1, steps
    at = {m.step: m.value for m in costs}
    ledger = json.loads((runs / "trained" / "ledger.json").read_text())
    assert 0 < at[5] < at[10] == pytest.approx(ledger["attempts"][0]["cost_usd"]), (at, ledger["attempts"])
    from orchestrator.cli.report import _bench_points

    chart = _bench_points(client, client.get_run(run.info.run_id))["tiny_arith_mc/acc"]
    assert [(p.step, p.usd) for p in chart] == [(5, at[5]), (10, at[10])], chart  # the report's dollars for each
    # and each checkpoint's per-item values, which the report's verdict pairs over
    assert [len(p.items) for p in chart] == [40, 40] and sum(chart[0].items) / 40 == pytest.approx(chart[0].value)



@pytest.mark.e2e
def test_eval_job_is_billed_to_the_jobs_ledger_and_spend_index_and_a_spent_cap_refuses_it(tmp_path):
    runs = tmp_path / "runs"
    fast = [o for o in jobs.FAST if not o.startswith(("checkpoint.every", "train.max_steps"))]
    common = ["tracking.experiment=capped"]
    done = jobs.run_job(fast + TRAIN + common + [f"storage.uri={runs}", "run.name=trained"], tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    trained_cost = json.loads((runs / "trained" / "ledger.json").read_text())["cost_usd"]

    cmd = [jobs.PYTHON, "-m", "orchestrator.cli.main", "eval", f"{runs}/trained", "eval.tasks=[tiny_arith_mc]",
           "eval.limit=20", *common]
    first = jobs.run_cmd(cmd, tmp_path, env=jobs.job_env(tmp_path), timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "trained: 3 evaluated, 0 already done, 0 unusable; $" in first.stdout, first.stdout[-2000:]
    ledger = json.loads((runs / "trained" / "ledger.json").read_text())
    (bill,) = ledger["evaluations"]
    assert bill["status"] == "completed" and bill["evaluated"] == 3 and bill["cost_usd"] > 0, bill
    assert ledger["cost_usd"] == pytest.approx(trained_cost + bill["cost_usd"])  # the job's cost counts it
    assert [a["exit_class"] for a in ledger["attempts"]] == ["completed"]  # no training attempt was taken over
    index = json.loads((runs / "_spend" / "index.json").read_text())
    charged = index["jobs"]["trained:eval"]
    assert charged["experiment"] == "capped" and charged["open"] == {}, charged
    assert sum(charged["months"].values()) == pytest.approx(bill["cost_usd"])

    # run.deadline passed: another task set evaluates nothing, says what is left, and exits 0 (nothing to requeue)
    late = [o for o in cmd if not o.startswith("eval.limit")] + ["eval.limit=7", "run.deadline=2020-01-01T00:00:00"]
    stopped = jobs.run_cmd(late, tmp_path, env=jobs.job_env(tmp_path), timeout=600)
    assert stopped.returncode == 0, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    assert ("trained: 0 evaluated, 0 already done, 0 unusable, 3 left: run.deadline=2020-01-01T00:00:00 reached"
            in stopped.stdout), stopped.stdout[-2000:]
    assert len(list(runs.glob("trained/bench/*/"))) == 1  # nothing stored for the late task set
    bills = json.loads((runs / "trained" / "ledger.json").read_text())["evaluations"]
    assert [b["status"] for b in bills] == ["completed", "deadline"], bills

    # the experiment's cap is already spent (training and evaluation together): another task set is refused
    capped = [o for o in cmd if not o.startswith("eval.limit")] + ["eval.limit=10", "budget.experiment_max_usd=0.000001"]
    refused = jobs.run_cmd(capped, tmp_path, env=jobs.job_env(tmp_path), timeout=600)
    assert refused.returncode == 3, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "orchestrator eval of 'trained' not started:" in refused.stderr and "capped" in refused.stderr, refused.stderr
    assert len(list(runs.glob("trained/bench/*/"))) == 1  # nothing evaluated for the new task set


@pytest.mark.e2e
def test_eval_job_without_the_jobs_overrides_scores_the_jobs_own_model(tmp_path):
    """Issue 44.11: ``orchestrator eval <uri>/<run> 'eval.tasks=[...]'`` without restating a job's model loaded
    the default tiny model under the job's adapter and crashed with a PEFT size-mismatch traceback. The job's
    checkpoints hold its config: the evaluation scores its model; another model is refused with one message."""
    runs = tmp_path / "runs"
    fast = [o for o in jobs.FAST if not o.startswith(("checkpoint.every", "train.max_steps"))]
    model = ["model.hidden_size=32", "model.num_layers=1"]
    done = jobs.run_job(fast + TRAIN + model + [f"storage.uri={runs}", "run.name=trained"], tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    cmd = [jobs.PYTHON, "-m", "orchestrator.cli.main", "eval", f"{runs}/trained", "eval.tasks=[tiny_arith_mc]",
           "eval.limit=10"]
    scored = jobs.run_cmd(cmd, tmp_path, env=jobs.job_env(tmp_path), timeout=600)
    assert scored.returncode == 0, scored.stdout[-3000:] + scored.stderr[-3000:]
    assert "trained: 3 evaluated, 0 already done, 0 unusable" in scored.stdout, scored.stdout[-2000:]
    refused = jobs.run_cmd(cmd + ["model.hidden_size=64"], tmp_path, env=jobs.job_env(tmp_path), timeout=600)
    assert refused.returncode == 4, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "job 'trained' was trained on model.hidden_size=32" in refused.stderr and "Traceback" not in refused.stderr
