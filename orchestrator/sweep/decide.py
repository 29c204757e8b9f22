"""Optuna's samplers and pruner over the sweep's record: which parameters trial k gets, and whether a trial
that reached a rung is promoted, pruned or complete. Pure functions of the record (no I/O but Optuna's
in-memory study, rebuilt for each question), so a relaunched driver on any machine asks and decides the same.

Rungs are steps of the trial's own run (``train.max_steps``), so money at a rung is a fixed fraction of the
trial's planned cost and the boundary does not move with the machine's load: rung r ends at
``round(max_steps x min_fraction) x reduction_factor^r`` steps, the last at ``max_steps``.

Decisions are taken in trial-number order per rung (``ready``): trial k's result at rung r is told to
Optuna's ``SuccessiveHalvingPruner`` once every trial j < k has reported rung r or can no longer reach it,
with exactly those trials as its competitors. Which trials are promoted is then a function of the trials'
metrics, not of which process finished first, so a sweep interrupted anywhere promotes the same trials as
an uninterrupted one with the same seed. A trial waiting for its decision holds no worker: it is paused
with its checkpoint, and the free worker takes other work.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from orchestrator.sweep.space import SearchSpace

FINISHED = ("pruned", "completed", "failed", "stopped")


def rung_steps(settings: dict) -> list[int]:
    """The step at which each rung ends (the last is ``max_steps``); one rung without a pruner."""
    max_steps = int(settings["max_steps"])
    if settings["pruner"] == "none":
        return [max_steps]
    first = max(1, round(max_steps * float(settings["min_fraction"])))
    eta = int(settings["reduction_factor"])
    steps = []
    while not steps or steps[-1] < max_steps:
        steps.append(min(max_steps, first * eta ** len(steps)))
    return steps


def eval_every(settings: dict) -> int:
    """``train.eval_steps`` that evaluates at every rung's end."""
    return math.gcd(*rung_steps(settings))


def _direction(settings: dict) -> str:
    return "minimize" if settings["direction"] == "minimize" else "maximize"


def _sampler(settings: dict, space: SearchSpace, number: int):
    import optuna

    seed = int(settings["seed"]) + number  # trial k samples with seed + k: its draw does not depend on the driver's life
    if settings["sampler"] == "grid":
        return optuna.samplers.GridSampler(space.grid(), seed=int(settings["seed"]))
    if settings["sampler"] == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def _frozen(trial: dict, space: SearchSpace, steps: list[int], grid: bool):
    """A stored trial as Optuna's: its parameters, a value per rung reached, the pruner's rung marks."""
    import optuna
    from optuna.trial import TrialState

    dists = space.distributions()
    params = {k: v for k, v in trial["params"].items() if k in dists}
    values = {int(r): v for r, v in trial["values"].items()}
    marks = {f"completed_rung_{r}": v for r, v in values.items()}
    if grid:  # GridSampler's own marks: which grid point the trial took
        grid_space = space.grid()
        keys = sorted(grid_space)
        index = [grid_space[k].index(params[k]) for k in keys if params.get(k) in grid_space[k]]
        if len(index) == len(keys):
            marks["search_space"] = {k: grid_space[k] for k in keys}
            marks["grid_id"] = _grid_id(index, [len(grid_space[k]) for k in keys])
    state = {"completed": TrialState.COMPLETE, "running": TrialState.RUNNING, "paused": TrialState.RUNNING}.get(
        trial["status"], TrialState.PRUNED)
    last = values[max(values)] if values else None
    return optuna.trial.create_trial(
        state=state, params=params, distributions={k: dists[k] for k in params},
        value=last if state == TrialState.COMPLETE else None,
        intermediate_values={steps[r]: v for r, v in values.items() if r < len(steps)}, system_attrs=marks)


def _grid_id(index: list[int], sizes: list[int]) -> int:
    """GridSampler's number of a grid point (the last key varies fastest)."""
    gid = 0
    for i, size in zip(index, sizes):
        gid = gid * size + i
    return gid


def sample(space: SearchSpace, settings: dict, trials: list[dict], number: int) -> dict[str, Any]:
    """Trial ``number``'s parameters, asked from Optuna's sampler with the stored trials in its study."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=_direction(settings), sampler=_sampler(settings, space, number))
    steps = rung_steps(settings)
    for trial in trials:
        study.add_trial(_frozen(trial, space, steps, settings["sampler"] == "grid"))
    asked = study.ask(space.distributions())
    return {key: _plain(asked.params[key]) for key in space.specs}


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def ready(trials: list[dict], number: int, rung: int) -> bool:
    """Whether trial ``number``'s result at ``rung`` may be decided: every earlier trial reported that rung
    or can no longer reach it."""
    return all(str(rung) in t["values"] or (t["status"] in FINISHED) for t in trials[:number])


def decision(settings: dict, space: SearchSpace, trials: list[dict], number: int, rung: int) -> str:
    """``complete`` at the last rung; else Optuna's SuccessiveHalvingPruner's verdict with trials < number
    (those that reached ``rung``) as the competitors: ``promote`` or ``prune``."""
    import optuna

    steps = rung_steps(settings)
    if rung >= len(steps) - 1:
        return "complete"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=steps[0], reduction_factor=int(
        settings["reduction_factor"]), min_early_stopping_rate=0, bootstrap_count=0)
    study = optuna.create_study(direction=_direction(settings), pruner=pruner)
    for other in trials[:number]:
        shown = dict(other, values={r: v for r, v in other["values"].items() if int(r) <= rung})
        study.add_trial(_frozen(shown, space, steps, False))
    me = trials[number]
    live = study.ask()
    for r in range(rung):
        study._storage.set_trial_system_attr(live._trial_id, f"completed_rung_{r}", me["values"][str(r)])
    live.report(me["values"][str(rung)], steps[rung])
    return "prune" if live.should_prune() else "promote"


def leader(trials: list[dict], settings: dict) -> Optional[dict]:
    """The best trial at the highest rung any trial reached (ties: the lower number)."""
    reached = [t for t in trials if t["values"]]
    if not reached:
        return None
    top = max(max(int(r) for r in t["values"]) for t in reached)
    at_top = [t for t in reached if str(top) in t["values"]]
    sign = 1 if settings["direction"] == "minimize" else -1
    return min(at_top, key=lambda t: (sign * t["values"][str(top)], t["number"]))
