"""The plan prices interruptions: on-demand for a short job on volatile capacity with a slow restart, spot for a
long one on calm capacity, with the numbers behind each (``orchestrator plan --json`` and the printed plan)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.planning.spot import CapacityOption, recommend
from tests.helpers.plans import run_plan
from tests.helpers.paths import REPO

ROOT = REPO
JOB = ["model=llama-3.1-8b", "recipe=qlora", "compute=l40s-spot"]
FIELDS = {"gpu_type", "capacity", "expected_wall_hours", "expected_preemptions", "expected_lost_work_hours",
          "restart_overhead_hours", "checkpoint_overhead_hours", "expected_cost_usd", "cost_per_useful_step_usd",
          "restart_seconds", "restart_source"}


def _by(doc: dict, gpu: str) -> dict:
    return {o["capacity"]: o for o in doc["options"] if o["gpu_type"] == gpu}


@pytest.mark.e2e
def test_short_job_on_volatile_capacity_with_a_slow_restart_is_cheaper_on_demand(tmp_path):
    done = run_plan(*JOB, "train.max_steps=5000", "compute.preemptions_per_hour=2", "compute.restart_seconds=900",
                 f"storage.uri={tmp_path}", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    rec = doc["recommendation"]
    assert rec["capacity"] == "on_demand" and "on-demand is cheaper for this job" in rec["reason"]
    assert all(FIELDS <= set(o) for o in doc["options"])
    pair = _by(doc, rec["gpu_type"])
    spot, od = pair["spot"], pair["on_demand"]
    assert spot["restart_seconds"] == 900 and spot["restart_source"] == "compute.restart_seconds"
    assert spot["expected_preemptions"] > 2 and od["expected_preemptions"] == 0
    assert spot["expected_lost_work_hours"] > 0 and od["expected_lost_work_hours"] == 0
    assert spot["expected_wall_hours"] > 2 * od["expected_wall_hours"]
    assert od["expected_cost_usd"] < spot["expected_cost_usd"]
    # the hourly price alone says spot (less than half of on-demand's): the interruptions reverse it
    assert spot["usd_per_hour"] < 0.5 * od["usd_per_hour"]


@pytest.mark.e2e
def test_an_on_demand_job_that_says_how_often_it_is_preempted_is_priced_so(tmp_path):
    done = run_plan(*JOB, "compute.spot=false", "train.max_steps=5000", "compute.preemptions_per_hour=2",
                 f"storage.uri={tmp_path}", "--json")
    assert done.returncode == 0, done.stderr
    od = _by(json.loads(done.stdout), "l40s")["on_demand"]
    assert od["preemptions_per_hour"] == 2.0 and od["expected_preemptions"] > 0 and od["expected_lost_work_hours"] > 0


@pytest.mark.e2e
def test_long_job_on_calm_capacity_is_cheaper_on_spot_and_the_plan_prints_why(tmp_path):
    args = [*JOB, "train.max_steps=500000", "compute.preemptions_per_hour=0.2", f"storage.uri={tmp_path}"]
    doc = json.loads(run_plan(*args, "--json").stdout)
    rec = doc["recommendation"]
    assert rec["capacity"] == "spot"
    spot, od = _by(doc, rec["gpu_type"])["spot"], _by(doc, rec["gpu_type"])["on_demand"]
    assert spot["expected_preemptions"] > 1 and spot["expected_cost_usd"] < od["expected_cost_usd"]
    assert spot["cost_per_useful_step_usd"] == pytest.approx(spot["expected_cost_usd"] / 500000)
    text = run_plan(*args).stdout
    assert "interruptions priced" in text and f"recommendation: spot on {rec['gpu_type']}" in text


def test_recommendation_when_spot_never_finishes():
    never = CapacityOption("t4", "spot", 0.2, 1.0, None, None, 9.0, None, 900, "compute.restart_seconds", None, 600, 2,
                           None, None, None)
    od = CapacityOption("t4", "on_demand", 0.5, 1.0, 1.1, 0, 0.0, 0, 900, "compute.restart_seconds", 0.25, 3600, 2,
                        0.0, 0.55, 0.001)
    rec = recommend([never, od])
    assert rec["capacity"] == "on_demand" and "leave no time to train" in rec["reason"]


@pytest.mark.e2e
def test_the_jobs_own_history_sets_the_restart_and_the_rate(tmp_path, monkeypatch):
    """A job with attempts in its ledger: the plan's restart is their measured median, and its spot rate moves
    from the prior toward what the job saw (four preemptions in two hours of training)."""
    from orchestrator.planning import plan
    from orchestrator.app.compose import compose_config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    attempts = [{"fence": i + 1, "started_at": 1000.0 * i, "ended_at": 1000.0 * i + 1800 + 300, "exit_class": cls,
                 "spot": True, "extra": {"start_to_first_step_s": first}}
                for i, (cls, first) in enumerate([("vanished", 300), ("preempted", 200), ("vanished", 400),
                                                  ("vanished", 300)])]
    (tmp_path / "runs" / "hist").mkdir(parents=True)
    cfg = compose_config([*JOB, "train.max_steps=5000", f"storage.uri={tmp_path / 'runs'}", "run.name=hist"])
    trained = {"attempts": attempts, "repro": {"model_input": f"{cfg.model.name_or_path}@0123abc"}}
    (tmp_path / "runs" / "hist" / "ledger.json").write_text(json.dumps(trained))
    doc = json.loads(plan.plan_text(cfg, as_json=True))
    spot = next(o for o in doc["options"] if o["capacity"] == "spot")
    assert spot["restart_source"] == "measured" and spot["restart_seconds"] == 300
    # the same run.name's ledger of another model (the tiny demo's, under the default name) is not this job's
    (tmp_path / "runs" / "hist" / "ledger.json").write_text(json.dumps(dict(trained, repro={"model_input": "builtin:tiny-llama"})))
    other = next(o for o in json.loads(plan.plan_text(cfg, as_json=True))["options"] if o["capacity"] == "spot")
    assert other["restart_source"] == "estimated"
    (tmp_path / "runs" / "hist" / "ledger.json").write_text(json.dumps(trained))
    from orchestrator.money.cost import DEFAULT_SPOT_PREEMPTIONS_PER_HOUR as prior

    # Gamma-Poisson: (0.44/h prior x 4 h + 4 preemptions) / (4 h + 2 h of training) = 0.96/h
    assert spot["preemptions_per_hour"] == pytest.approx((prior * 4 + 4) / 6, rel=1e-3)


def test_the_plan_reads_the_jobs_history_without_waiting_out_a_storage_outage(monkeypatch):
    """The plan is advice: its read of the ledger is not retried for storage.retry_for (a dry run with an
    unreachable bucket used to wait two minutes before printing)."""
    from orchestrator import storage
    from orchestrator.app.compose import compose_config
    from orchestrator.planning import spot
    from orchestrator.storage.retry import RetryingStore

    opened = []
    real = storage.store_from_config
    monkeypatch.setattr(storage, "store_from_config", lambda c, **kw: opened.append(real(c, **kw)) or opened[-1])
    cfg = compose_config(["storage.uri=/nonexistent/runs"])
    assert spot.job_history(cfg) == ([], [])
    assert opened and not isinstance(opened[-1], RetryingStore)
