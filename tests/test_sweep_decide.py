"""Optuna's samplers and SuccessiveHalvingPruner over the sweep's record: rungs, sampling, decisions in trial order."""
from __future__ import annotations

import random

from orchestrator.config.compose import split_sweep_overrides
from orchestrator.sweep import decide
from orchestrator.sweep.space import SearchSpace

SETTINGS = dict(max_steps=36, pruner="asha", min_fraction=1 / 9, reduction_factor=3, sampler="random", seed=7,
                direction="maximize", metric="eval_accuracy")


def space(*overrides):
    return SearchSpace.from_specs(split_sweep_overrides(list(overrides))[1])


def trial(number, params, values=None, status="paused", rung=0):
    return dict(number=number, run_name=f"s-t{number}", params=params, rung=rung, status=status,
                values=values or {}, launches=1)


def test_rungs_are_steps_of_the_trials_run_ending_at_max_steps():
    assert decide.rung_steps(SETTINGS) == [4, 12, 36]
    assert decide.eval_every(SETTINGS) == 4
    assert decide.rung_steps(dict(SETTINGS, max_steps=40)) == [4, 12, 36, 40]
    assert decide.rung_steps(dict(SETTINGS, pruner="none")) == [36]


def test_trial_k_samples_the_same_parameters_whatever_the_driver_saw_before():
    sp = space("train.learning_rate=tag(log, interval(1e-5,1e-3))", "recipe.lora_r=choice(8,16,32)")
    alone = decide.sample(sp, SETTINGS, [], 3)
    after = decide.sample(sp, SETTINGS, [trial(i, decide.sample(sp, SETTINGS, [], i)) for i in range(3)], 3)
    assert alone == after and 1e-5 <= alone["train.learning_rate"] <= 1e-3
    assert decide.sample(sp, SETTINGS, [], 4) != alone


def test_a_grid_sampler_visits_every_point_once():
    sp = space("train.learning_rate=1e-4,2e-4,5e-4", "recipe.lora_r=8,16")
    settings = dict(SETTINGS, sampler="grid", pruner="none")
    trials = []
    for k in range(6):
        trials.append(trial(k, decide.sample(sp, settings, trials, k), status="running"))
    assert len({tuple(sorted(t["params"].items())) for t in trials}) == 6


def test_decisions_follow_successive_halving_over_the_earlier_trials_only():
    sp = space("train.learning_rate=interval(1e-5,1e-3)")
    values = [0.5, 0.7, 0.6, 0.8, 0.2, 0.9]
    trials = [trial(k, {"train.learning_rate": 1e-4}, {"0": v}) for k, v in enumerate(values)]
    verdicts = [decide.decision(SETTINGS, sp, trials, k, 0) for k in range(6)]
    # ASHA: the first trial is promoted; then a trial goes on when it is in the top third of those at its rung
    assert verdicts == ["promote", "promote", "prune", "promote", "prune", "promote"]
    # a later trial's result never changes an earlier decision: the verdicts of a prefix are the same
    assert [decide.decision(SETTINGS, sp, trials[:4], k, 0) for k in range(4)] == verdicts[:4]


def test_a_decision_waits_for_every_earlier_trial_to_reach_the_rung_or_end():
    trials = [trial(0, {}, status="running"), trial(1, {}, {"0": 0.4})]
    assert not decide.ready(trials, 1, 0)
    trials[0]["status"] = "failed"
    assert decide.ready(trials, 1, 0)
    trials[0].update(status="paused", values={"0": 0.3})
    assert decide.ready(trials, 1, 0)


def test_the_order_in_which_trials_report_does_not_change_the_decisions():
    """The chaos property in small: results arriving in any order give the same promotions."""
    sp = space("train.learning_rate=interval(1e-5,1e-3)")
    rng = random.Random(3)
    values = [rng.random() for _ in range(9)]

    def run(order):
        trials = [trial(k, {}, status="running") for k in range(9)]
        made = {}
        for k in order:  # trial k reports rung 0; then every decision that is ready is taken
            trials[k].update(status="paused", values={"0": values[k]})
            for t in trials:
                if t["status"] == "paused" and t["number"] not in made and decide.ready(trials, t["number"], 0):
                    made[t["number"]] = decide.decision(SETTINGS, sp, trials, t["number"], 0)
                    t["status"] = "pruned" if made[t["number"]] == "prune" else "paused"
        return made

    forward = run(range(9))
    shuffled = list(range(9))
    rng.shuffle(shuffled)
    assert run(shuffled) == forward and sorted(forward) == list(range(9))


def test_hyperband_decides_as_optunas_hyperband_pruner_driven_trial_by_trial():
    """sweep.pruner=hyperband: each trial's verdicts at rungs 0 and 1 are those Optuna's HyperbandPruner gives in
    an ordinary sequential study (ask, report, should_prune per rung); its brackets make them differ from plain
    successive halving (a trial in a later bracket is not judged at the first rung)."""
    import optuna

    sp = space("train.learning_rate=interval(1e-5,1e-3)")
    settings = dict(SETTINGS, pruner="hyperband")
    rng = random.Random(5)
    values = [[rng.random(), rng.random()] for _ in range(12)]
    pruner = optuna.pruners.HyperbandPruner(min_resource=4, max_resource=36, reduction_factor=3)
    study = optuna.create_study(study_name=decide.STUDY_NAME, direction="maximize", pruner=pruner)
    expected, trials = {}, []
    for k, (v0, v1) in enumerate(values):
        live = study.ask()
        live.report(v0, 4)
        expected[(k, 0)] = "prune" if live.should_prune() else "promote"
        trials.append(trial(k, {}, {"0": v0}))
        if expected[(k, 0)] == "promote":
            live.report(v1, 12)
            expected[(k, 1)] = "prune" if live.should_prune() else "promote"
            trials[k]["values"]["1"] = v1
    got = {(k, r): decide.decision(settings, sp, trials, k, r) for (k, r) in expected}
    assert got == expected
    halving = [decide.decision(SETTINGS, sp, trials, k, 0) for k in range(12)]
    assert [got[(k, 0)] for k in range(12)] != halving and halving.count("prune") > [
        got[(k, 0)] for k in range(12)].count("prune")


def test_a_pruner_outside_optunas_is_refused_at_launch(tmp_path, capsys):
    from orchestrator import launch

    code = launch.main(["sweep=asha", "sweep.pruner=median", "sweep.n_trials=2", "sweep.budget_usd=1",
                        "train.learning_rate=interval(1e-5,1e-3)", f"storage.uri={tmp_path / 'runs'}",
                        f"run.work_dir={tmp_path / 'work'}", "tracking.enabled=false"])
    err = capsys.readouterr().err
    assert code == 4 and "sweep.pruner=median" in err and "successive_halving|hyperband" in err
