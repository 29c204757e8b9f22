"""``python -m orchestrator.launch -m ...`` / ``sweep=asha``: plan, drive, print the result (``backend.dry_run=true``:
print the first round's submissions, ``dryrun``); and the sweep's part of ``orchestrator status
<storage.uri>/<sweep.name>``."""

from __future__ import annotations

import logging
import sys
from typing import Any, cast

from orchestrator.core.errors import UserError
from orchestrator.records.sweep_record import SweepRecord

log = logging.getLogger(__name__)


def run_sweep(argv: list[str], compose_for_launch) -> int:
    from orchestrator.sweep.driver import Driver
    from orchestrator.sweep.plan import plan_sweep
    from orchestrator.sweep.tracking import SweepTracking

    plan: Any = None  # the SweepPlan, once planned
    try:
        plan = plan_sweep(argv, compose_for_launch)  # takes the sweep's lease: one driver at a time
        if plan.cfg.backend.dry_run:  # the record was not opened: print the trials, write nothing
            from orchestrator.sweep.dryrun import print_first_round

            return print_first_round(plan, compose_for_launch)
        print(
            f"sweep {plan.state.name}: {plan.n_trials} trials, {plan.max_parallel} at once, budget "
            f"${plan.budget_usd:g}; state in {plan.state.uri}; trial logs in {plan.log_dir}",
            flush=True,
        )
        tracking = SweepTracking.open(plan)
        code = Driver(plan, events=tracking.event if tracking else None).run()
        doc = plan.state.loaded()
        if tracking:
            tracking.finish(doc, _spent(plan), code=code)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    finally:
        _release(plan)
    print(format_sweep(doc, spent=_spent(plan)), flush=True)
    return code


def _release(plan) -> None:
    """The lease given up at the driver's end, so a rerun takes the sweep at once (a failure here is only logged:
    the lease then expires, or is taken over once this process is gone)."""
    if plan is None:
        return
    try:
        plan.state.release()
    except Exception as err:  # the sweep's outcome is already decided; storage may be down
        log.warning(
            "sweep %s: could not give up the driver's lease (%s: %s)",
            plan.state.name,
            type(err).__name__,
            str(err)[:200],
        )


def _spent(plan) -> dict[str, float]:
    """Each trial's spend, from the spend index (settled and held)."""
    from orchestrator.money.spend import job_total_usd

    jobs = plan.spend_index().get("jobs", {})
    return {name: job_total_usd(job) for name, job in jobs.items()}


def format_sweep(doc: SweepRecord, *, spent: dict[str, float]) -> str:
    """Trials (parameters, rungs reached, metric per rung, status, spend), the leader, spend on pruned trials."""
    from orchestrator.attempt.capacity_contract import stored_text
    from orchestrator.sweep.decide import bracket, leader, reached, rung_steps

    settings = dict(doc.settings)
    steps = rung_steps(settings)
    lines = [
        f"sweep {doc.name}: {len(doc.trials)} trials; rungs at steps {', '.join(map(str, steps))}; "
        f"{settings['metric']} ({settings['direction']})"
    ]
    for t in doc.trials:
        values = " ".join(f"r{r}={v:.4f}" for r, v in sorted(t.values.items()))
        params = stored_text(" ".join(f"{k}={v}" for k, v in sorted(t.params.items())))  # from the bucket
        where = f"bracket {bracket(settings, t.number)} " if settings["pruner"] == "hyperband" else ""
        lines.append(
            f"  t{t.number:<3} {t.status:<9} {where}rung {t.rung}  "
            f"${spent.get(t.run_name, 0.0):.4f}  {values or '-'}  {params}"
        )
        why = t.refused or (t.rung_problem if t.live else None)
        if why:
            lines.append(f"       refused: {stored_text(why)}")
    best = leader(doc.trials, settings)
    total = sum(spent.get(t.run_name, 0.0) for t in doc.trials)
    pruned = sum(spent.get(t.run_name, 0.0) for t in doc.trials if t.status == "pruned")
    idle = doc.idle_seconds / doc.slot_seconds if doc.slot_seconds else 0.0
    lines.append(f"spent ${total:.4f} (on pruned trials ${pruned:.4f}); workers idle {idle:.1%} of slot time")
    if best is not None:
        step, value = cast("tuple[int, float]", reached(settings, best))  # the leader has a result
        lines.append(f"leader: t{best.number} ({best.run_name}) {settings['metric']}={value:.4f} at step {step}")
    return "\n".join(lines)


def status_text(store, name: str, *, as_json: bool = False) -> str | None:
    """``orchestrator status`` of a sweep (``--json``: its record): None when ``name`` has no sweep record."""
    import json

    from orchestrator.money.spend import job_total_usd
    from orchestrator.sweep.plan import spend_index
    from orchestrator.sweep.state import SweepState

    doc = SweepState(store, name).load()
    if doc is None or as_json:
        return None if doc is None else json.dumps(doc.encode(), indent=2)
    jobs = spend_index(store).get("jobs", {})
    return format_sweep(doc, spent={n: job_total_usd(j) for n, j in jobs.items()})
