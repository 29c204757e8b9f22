"""Optuna's samplers, SuccessiveHalvingPruner and HyperbandPruner over the sweep's record: rungs, brackets,
sampling, decisions in trial order, the leader."""
from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

from orchestrator.config.compose import split_sweep_overrides
from orchestrator.records.sweep_record import SweepRecord, TrialEntry
from orchestrator.sweep import decide as _decide
from orchestrator.sweep.space import SearchSpace


def _typed(value):
    """The tests' trials (dicts as the record stores them, changed in place between questions) as the driver hands
    them to ``decide``: decoded (``TrialEntry``)."""
    if isinstance(value, dict) and "run_name" in value:
        doc = {"version": 1, "name": "s", "space": {}, "fixed": [], "settings": {},
               "trials": [dict(value, number=0, run_name="s-t0")]}
        return replace(SweepRecord.decode(doc, "test").trials[0], number=value["number"], run_name=value["run_name"])
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return value


def _asking(fn):
    def call(*args):
        out = fn(*map(_typed, args))
        return out.encode() if isinstance(out, TrialEntry) else out
    return call


decide = SimpleNamespace(**{name: _asking(value) if callable(value) and not isinstance(value, type) else value
                            for name, value in vars(_decide).items() if not name.startswith("__")})

SETTINGS = dict(max_steps=36, pruner="asha", min_fraction=1 / 9, reduction_factor=3, sampler="random", seed=7,
                direction="maximize", metric="eval_accuracy")


def space(*overrides):
    return SearchSpace.from_specs(split_sweep_overrides(list(overrides))[1])


def trial(number, params, values=None, status="paused", rung=0):
    return dict(number=number, run_name=f"s-t{number}", params=params, rung=rung, status=status,
                values=values or {}, launches=1)


def test_rungs_are_steps_of_the_trials_run_ending_at_max_steps():
    assert decide.rung_steps(SETTINGS) == [4, 12, 36]
    assert decide.eval_every(SETTINGS, 0) == 4
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
    assert not decide.ready(SETTINGS, trials, 1, 0)
    trials[0]["status"] = "failed"
    assert decide.ready(SETTINGS, trials, 1, 0)
    trials[0].update(status="paused", values={"0": 0.3})
    assert decide.ready(SETTINGS, trials, 1, 0)


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
                if t["status"] == "paused" and t["number"] not in made and decide.ready(SETTINGS, trials, t["number"], 0):
                    made[t["number"]] = decide.decision(SETTINGS, sp, trials, t["number"], 0)
                    t["status"] = "pruned" if made[t["number"]] == "prune" else "paused"
        return made

    forward = run(range(9))
    shuffled = list(range(9))
    rng.shuffle(shuffled)
    assert run(shuffled) == forward and sorted(forward) == list(range(9))


HYPERBAND = dict(SETTINGS, pruner="hyperband")  # rungs 4, 12, 36: three brackets


def test_hyperband_brackets_are_optunas_and_start_at_later_rungs():
    """Trial k's bracket is the one Optuna's HyperbandPruner hashes it into; bracket b's trial evaluates and
    pauses at rung_steps[b:], the rest at every rung; other pruners have one bracket."""
    import optuna

    pruner = optuna.pruners.HyperbandPruner(min_resource=4, max_resource=36, reduction_factor=3)
    study = optuna.create_study(study_name=decide.STUDY_NAME, pruner=pruner)
    pruner._try_initialization(study)
    numbers = range(20)
    brackets = [pruner._get_bracket_id(study, study.ask()) for _ in numbers]
    assert [decide.bracket(HYPERBAND, k) for k in numbers] == brackets and set(brackets) == {0, 1, 2}
    for k, b in zip(numbers, brackets):
        assert decide.trial_steps(HYPERBAND, k) == [4, 12, 36][b:]
    assert decide.trial_steps(HYPERBAND, 3) == [12, 36] and decide.eval_every(HYPERBAND, 3) == 12
    assert decide.trial_steps(HYPERBAND, 2) == [36] and decide.decision(HYPERBAND, space(), [trial(
        k, {}) for k in range(3)], 2, 0) == "complete"  # the last bracket runs straight to max_steps
    assert {decide.bracket(SETTINGS, k) for k in numbers} == {0} and decide.trial_steps(SETTINGS, 3) == [4, 12, 36]


