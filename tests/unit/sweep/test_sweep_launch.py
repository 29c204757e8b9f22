"""A sweep's bad input is refused by the launcher before any trial: exit 4, one ``error:`` line naming the
problem and the fix, nothing written to the store."""
from __future__ import annotations

import pytest

from orchestrator import launch

GRID = ["-m", "train.learning_rate=1e-4,2e-4"]


@pytest.mark.parametrize("args,needles", [
    (["-m", "train.learning_rate=interval(1e-5,"], ["does not parse", "tag(log, interval(1e-5,1e-3))"]),
    (["-m", "train.learnin_rate=1e-4,2e-4", "sweep.budget_usd=1"], ["train.learnin_rate", "has no key"]),
    (GRID, ["sweep.budget_usd=None", "positive dollar budget"]),
    (GRID + ["sweep.budget_usd=-2"], ["sweep.budget_usd=-2", "positive dollar budget"]),
    (GRID + ["sweep.budget_usd=1", "sweep.max_parallel=0"], ["sweep.max_parallel=0", "at least 1"]),
    (GRID + ["sweep.budget_usd=1", "sweep.metric=eval_bleu"], ["sweep.metric=eval_bleu", "eval_accuracy, eval_loss"]),
    (["-m", "train.learning_rate=interval(1e-5,1e-3)", "sweep.budget_usd=1"], ["has no grid", "sweep.n_trials"]),
    (["sweep=asha", "train.learning_rate=interval(1e-5,1e-3)", "sweep.budget_usd=1"],
     ["sweep.n_trials=0", "needs the number of trials"]),
    (["-m", "sweep.budget_usd=1"], ["no search space"]),
    (GRID + ["sweep.budget_usd=1", "sweep.metric=bench/tiny_arith_mc/acc"],
     ["sweep.metric=bench/tiny_arith_mc/acc", "eval.tasks is empty", "eval.tasks=[tiny_arith_mc]"]),
    (GRID + ["sweep.budget_usd=1", "sweep.metric=bench/tiny_arith_gen/acc", "eval.tasks=[tiny_arith_mc]"],
     ["sweep.metric=bench/tiny_arith_gen/acc", "is not one of eval.tasks (tiny_arith_mc)"]),
    (GRID + ["sweep.budget_usd=1", "sweep.metric=bench/tiny_arith_mc/bleu", "eval.tasks=[tiny_arith_mc]"],
     ["sweep.metric=bench/tiny_arith_mc/bleu", "reports acc"]),
    # sweep.name is held to run.name's rule, its trials' names too (a long one failed every trial with exit 0;
    # '/' or '..' raised a traceback)
    (GRID + ["sweep.budget_usd=1", f"sweep.name={'n' * 61}"], [f"sweep.name='{'n' * 61}'", "-t1' is the last",
                                                             "1-63 letters"]),
    (GRID + ["sweep.budget_usd=1", "sweep.name=a/b"], ["sweep.name='a/b' cannot name a sweep", "sweep.name=lr-search"]),
    (GRID + ["sweep.budget_usd=1", "sweep.name=.."], ["sweep.name='..' cannot name a sweep"]),
    (GRID + ["sweep.budget_usd=1", f"run.name={'r' * 62}"], ["run.name=", "cannot name a sweep"]),
])
def test_bad_sweep_input_exits_4_before_any_trial(args, needles, tmp_path, capsys):
    runs = tmp_path / "runs"
    code = launch.main(args + [f"storage.uri={runs}", f"run.work_dir={tmp_path / 'work'}", "tracking.enabled=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 4
    assert len(err) == 1 and err[0].startswith("error: "), err
    for needle in needles:
        assert needle in err[0], (needle, err[0])
    assert not runs.exists() and not (tmp_path / "work").exists()


def test_the_sweeps_record_keeps_no_secret_of_the_overrides(tmp_path):
    """The record lives in the bucket: a webhook URL given on the command line is stored redacted."""
    import json

    from orchestrator.sweep.plan import plan_sweep

    hook = "https://hooks.slack.com/services/T0000/B0000/abcdefSECRET123"
    plan = plan_sweep(GRID + ["sweep.budget_usd=1", f"budget.webhook_url={hook}", f"storage.uri={tmp_path / 'runs'}",
                              f"run.work_dir={tmp_path / 'work'}", "tracking.enabled=false"], launch.compose_for_launch)
    stored = (tmp_path / "runs" / "default" / "sweep.json").read_text()
    assert "abcdefSECRET123" not in stored and "budget.webhook_url=https://hooks.slack.com/" in stored
    assert f"budget.webhook_url={hook}" in plan.fixed  # the trials still get it (their own redaction applies)
    assert json.loads(stored)["trials"] == []


def test_a_benchmark_metric_of_an_eval_task_decides_the_rungs_and_is_maximized(tmp_path):
    from orchestrator.sweep.plan import plan_sweep

    plan = plan_sweep(GRID + ["sweep.budget_usd=1", "sweep.metric=bench/tiny_arith_mc/acc",
                              "eval.tasks=[tiny_arith_mc]", f"storage.uri={tmp_path / 'runs'}", f"run.work_dir={tmp_path / 'work'}",
                              "tracking.enabled=false"], launch.compose_for_launch)
    assert plan.settings["metric"] == "bench/tiny_arith_mc/acc" and plan.settings["direction"] == "maximize"
