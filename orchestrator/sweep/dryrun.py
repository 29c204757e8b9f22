"""``backend.dry_run=true`` on a sweep: each trial of the first round as its backend would get it, printed.

Every trial the sweep would start (``sweep.n_trials``, the grid's points) is sampled as the driver samples it
(``decide.sample``, the earlier trials launched and without results yet) and shown at its first rung: a heading
with its parameters, the command the driver runs for it (``driver.trial_command``), then what that command's
launcher prints with ``backend.dry_run=true`` (the trial composed and checked as its launcher would
(``compose_for_launch``), then ``orchestrator.backends.run_backend``: the sbatch script, the SkyPilot task, the
Kubernetes manifest, the local supervisor's worker command). Nothing is launched and nothing is written: no
sweep record, lease, trial ledger, spend reservation or trial log; the store is read once, without retries, for
what a run would refuse there (``_read_store``). Results decide what follows the first rung
(promotions, and under ``sweep.sampler=tpe`` the later trials' values), so a dry run cannot show it.
"""

from __future__ import annotations

import shlex
from typing import Optional

from orchestrator.core.errors import ConfigError, UserError
from orchestrator.records.sweep_record import SweepRecord, TrialEntry
from orchestrator.sweep import decide, trust
from orchestrator.sweep.driver import startup_override, trial_command
from orchestrator.sweep.state import trial_run_name


def print_first_round(plan, compose_for_launch) -> int:
    """Print the first round of ``plan`` (a ``SweepPlan`` whose record was not opened); 0. UserError (exit 4) when
    a trial's own launcher would refuse it."""
    from orchestrator.backends import run_backend

    name = plan.state.name
    existing, unread = _read_store(plan)  # before any output: a run's refusal is this one's
    print(
        f"sweep {name} (dry run: nothing is launched or written): {plan.n_trials} trials, {plan.max_parallel} at "
        f"once, budget ${plan.budget_usd:g}; each trial at its first rung as backend={plan.cfg.backend.name} "
        f"would get it",
        flush=True,
    )
    if unread:
        print(
            f"# note: the store {plan.store.uri} could not be read from here ({unread}); a run checks there that "
            f"sweep {name} names no ordinary job, and resumes its record if it has one."
        )
    if existing is not None:
        print(
            f"# note: sweep {name} already has a record ({plan.state.uri}, {len(existing.trials)} trials); a run "
            "resumes it instead of starting this round. Shown: the first round of the sweep from scratch."
        )
    if plan.settings["sampler"] == "tpe":
        print("# note: sweep.sampler=tpe samples each trial from the results before it; shown as sampled with none.")
    startup = startup_override(plan) if existing is not None else []  # measured by the record's trials, if any
    trials: list[TrialEntry] = []
    for number in range(plan.n_trials):
        params = decide.sample(plan.space, plan.settings, trials, number)
        trials.append(
            TrialEntry(
                number=number,
                run_name=trial_run_name(name, number),
                rung=0,
                status="running",
                values={},
                launches=1,
                params=trust.stored_params(params),
            )
        )
        step = decide.trial_steps(plan.settings, number)[0]
        command = trial_command(plan, number, params, step, startup=startup)
        cfg, final = compose_for_launch(command[3:])  # what the trial's launcher composes and checks
        shown = " ".join(f"{k}={v}" for k, v in sorted(trust.stored_params(params).items()))
        print(f"\n# trial {number} of sweep {name}: {shown}, to its first rung (train.pause_at_step={step})")
        print(f"# the sweep's driver runs: {_scrubbed(cfg, shlex.join(_as_run(command)))}", flush=True)
        run_backend(cfg, _as_run(final))  # cfg's backend.dry_run: it prints what a run's launcher hands the backend
    return 0


def _read_store(plan) -> tuple[Optional[SweepRecord], Optional[str]]:
    """What a run checks in the store, read once: ConfigError when the sweep's name is an ordinary job's folder
    (``plan.refuse_a_jobs_folder``), SweepStateCorrupt for a record a run would refuse; else (the sweep's record
    or None, None). A store this machine cannot read (no credentials, no network): (None, why), and the trials are
    rendered all the same, as a job's dry run renders without reading the store."""
    from orchestrator.storage.base import TransientStorageError
    from orchestrator.sweep.plan import name_key, refuse_a_jobs_folder
    from orchestrator.sweep.state import SweepStateCorrupt

    try:
        refuse_a_jobs_folder(plan.store, plan.state.name, name_key(plan.cfg))
        return plan.state.load(), None
    except (ConfigError, SweepStateCorrupt):
        raise
    except (UserError, OSError, TransientStorageError) as err:
        return None, str(err)[:300]


def _as_run(items: list[str]) -> list[str]:
    """A command or overrides as a run (not this dry run) has them: without ``backend.dry_run=...``."""
    return [item for item in items if not item.startswith("backend.dry_run=")]


def _scrubbed(cfg, text: str) -> str:
    """``text`` with every secret value of ``cfg`` (a webhook URL, a token) replaced, as the backends print."""
    from omegaconf import OmegaConf

    from orchestrator.core.redaction import scrub_text, secrets_in

    return scrub_text(text, secrets_in(OmegaConf.to_container(cfg, resolve=True)))