def test_hyperband_decides_as_optunas_hyperband_pruner_driven_trial_by_trial():
    """sweep.pruner=hyperband: each trial's verdicts are those Optuna's HyperbandPruner gives in an ordinary
    sequential study where each trial reports at its own bracket's rungs (ask, report, should_prune per rung)."""
    import optuna

    sp = space("train.learning_rate=interval(1e-5,1e-3)")
    rng = random.Random(5)
    values = [[rng.random(), rng.random()] for _ in range(16)]
    pruner = optuna.pruners.HyperbandPruner(min_resource=4, max_resource=36, reduction_factor=3)
    study = optuna.create_study(study_name=decide.STUDY_NAME, direction="maximize", pruner=pruner)
    pruner._try_initialization(study)
    expected, trials = {}, []
    for k, vs in enumerate(values):
        live = study.ask()
        steps = [4, 12, 36][pruner._get_bracket_id(study, live):]
        trials.append(trial(k, {}))
        for r, (value, step) in enumerate(zip(vs, steps)):
            live.report(value, step)
            trials[k]["values"][str(r)] = value
            if r == len(steps) - 1:
                expected[(k, r)] = "complete"
                break
            expected[(k, r)] = "prune" if live.should_prune() else "promote"
            if expected[(k, r)] == "prune":
                break
    got = {(k, r): decide.decision(HYPERBAND, sp, trials, k, r) for (k, r) in expected}
    assert got == expected and {"prune", "promote", "complete"} <= set(got.values())
    # a trial of a later bracket is first judged at its own first rung: not at step 4, among bracket 0 only
    later = [k for k in range(16) if decide.bracket(HYPERBAND, k) == 1]
    assert later and all(decide.trial_steps(HYPERBAND, k)[0] == 12 for k in later)


def test_under_hyperband_a_decision_waits_only_on_the_trials_of_its_bracket():
    assert [decide.bracket(HYPERBAND, k) for k in range(4)] == [0, 0, 2, 1]
    trials = [trial(k, {}, status="running") for k in range(4)]
    trials[3].update(status="paused", values={"0": 0.4})  # bracket 1: no earlier trial shares it
    assert decide.ready(HYPERBAND, trials, 3, 0)
    assert not decide.ready(SETTINGS, trials, 3, 0)  # one bracket: it waits on trials 0-2
    trials[1].update(status="paused", values={"0": 0.5})
    assert not decide.ready(HYPERBAND, trials, 1, 0)  # trial 0 shares bracket 0 and has not reported


def test_the_leader_compares_trials_of_different_brackets_by_steps_not_rung_index():
    """Under Hyperband rung 1 of bracket 0 is step 12 and rung 0 of bracket 1 is step 12 too: the leader is
    the best at the highest step reached, whatever the index."""
    trials = [trial(0, {}, {"0": 0.9, "1": 0.5}), trial(1, {}, {"0": 0.2}), trial(2, {}, status="running"),
              trial(3, {}, {"0": 0.6})]  # t0: steps 4, 12; t1: step 4; t3 (bracket 1): step 12
    assert decide.reached(HYPERBAND, trials[3]) == (12, 0.6) and decide.reached(HYPERBAND, trials[0]) == (12, 0.5)
    assert decide.leader(trials, HYPERBAND)["number"] == 3
    assert decide.leader(trials, dict(HYPERBAND, direction="minimize"))["number"] == 0
    assert decide.leader(trials, SETTINGS)["number"] == 0  # one bracket: rung 1 is step 12 for all; only t0 has it
    trials[2].update(status="completed", values={"0": 0.1})  # bracket 2: its one rung is step 36
    assert decide.leader(trials, HYPERBAND)["number"] == 2 and decide.reached(HYPERBAND, trials[2]) == (36, 0.1)


def test_a_pruner_outside_optunas_is_refused_at_launch(tmp_path, capsys):
    from orchestrator import launch

    code = launch.main(["sweep=asha", "sweep.pruner=median", "sweep.n_trials=2", "sweep.budget_usd=1",
                        "train.learning_rate=interval(1e-5,1e-3)", f"storage.uri={tmp_path / 'runs'}",
                        f"run.work_dir={tmp_path / 'work'}", "tracking.enabled=false"])
    err = capsys.readouterr().err
    assert code == 4 and "sweep.pruner='median' is not a valid choice" in err and "successive_halving, hyperband" in err
