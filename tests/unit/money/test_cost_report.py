"""The job's cost figures and cost report: arithmetic over the ledger's attempts, no servers."""
from __future__ import annotations

import pytest

from orchestrator.money.cost import Price
from orchestrator.money.report import (
    JobFigures,
    build_report,
    format_report,
    quality_gain_points,
    usd_per_quality_point,
)
from orchestrator.records.ledger_record import LedgerRecord

SPOT = Price(usd_per_hour_total=3.6, usd_per_gpu_hour=3.6, on_demand_usd_per_hour_total=10.8, source="test", gpus=1,
             spot=True)
PRIOR = [  # killed at step 30 after a checkpoint at 20, then preempted cleanly at 50
    {"fence": 1, "exit_class": "vanished", "started_at": 0.0, "last_seen": 100.0, "ended_at": 100.0,
     "checkpoint_step_at_start": 0, "step_end": 30, "cost_usd": 0.1, "gpus": 1},
    {"fence": 2, "exit_class": "preempted", "started_at": 200.0, "ended_at": 300.0,
     "checkpoint_step_at_start": 20, "step_end": 50, "cost_usd": 0.1, "gpus": 1},
]


def decoded(ledger: dict) -> LedgerRecord:
    """A test's ledger as the worker hands it to the figures and the report: decoded."""
    return LedgerRecord.decode(ledger, "test")


def _figures(**kw):
    return JobFigures(SPOT, decoded({"attempts": PRIOR}).attempts, step_at_start=50, fallback_tokens_per_step=1000,
                      **kw)


def test_running_totals_span_all_attempts():
    out = _figures().figures(step=60, attempt_cost_usd=0.05, attempt_gpu_hours=0.01, mean_step_seconds=2.0,
                             window_step_seconds=0.5)
    assert out["cost_usd"] == pytest.approx(0.25)
    assert out["gpu_hours"] == pytest.approx(200 / 3600 + 0.01)
    assert (out["attempts"], out["preemptions"]) == (3, 2)
    assert out["usd_per_step"] == pytest.approx(0.25 / 60)
    assert out["usd_per_million_tokens"] == pytest.approx(0.25 / 60_000 * 1e6)
    assert out["tokens_per_second"] == pytest.approx(2000)
    # uninterrupted on demand: this attempt's 50 s (0.05 / 3.6 h) plus the 50 steps before its restore
    # point at 2 s each = 150 s at $10.8/h = $0.45, against $0.25 paid on spot
    assert out["on_demand_cost_usd"] == pytest.approx(0.45)
    assert out["spot_savings_usd"] == pytest.approx(0.2)
    # attempt 2 redid steps 20..30: 10 steps x 2 s at $3.6/h
    assert (out["lost_work_steps"], out["lost_work_seconds"]) == (10, 20.0)
    assert out["lost_work_usd"] == pytest.approx(0.02)


def test_spot_savings_go_negative_when_restarts_and_lost_work_outweigh_the_discount():
    # a short job on volatile capacity: 6 attempts of 100 s each at a third of the on-demand price,
    # each paying a 60 s start-up and redoing steps; 60 steps of 1 s reached in the end
    attempts = [{"fence": i + 1, "exit_class": "vanished", "started_at": 200.0 * i, "ended_at": 200.0 * i + 100,
                 "checkpoint_step_at_start": 10 * i, "step_end": 10 * i + 25, "cost_usd": 0.1, "gpus": 1}
                for i in range(5)]
    figures = JobFigures(SPOT, decoded({"attempts": attempts}).attempts, step_at_start=50, fallback_tokens_per_step=1000)
    out = figures.figures(step=60, attempt_cost_usd=0.1, attempt_gpu_hours=100 / 3600, mean_step_seconds=1.0)
    assert out["cost_usd"] == pytest.approx(0.6)
    # on demand, uninterrupted: one start-up and its 10 steps (this attempt's 100 s) + 50 steps x 1 s
    assert out["on_demand_cost_usd"] == pytest.approx(150 / 3600 * 10.8)
    assert out["spot_savings_usd"] == pytest.approx(0.45 - 0.6)
    assert out["spot_savings_usd"] < 0
    # the spend x (on-demand / spot) - spend it replaced could never go below zero
    assert out["cost_usd"] * 3 - out["cost_usd"] > 0


def test_a_fresh_uninterrupted_spot_attempt_saves_the_whole_discount():
    out = JobFigures(SPOT, [], step_at_start=0, fallback_tokens_per_step=1000).figures(
        step=40, attempt_cost_usd=0.1, attempt_gpu_hours=0.0)
    assert out["on_demand_cost_usd"] == pytest.approx(0.3)
    assert out["spot_savings_usd"] == pytest.approx(0.2)


