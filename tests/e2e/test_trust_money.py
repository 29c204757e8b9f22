"""Money told truthfully (issue 20): what a job reports saving, and what its start-up is billed."""
from __future__ import annotations

import json
import uuid

import pytest
from mlflow import MlflowClient

from orchestrator.attempt.reporting import RUN_NOTE_TAG
from tests.helpers import jobs


@pytest.mark.e2e
def test_an_on_demand_job_with_a_price_override_reports_no_spot_savings(mlflow_server, tmp_path):
    """compute=cpu is on-demand; its catalog rate is $0.10/h, the override $3600/h. Against the catalog's rate the
    job "saved" about minus its whole cost; it saved nothing, since it never ran on spot."""
    experiment, run = f"money-{uuid.uuid4().hex[:8]}", "on-demand-override"
    fast = [o for o in jobs.FAST if not o.startswith(("tracking.", "train.max_steps"))]
    done = jobs.run_job(fast + [f"storage.uri={tmp_path / 'runs'}", f"run.name={run}", "train.max_steps=10",
                                "compute=cpu", "compute.price_per_hour=3600", "tracking.enabled=true",
                                f"tracking.uri={mlflow_server.uri}", f"tracking.experiment={experiment}"],
                        tmp_path, env={k: v for k, v in jobs.job_env(tmp_path).items() if k != "MLFLOW_TRACKING_URI"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "spot savings: none (an on-demand job)" in done.stdout, done.stdout[-3000:]
    assert "negative: spot cost more" not in done.stdout

    client = MlflowClient(tracking_uri=mlflow_server.uri)
    exp = client.get_experiment_by_name(experiment)
    [mlrun] = client.search_runs([exp.experiment_id], filter_string=f"tags.job = '{run}'")
    assert "cost/spot_savings_usd" not in mlrun.data.metrics and "cost/gpu_hours" in mlrun.data.metrics, mlrun.data.metrics
    assert "none (an on-demand job)" in mlrun.data.tags[RUN_NOTE_TAG], mlrun.data.tags[RUN_NOTE_TAG]
    path = client.download_artifacts(mlrun.info.run_id, "cost_report.json", str(tmp_path))
    with open(path) as f:
        report = json.load(f)
    assert report["spot"]["savings_usd"] is None and report["spot"]["ran_on_spot"] is False, report["spot"]
    # the override is the price the job pays and would pay on demand: one rate, not the catalog's $0.10/h
    assert report["price"]["on_demand_usd_per_hour"] == report["price"]["usd_per_hour"] == 3600, report["price"]
    assert report["totals"]["cost_usd"] > 0


@pytest.mark.e2e
def test_the_start_up_before_the_first_step_is_billed_from_the_process_start(tmp_path):
    """At $1 per second (compute.price_per_hour=3600 on the cpu preset) an attempt's cost in dollars is the seconds
    it was billed. The restart split times the start-up from the process's start (imports included) to the end of
    the first step; a meter started after the imports billed less than that start-up alone."""
    fast = [o for o in jobs.FAST if not o.startswith("train.max_steps")]
    run = "billed-from-start"
    storage = jobs.Storage(str(tmp_path / "runs"))
    done = jobs.run_job(fast + storage.overrides() + [f"run.name={run}", "train.max_steps=3", "train.eval_at_end=false",
                                                      "checkpoint.save_final_weights=false", "compute=cpu",
                                                      "compute.price_per_hour=3600"], tmp_path,
                       fresh=True)  # a fresh interpreter: its imports are the start-up billed here
    assert done.returncode == 0, done.stderr[-3000:]
    [attempt] = jobs.ledger(storage, run)["attempts"]
    startup_s = attempt["extra"]["restart"]["total_s"]
    billed_s = attempt["cost_usd"]  # $1 per second
    assert startup_s > 1.0, attempt["extra"]["restart"]
    assert billed_s >= startup_s, (f"billed {billed_s:.2f}s, but the start-up alone (process start to the first "
                                   f"step) took {startup_s:.2f}s", attempt["extra"]["restart"])


def test_an_on_demand_price_override_is_the_on_demand_baseline_and_a_spot_one_is_not():
    from orchestrator.config.schema import ComputeConfig
    from orchestrator.money.cost import load_catalog, price_for

    catalog = load_catalog()
    on_demand = price_for(ComputeConfig(gpu_type="a100-80gb", gpus_per_node=2, spot=False, price_per_hour=2.0), catalog)
    assert on_demand.usd_per_hour_total == on_demand.on_demand_usd_per_hour_total == pytest.approx(4.0)
    spot = price_for(ComputeConfig(gpu_type="a100-80gb", gpus_per_node=2, spot=True, cloud="aws", price_per_hour=1.0), catalog)
    listed = price_for(ComputeConfig(gpu_type="a100-80gb", gpus_per_node=2, spot=False, cloud="aws"), catalog)
    assert spot.usd_per_hour_total == pytest.approx(2.0)
    assert spot.on_demand_usd_per_hour_total == pytest.approx(listed.usd_per_hour_total)  # the catalog's rate
