"""Optuna's samplers and pruner over the sweep's record: which parameters trial k gets, and whether a trial
that reached a rung is promoted, pruned or complete. Pure functions of the record (no I/O but Optuna's
in-memory study, rebuilt for each question), so a relaunched driver on any machine asks and decides the same.

Rungs are steps of the trial's own run (``train.max_steps``), so money at a rung is a fixed fraction of the
trial's planned cost and the boundary does not move with the machine's load: rung r ends at
``round(max_steps x min_fraction) x reduction_factor^r`` steps, the last at ``max_steps``. Under Hyperband a
trial of bracket b (Optuna's own assignment, ``bracket``) starts at a later rung: its rungs are
``rung_steps[b:]`` (``trial_steps``), and a trial's ``rung`` and ``values`` count its own rungs, so compare
trials by steps (``reached``), never by rung index.

Decisions are taken in trial-number order per rung (``ready``): trial k's result at rung r is told to
Optuna's pruner (``sweep.pruner``: ``SuccessiveHalvingPruner`` or ``HyperbandPruner``) once every trial j < k
of its bracket has reported rung r or can no longer reach it, with exactly those trials as its competitors. Which trials are
promoted is then a function of the trials' metrics, not of which process finished first, so a sweep
interrupted anywhere promotes the same trials as an uninterrupted one with the same seed. A trial waiting for
its decision holds no worker: it is paused with its checkpoint, and the free worker takes other work.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace
from typing import Any, Literal, Optional, Sequence

from orchestrator.records.sweep_record import TrialEntry
from orchestrator.sweep.space import SearchSpace, in_domain

FINISHED = ("pruned", "completed", "failed", "stopped")


def rung_steps(settings: dict) -> list[int]:
    """The step at which each rung ends (the last is ``max_steps``); one rung without a pruner."""
    max_steps = int(settings["max_steps"])
    if settings["pruner"] == "none":
        return [max_steps]
    first = max(1, round(max_steps * float(settings["min_fraction"])))
    eta = int(settings["reduction_factor"])
    steps: list[int] = []
    while not steps or steps[-1] < max_steps:
        steps.append(min(max_steps, first * eta ** len(steps)))
    return steps


def bracket(settings: dict, number: int) -> int:
    """Trial ``number``'s bracket: Optuna's ``HyperbandPruner`` assignment (a hash of the study's name and the
    trial's number) under ``sweep.pruner=hyperband``; 0 (the one bracket) under any other pruner."""
    if settings["pruner"] != "hyperband":
        return 0
    steps = rung_steps(settings)
    pruner, study = _hyperband(steps[0], int(settings["max_steps"]), int(settings["reduction_factor"]))
    return min(pruner._get_bracket_id(study, SimpleNamespace(number=number)), len(steps) - 1)


@functools.lru_cache(maxsize=8)
def _hyperband(min_resource: int, max_resource: int, eta: int):
    """An initialised HyperbandPruner and a study of the sweep's name: what ``_get_bracket_id`` reads."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = optuna.pruners.HyperbandPruner(
        min_resource=min_resource, max_resource=max_resource, reduction_factor=eta, bootstrap_count=0
    )
    study = optuna.create_study(study_name=STUDY_NAME, pruner=pruner)
    pruner._try_initialization(study)
    return pruner, study


def trial_steps(settings: dict, number: int) -> list[int]:
    """The steps at which trial ``number``'s rungs end: its bracket's (``rung_steps[bracket:]``)."""
    return rung_steps(settings)[bracket(settings, number) :]


def eval_every(settings: dict, number: int) -> int:
    """``train.eval_steps`` that evaluates at every one of trial ``number``'s rungs."""
    return math.gcd(*trial_steps(settings, number))


def reached(settings: dict, trial: TrialEntry) -> Optional[tuple[int, float]]:
    """(the highest step ``trial`` has a result at, that result), None before any: what compares trials of
    different brackets, whose rung r is a different step."""
    steps = trial_steps(settings, trial.number)
    rung = max((r for r in trial.values if r < len(steps)), default=None)
    return None if rung is None else (steps[rung], trial.values[rung])


def _direction(settings: dict) -> Literal["minimize", "maximize"]:
    return "minimize" if settings["direction"] == "minimize" else "maximize"


def _sampler(settings: dict, space: SearchSpace, number: int):
    import optuna

    seed = (
        int(settings["seed"]) + number
    )  # trial k samples with seed + k: its draw does not depend on the driver's life
    if settings["sampler"] == "grid":
        return optuna.samplers.GridSampler(space.grid(), seed=int(settings["seed"]))
    if settings["sampler"] == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def _frozen(trial: TrialEntry, space: SearchSpace, steps: list[int], grid: bool):
    """A stored trial as Optuna's: its parameters, a value per rung reached, the pruner's rung marks."""
    import optuna
    from optuna.trial import TrialState

    dists = space.distributions()  # a stored value outside the space (narrowed since, or forged) is not told
    params = {k: v for k, v in trial.params.items() if k in dists and in_domain(space, k, v)}
    values = dict(trial.values)
    marks: dict[str, Any] = {f"completed_rung_{r}": v for r, v in values.items()}
    if grid:  # GridSampler's own marks: which grid point the trial took
        grid_space = space.grid()
        keys = sorted(grid_space)
        index = [grid_space[k].index(params[k]) for k in keys if params.get(k) in grid_space[k]]
        if len(index) == len(keys):
            marks["search_space"] = {k: grid_space[k] for k in keys}
            marks["grid_id"] = _grid_id(index, [len(grid_space[k]) for k in keys])
    state = {"completed": TrialState.COMPLETE, "running": TrialState.RUNNING, "paused": TrialState.RUNNING}.get(
        trial.status, TrialState.PRUNED
    )
    last = values[max(values)] if values else None
    return optuna.trial.create_trial(
        state=state,
        params=params,
        distributions={k: dists[k] for k in params},
        value=last if state == TrialState.COMPLETE else None,
        intermediate_values={steps[r]: v for r, v in values.items() if r < len(steps)},
        system_attrs=marks,
    )


def _grid_id(index: list[int], sizes: list[int]) -> int:
    """GridSampler's number of a grid point (the last key varies fastest)."""
    gid = 0
    for i, size in zip(index, sizes):
        gid = gid * size + i
    return gid


def sample(space: SearchSpace, settings: dict, trials: Sequence[TrialEntry], number: int) -> dict[str, Any]:
    """Trial ``number``'s parameters, asked from Optuna's sampler with the stored trials in its study."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=_direction(settings), sampler=_sampler(settings, space, number))
    for trial in trials:
        steps = trial_steps(settings, trial.number)
        study.add_trial(_frozen(trial, space, steps, settings["sampler"] == "grid"))
    asked = study.ask(space.distributions())
    return {key: _plain(asked.params[key]) for key in space.specs}


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def ready(settings: dict, trials: Sequence[TrialEntry], number: int, rung: int) -> bool:
    """Whether trial ``number``'s result at ``rung`` may be decided: every earlier trial of its bracket (its
    only competitors) reported that rung or can no longer reach it."""
    own = bracket(settings, number)
    return all(rung in t.values or t.status in FINISHED for t in trials[:number] if bracket(settings, t.number) == own)


STUDY_NAME = "orchestrator-sweep"  # HyperbandPruner's brackets hash the study's name with the trial's number


def _pruner(settings: dict):
    """Optuna's pruner for ``sweep.pruner``: rung r of ``rung_steps`` is its rung at ``min_resource x eta^r``."""
    import optuna

    steps, eta = rung_steps(settings), int(settings["reduction_factor"])
    if settings["pruner"] == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=steps[0], max_resource=int(settings["max_steps"]), reduction_factor=eta, bootstrap_count=0
        )
    return optuna.pruners.SuccessiveHalvingPruner(
        min_resource=steps[0], reduction_factor=eta, min_early_stopping_rate=0, bootstrap_count=0
    )