def test_savings_are_left_out_until_a_resumed_attempt_knows_its_step_time():
    out = _figures().figures(step=50, attempt_cost_usd=0.01, attempt_gpu_hours=0.0)
    assert "spot_savings_usd" not in out and "on_demand_cost_usd" not in out


def test_tokens_per_step_is_measured_from_the_trainer_once_it_logs_num_tokens():
    figures = _figures()
    figures.observe_logs({"loss": 1.0, "num_tokens": 4000}, step=60)  # 10 steps this attempt
    assert figures.tokens_per_step == 400
    assert figures.figures(step=60, attempt_cost_usd=0.0, attempt_gpu_hours=0.0)["tokens_trained"] == 24_000


def test_the_ledger_totals_win_once_the_attempt_has_ended():
    out = _figures().figures(step=60, attempt_cost_usd=0.05, attempt_gpu_hours=0.0, total_cost_usd=0.3, attempts=3,
                             preemptions=2)
    assert out["cost_usd"] == 0.3


def test_usd_per_quality_point_is_the_cost_over_the_gain_since_before_training():
    # 0.30 -> 0.50 is 20 points gained: $2 / 20, not $2 / 50 (the absolute value)
    assert usd_per_quality_point(2.0, 0.5, 0.3) == pytest.approx(0.1)
    assert quality_gain_points(0.5, 0.3) == pytest.approx(20.0)
    # no "before", or no gain (a worse model would give a negative price): no figure
    assert usd_per_quality_point(2.0, 0.5, None) is None and usd_per_quality_point(2.0, None, 0.3) is None
    assert usd_per_quality_point(2.0, 0.3, 0.3) is None and usd_per_quality_point(2.0, 0.2, 0.3) is None


def test_report_lists_each_attempt_and_the_totals():
    ledger = {"attempts": PRIOR + [{"fence": 3, "exit_class": "completed", "started_at": 400.0, "ended_at": 500.0,
                                    "checkpoint_step_at_start": 50, "step_end": 60, "cost_usd": 0.1}], "step": 60}
    figures = _figures().figures(step=60, attempt_cost_usd=0.1, attempt_gpu_hours=0.0, mean_step_seconds=2.0,
                                 total_cost_usd=0.3, attempts=3, preemptions=2)
    report = build_report(job="exp1", status="completed", ledger=decoded(ledger), price=SPOT, figures=figures,
                          quality_metric="eval_accuracy", quality=0.5, tokens_per_step=1000, tokens_measured=False,
                          quality_before=0.3)
    assert [a["exit_class"] for a in report["attempts"]] == ["vanished", "preempted", "completed"]
    assert report["totals"]["cost_usd"] == 0.3
    assert report["quality"]["before"] == 0.3
    text = format_report(report)
    assert "lost work: 10 step(s) redone" in text and "spot savings" in text and "eval_accuracy=0.5000" in text
    assert "(before training: 0.3000;" in text


def test_grpo_logs_usd_per_1k_rollouts_counting_each_generation_batch_once():
    from orchestrator.app.compose import compose_config
    from orchestrator.money.report import rollouts_per_step

    cfg = compose_config(["recipe=grpo", "train.per_device_batch_size=8", "train.gradient_accumulation_steps=2",
                          "recipe.num_iterations=2", "recipe.steps_per_generation=2"])
    assert rollouts_per_step(cfg) == 8.0  # 16 rows a step, each generation batch trained on twice
    assert rollouts_per_step(compose_config(["recipe=sft"])) == 0.0
    out = JobFigures(SPOT, [], step_at_start=0, fallback_tokens_per_step=1000, rollouts_per_step=8.0).figures(
        step=250, attempt_cost_usd=4.0, attempt_gpu_hours=1.0)
    assert out["rollouts"] == 2000 and out["usd_per_1k_rollouts"] == pytest.approx(2.0)
    sft = JobFigures(SPOT, [], step_at_start=0, fallback_tokens_per_step=1000).figures(
        step=250, attempt_cost_usd=4.0, attempt_gpu_hours=1.0)
    assert "usd_per_1k_rollouts" not in sft
    report = build_report(job="g", status="completed", ledger=decoded({"attempts": [], "step": 250}), price=SPOT, figures=out,
                          quality_metric="eval_accuracy", quality=None, tokens_per_step=1000, tokens_measured=True)
    assert "per 1k rollouts: $2.0000 (2000 rollouts" in format_report(report)
    assert "per 1k rollouts" not in format_report(dict(report, totals=dict(report["totals"], usd_per_1k_rollouts=None)))
