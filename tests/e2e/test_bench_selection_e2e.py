"""Early stopping and ``checkpoint.final=best`` on a benchmark metric in real jobs (the tiny model, the shipped
``tiny_arith_mc``, every checkpoint scored): a job whose checkpoints score the same items right stops after the
patience, completed, with the reason, and keeps the first (cheapest) checkpoint as its final weights; a job whose
scores move within their standard errors trains to the end."""
from __future__ import annotations

import json

from tests.helpers import jobs

BENCH = ["eval.tasks=[tiny_arith_mc]", "eval.every=1", "checkpoint.every=off", "checkpoint.every_steps=5",
         "train.early_stopping_metric=bench/tiny_arith_mc/acc"]


def _job(tmp_path, *extra):
    runs = tmp_path / "runs"
    fast = [o for o in jobs.FAST if not o.startswith(("checkpoint.every", "train.max_steps"))]
    done = jobs.run_job(fast + BENCH + [f"storage.uri={runs}", "run.name=sel", *extra], tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ledger = json.loads((runs / "sel" / "ledger.json").read_text())
    final = json.loads((runs / "sel" / "final" / "manifest.json").read_text())
    return done.stdout + done.stderr, ledger, final


def test_a_benchmark_flat_beyond_noise_stops_the_job_and_final_best_keeps_the_first_checkpoint(tmp_path):
    # a learning rate too small to change any item's answer: every checkpoint scores the same items right
    log, ledger, final = _job(tmp_path, "train.max_steps=40", "train.learning_rate=1e-9", "eval.limit=40",
                              "train.early_stopping_patience=2", "checkpoint.final=best")
    reason = ("bench/tiny_arith_mc/acc has been no better than its best (")
    assert f"stopped early: {reason}" in log and ", step 5) beyond noise for 2 evaluations" in log, log[-3000:]
    assert "training ended at step 15 of 40; the job ends completed" in log
    assert ledger["attempts"][-1]["exit_class"] == "completed"
    assert ledger["quality"]["stopped_early"].startswith(reason)
    assert final["step"] == 5, final["step"]  # the best: later ones no better beyond noise
    assert "final weights: the best checkpoint (step 5, bench/tiny_arith_mc/acc=" in log


def test_scores_moving_within_their_standard_errors_do_not_stop_the_job(tmp_path):
    log, ledger, final = _job(tmp_path, "train.max_steps=20", "eval.limit=20", "train.early_stopping_patience=1")
    assert "stopped early" not in log and "stopped_early" not in ledger.get("quality", {})
    assert final["step"] == 20 and ledger["attempts"][-1]["exit_class"] == "completed"
    assert "(within noise: not counted toward a plateau)" in log, log[-3000:]
