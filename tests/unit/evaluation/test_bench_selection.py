"""Early stopping and checkpoint.final=best on a benchmark metric decide only beyond noise
(orchestrator.evaluation.selection): a change within the standard errors neither stops a job nor displaces
the best checkpoint; a score shown flat to the item stops it after the patience."""
from __future__ import annotations

from orchestrator.evaluation import selection
from tests.helpers.bench import result

NAME = "bench/tiny_arith_mc/acc"


def _record(step, acc, stderr=0.05, items=None):
    return result(step, scores={"tiny_arith_mc": {"acc": {"value": acc, "stderr": stderr}}},
                  samples={"tiny_arith_mc": {"acc": items}} if items else {})


def test_changes_within_the_standard_errors_never_stop_and_keep_the_first_best():
    records = [_record(10, 0.30), _record(20, 0.27), _record(30, 0.33), _record(40, 0.29), _record(50, 0.28)]
    chosen = selection.decide(records, NAME, patience=1, threshold=0.0)
    assert chosen.stop_reason is None and chosen.plateau == 0
    assert chosen.best_step == 10  # 0.33 at step 30 is higher, within noise (+3.0+-13.9 points)
    assert "within noise: not counted toward a plateau" in selection.describe(chosen, NAME)


def test_a_gain_beyond_noise_is_the_new_best():
    chosen = selection.decide([_record(10, 0.30, 0.02), _record(20, 0.60, 0.02)], NAME, patience=2, threshold=0.0)
    assert chosen.best_step == 20 and chosen.best_value == 0.60
    assert "(better beyond noise: the new best)" in selection.describe(chosen, NAME)


def test_scores_flat_to_the_item_are_a_plateau_beyond_noise_and_stop_after_the_patience():
    items = [1.0, 0.0, 0.0, 1.0] * 10  # the same items right at every checkpoint: the paired interval is 0
    records = [_record(10, 0.5, items=items), _record(20, 0.5, items=items), _record(30, 0.5, items=items)]
    assert selection.decide(records[:2], NAME, patience=2, threshold=0.0).stop_reason is None
    chosen = selection.decide(records, NAME, patience=2, threshold=0.0, max_steps=100)
    assert chosen.best_step == 10 and chosen.plateau == 2
    assert chosen.stop_reason == ("bench/tiny_arith_mc/acc has been no better than its best (0.5000, step 10) "
                                  "beyond noise for 2 evaluations (the last: +0.0+-0.0 points); training ended at "
                                  "step 30 of 100")


def test_a_within_noise_evaluation_restarts_the_plateau_count():
    flat = [1.0, 0.0] * 20
    moved = [1.0, 1.0] + [1.0, 0.0] * 19  # one item more right: +2.5 points, within its paired interval
    records = [_record(10, 0.5, items=flat), _record(20, 0.5, items=flat), _record(30, 0.525, items=moved),
               _record(40, 0.5, items=flat)]
    chosen = selection.decide(records, NAME, patience=2, threshold=0.0)
    assert chosen.stop_reason is None and chosen.plateau == 1


def test_the_threshold_asks_for_more_than_noise():
    a, b = _record(10, 0.30, 0.01), _record(20, 0.36, 0.01)  # +6.0+-2.8 points
    assert selection.decide([a, b], NAME, patience=1, threshold=0.0).best_step == 20
    assert selection.decide([a, b], NAME, patience=1, threshold=0.05).best_step == 10


def _refusal(overrides: list[str]) -> str:
    import pytest

    from orchestrator.app.compose import compose_config
    from orchestrator.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        compose_config(overrides)
    return str(err.value)


def test_a_benchmark_selection_metric_is_checked_at_launch_with_the_fix():
    on = ["eval.tasks=[tiny_arith_mc]", "eval.every=1", "checkpoint.every_steps=5", "train.early_stopping_patience=2"]
    text = _refusal(on + ["train.early_stopping_metric=bench/tiny_arith_mc/accuracy"])
    assert "task tiny_arith_mc reports acc, not 'accuracy'" in text and "bench/tiny_arith_mc/acc" in text
    text = _refusal(on + ["train.early_stopping_metric=bench/tiny_arith_gen/exact_match_strip"])
    assert "'tiny_arith_gen' is not one of eval.tasks (tiny_arith_mc)" in text
    text = _refusal(on[1:] + ["train.early_stopping_metric=bench/tiny_arith_mc/acc", "eval.every=0"])
    assert "eval.tasks is empty" in text and "'eval.tasks=[tiny_arith_mc]'" in text
    text = _refusal(["eval.tasks=[tiny_arith_mc]", "train.early_stopping_metric=bench/tiny_arith_mc/acc"])
    assert "eval.every=0 scores only the final weights" in text and "eval.every=N" in text
    assert "give bench/<task>/<metric>" in _refusal(on + ["train.early_stopping_metric=eval_accuracy"])


def test_the_filtered_metric_of_a_generation_task_is_known():
    from orchestrator.app.compose import compose_config

    cfg = compose_config(["eval.tasks=[tiny_arith_gen]", "eval.every=1", "checkpoint.every_steps=5",
                          "train.early_stopping_patience=1", "checkpoint.final=best",
                          "train.early_stopping_metric=bench/tiny_arith_gen/exact_match_strip"])
    assert cfg.train.early_stopping_metric == "bench/tiny_arith_gen/exact_match_strip"