def _replay(study, trial: TrialEntry, steps: list[int], rung: int) -> bool:
    """``trial``'s results up to ``rung`` reported to ``study``'s pruner, one rung at a time as the driver
    decided them (the pruner keeps its own rung marks); whether the pruner's last verdict was to prune."""
    live, pruned = study.ask(), False
    for r in range(rung + 1):
        if r >= len(steps) or r not in trial.values:
            break
        live.report(trial.values[r], steps[r])
        pruned = live.should_prune()
        if pruned:
            break
    return pruned


def decision(settings: dict, space: SearchSpace, trials: Sequence[TrialEntry], number: int, rung: int) -> str:
    """``complete`` at the last rung; else the verdict of Optuna's pruner (``sweep.pruner``: its
    SuccessiveHalvingPruner, or its HyperbandPruner, whose brackets are each a SuccessiveHalvingPruner over the
    trials its hash puts there) with trials < ``number`` as the competitors: ``promote`` or ``prune``.

    The earlier trials' results up to ``rung`` are replayed to a fresh study in trial-number order, rung by
    rung, so the pruner holds what it held when each was decided, and nothing of later trials."""
    import optuna

    if rung >= len(trial_steps(settings, number)) - 1:
        return "complete"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=STUDY_NAME, direction=_direction(settings), pruner=_pruner(settings))
    for other in trials[:number]:  # each at its own bracket's steps: Optuna's bracket study picks its competitors
        _replay(study, other, trial_steps(settings, other.number), rung)
    return "prune" if _replay(study, trials[number], trial_steps(settings, number), rung) else "promote"


def leader(trials: Sequence[TrialEntry], settings: dict) -> Optional[TrialEntry]:
    """The best trial at the highest step any trial has a result at (ties: the lower number); steps, not rung
    indices, so trials of different Hyperband brackets compare at the same amount of training."""
    scored = [(*r, t) for t in trials if (r := reached(settings, t)) is not None]
    if not scored:
        return None
    top = max(step for step, _, _ in scored)
    sign = 1 if settings["direction"] == "minimize" else -1
    return min((x for x in scored if x[0] == top), key=lambda x: (sign * x[1], x[2].number))[2]
