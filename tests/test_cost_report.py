"""The job's cost figures and cost report: arithmetic over the ledger's attempts, no servers."""
from __future__ import annotations

import pytest

from orchestrator.cost import Price
from orchestrator.cost_report import JobFigures, build_report, format_report, usd_per_quality_point

SPOT = Price(usd_per_hour_total=3.6, usd_per_gpu_hour=3.6, on_demand_usd_per_hour_total=10.8, source="test", gpus=1,
             spot=True)
PRIOR = [  # killed at step 30 after a checkpoint at 20, then preempted cleanly at 50
    {"epoch": 1, "exit_class": "vanished", "started_at": 0.0, "last_seen": 100.0, "ended_at": 100.0,
     "checkpoint_step_at_start": 0, "step_end": 30, "cost_usd": 0.1, "gpus": 1},
    {"epoch": 2, "exit_class": "preempted", "started_at": 200.0, "ended_at": 300.0,
     "checkpoint_step_at_start": 20, "step_end": 50, "cost_usd": 0.1, "gpus": 1},
]


def _figures(**kw):
    return JobFigures(SPOT, PRIOR, step_at_start=50, fallback_tokens_per_step=1000, **kw)


def test_running_totals_span_all_attempts():
    out = _figures().figures(step=60, attempt_cost_usd=0.05, attempt_gpu_hours=0.01, mean_step_seconds=2.0,
                             window_step_seconds=0.5)
    assert out["cost_usd"] == pytest.approx(0.25)
    assert out["gpu_hours"] == pytest.approx(200 / 3600 + 0.01)
    assert (out["attempts"], out["preemptions"]) == (3, 2)
    assert out["usd_per_step"] == pytest.approx(0.25 / 60)
    assert out["usd_per_million_tokens"] == pytest.approx(0.25 / 60_000 * 1e6)
    assert out["tokens_per_second"] == pytest.approx(2000)
    assert out["on_demand_cost_usd"] == pytest.approx(0.75)
    assert out["spot_savings_usd"] == pytest.approx(0.5)
    # attempt 2 redid steps 20..30: 10 steps x 2 s at $3.6/h
    assert (out["lost_work_steps"], out["lost_work_seconds"]) == (10, 20.0)
    assert out["lost_work_usd"] == pytest.approx(0.02)


def test_tokens_per_step_is_measured_from_the_trainer_once_it_logs_num_tokens():
    figures = _figures()
    figures.observe_logs({"loss": 1.0, "num_tokens": 4000}, step=60)  # 10 steps this attempt
    assert figures.tokens_per_step == 400
    assert figures.figures(step=60, attempt_cost_usd=0.0, attempt_gpu_hours=0.0)["tokens_trained"] == 24_000


def test_the_ledger_totals_win_once_the_attempt_has_ended():
    out = _figures().figures(step=60, attempt_cost_usd=0.05, attempt_gpu_hours=0.0, total_cost_usd=0.3, attempts=3,
                             preemptions=2)
    assert out["cost_usd"] == 0.3


def test_usd_per_quality_point_matches_the_report_command():
    assert usd_per_quality_point(2.0, 0.5) == pytest.approx(0.04)
    assert usd_per_quality_point(2.0, 0.0) is None and usd_per_quality_point(2.0, None) is None


def test_report_lists_each_attempt_and_the_totals():
    ledger = {"attempts": PRIOR + [{"epoch": 3, "exit_class": "completed", "started_at": 400.0, "ended_at": 500.0,
                                    "checkpoint_step_at_start": 50, "step_end": 60, "cost_usd": 0.1}], "step": 60}
    figures = _figures().figures(step=60, attempt_cost_usd=0.1, attempt_gpu_hours=0.0, mean_step_seconds=2.0,
                                 total_cost_usd=0.3, attempts=3, preemptions=2)
    report = build_report(job="exp1", status="completed", ledger=ledger, price=SPOT, figures=figures,
                          quality_metric="eval_accuracy", quality=0.5, tokens_per_step=1000, tokens_measured=False)
    assert [a["exit_class"] for a in report["attempts"]] == ["vanished", "preempted", "completed"]
    assert report["totals"]["cost_usd"] == 0.3
    text = format_report(report)
    assert "lost work: 10 step(s) redone" in text and "spot savings" in text and "eval_accuracy=0.5000" in text
