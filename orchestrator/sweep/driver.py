"""The sweep driver: trials as ordinary jobs, ``sweep.max_parallel`` at once, promotion without a barrier.

A trial is ``python -m orchestrator.launch <fixed overrides> <its parameters> run.name=<sweep>-t<k>
train.pause_at_step=<rung's step>``: its own ledger, spend reservation, exit codes and requeue policy (a
SIGKILLed attempt is requeued by the trial's own supervisor; the sweep sees it running). A trial paused at its
rung (exit 3, the ledger's ``quality.evals`` holding the rung's metric) waits, holding no worker, for its
decision (``decide.ready``); promoted, it is launched again with the same run name and the next rung's step,
and resumes from its checkpoint. A free worker takes the lowest-numbered promoted trial first, else samples a
new trial while ``sweep.n_trials`` and the budget allow. The money cap is the spend index's experiment cap
(``budget.experiment_max_usd=sweep.budget_usd`` on every trial): no reservation passes it.

API for what builds on it (MLflow parent runs, reports, other backends)::

    driver = Driver(plan, events=callback)   # plan: SweepPlan (orchestrator.sweep.plan)
    driver.run() -> int                     # 0 when every trial is decided; the state is in plan.state
    callback(kind, trial, record)           # kind: "launched" | "reported" | "decided" | "ended"

The driver reads the record decoded (``SweepRecord``, ``TrialEntry``: ``orchestrator.records.sweep_record``); its
writes are functions of the record as stored (``SweepState.update``).
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from orchestrator.core import exitcodes
from orchestrator.process import warm_start
from orchestrator.records.sweep_record import SweepRecord, TrialEntry
from orchestrator.sweep import backends, decide, trust
from orchestrator.sweep.space import override
from orchestrator.sweep.state import trial_run_name as trial_name

log = logging.getLogger(__name__)

Events = Callable[[str, TrialEntry, SweepRecord], None]


class _Outcomes:
    """What the driver records of its trials: a rung result, a refusal, a decision (``Driver``'s part that
    writes outcomes; it reads ``self.plan``, ``self.state``, ``self.settings``, ``self.procs`` and ``self.events``)."""

    plan: Any  # a SweepPlan
    state: Any  # its SweepState
    settings: dict[str, Any]
    procs: dict[int, Any]  # a subprocess.Popen, or what backends.py waits on, with the same poll()
    events: Events

    def _step(self, trial: TrialEntry) -> int:
        """The step trial's current rung ends at: its bracket's rungs (``decide.trial_steps``); TrialRefused when the
        record puts it (or a result of it) past its schedule (``SweepRecord.within``)."""
        if trial.rung_problem:
            raise trust.TrialRefused(trial.rung_problem)
        return decide.trial_steps(self.settings, trial.number)[trial.rung]

    def _refuse(self, trial: TrialEntry, err: Exception) -> SweepRecord:
        """A trial whose record or ledger cannot be used: failed, with why, never launched again; the sweep's other
        trials go on."""
        from orchestrator.attempt.capacity_contract import stored_text

        number, why = trial.number, stored_text(err)[:500]  # it quotes the record: no control characters
        self.procs.pop(number, None)
        log.warning(
            "sweep %s: trial %d (%s) is refused: %s. It is not launched again; the sweep's other trials go on.",
            self.state.name,
            number,
            trial.run_name,
            why,
        )

        def fn(d: dict) -> None:
            t = d["trials"][number]
            if t["status"] in ("running", "paused"):
                t.update(status="failed", refused=why)

        record = self.state.update(fn)
        self.events("ended", record.trials[number], record)
        return record

    def _ended(self, trial: TrialEntry, code: int) -> SweepRecord:
        number, rung, step = trial.number, trial.rung, self._step(trial)
        ledger = trust.trial_ledger(self.plan.store, trial.run_name)
        value = ledger.value(step, self.settings["metric"])
        if value is not None and not math.isfinite(value):  # a diverged metric: no result
            log.warning(
                "sweep %s: trial %d's %s at step %d is %r, not a finite number; no result at this rung",
                self.state.name,
                number,
                self.settings["metric"],
                step,
                value,
            )
            value = None
        if code in (exitcodes.COMPLETED, exitcodes.BUDGET_EXHAUSTED) and value is not None:
            status, kind = "paused", "reported"
        elif code == exitcodes.BUDGET_EXHAUSTED:
            status, kind = "stopped", "ended"  # the sweep's budget (or another cap) stopped it before its rung
        else:
            status, kind = "failed", "ended"
        log.info(
            "sweep %s: trial %d exited %d at rung %d: %s%s",
            self.state.name,
            number,
            code,
            rung,
            status,
            f" ({self.settings['metric']}={value:.4f})" if value is not None else "",
        )

        def fn(d: dict) -> None:
            t = d["trials"][number]
            t["status"] = status
            if value is not None:
                t["values"][str(rung)] = float(value)

        record = self.state.update(fn)
        self.events(kind, record.trials[number], record)
        return record

    # ---- decisions, in trial order per rung -------------------------------------------------
    def _decide(self, record: SweepRecord) -> SweepRecord:
        for trial in record.trials:
            rung = trial.rung
            if trial.status != "paused" or rung not in trial.values:
                continue
            if not decide.ready(self.settings, record.trials, trial.number, rung):
                continue
            verdict = decide.decision(self.settings, self.plan.space, record.trials, trial.number, rung)
            record = self._record(trial.number, rung, verdict)
        return record

    def _record(self, number: int, rung: int, verdict: str) -> SweepRecord:
        def fn(d: dict) -> None:
            t = d["trials"][number]
            if t["status"] != "paused" or t["rung"] != rung:
                return  # another driver decided it already
            d["decisions"].append(
                {"trial": number, "rung": rung, "value": t["values"][str(rung)], "decision": verdict, "at": time.time()}
            )
            if verdict == "promote":
                t["rung"] = rung + 1
            else:
                t["status"] = "completed" if verdict == "complete" else "pruned"

        record = self.state.update(fn)
        log.info("sweep %s: trial %d at rung %d: %s", self.state.name, number, rung, verdict)
        self.events("decided", record.trials[number], record)
        return record


class Driver(_Outcomes):
    def __init__(
        self,
        plan,
        *,
        events: Optional[Events] = None,
        poll_seconds: float = 0.5,
        python: str = sys.executable,
        submit_grace: float = backends.SUBMIT_GRACE_SECONDS,
    ):
        if plan.cfg.backend.dry_run:  # its trials would only print: nothing would ever end (sweep/dryrun.py)
            raise ValueError("a dry run's sweep launches no trial: orchestrator.sweep.dryrun prints them")
        self.plan, self.state, self.settings = plan, plan.state, plan.settings
        self.events = events or (lambda kind, trial, doc: None)
        self.poll_seconds, self.python = poll_seconds, python
        self.procs = {}
        self.relaunch: set[int] = set()  # trials whose earlier launch is gone: launch, do not adopt
        self.submit_grace = submit_grace
        self.logs = Path(plan.log_dir)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._pending = [0.0, 0.0]  # slot-seconds and idle slot-seconds not yet in the record
        self.submits = backends.submits(plan.cfg)  # slurm, skypilot, kubernetes: wait on the trial's ledger
        self.forks = None if self.submits else warm_start.Forks(plan.cfg, launchers=True)  # local trials only

    # ---- the loop -------------------------------------------------------------------
    def run(self) -> int:
        doc = self.state.loaded()
        last = time.monotonic()
        while True:
            doc = self._reap(doc)
            doc = self._decide(doc)
            doc = self._fill(doc)
            if not self.procs and (not self._launchable(doc) or out_of_budget(self.plan, self._launchable(doc))):
                break
            time.sleep(self.poll_seconds)
            now = time.monotonic()
            self._usage(now - last)
            last = now
            if self._pending[0] >= 10 * self.plan.max_parallel:  # usage reaches the record every ~10 s
                self._flush_usage()
        self._flush_usage()
        return 0

    def _usage(self, dt: float) -> None:
        n = self.plan.max_parallel
        self._pending[0] += dt * n
        self._pending[1] += dt * (n - len(self.procs))

    def _flush_usage(self) -> None:
        slot, idle = self._pending
        self._pending = [0.0, 0.0]
        if slot:

            def add_usage(d: dict) -> None:
                d["usage"].update(
                    slot_seconds=d["usage"]["slot_seconds"] + slot, idle_seconds=d["usage"]["idle_seconds"] + idle
                )

            self.state.update(add_usage)

    # ---- what a free worker takes -------------------------------------------------------
    def _launchable(self, record: SweepRecord) -> list[TrialEntry]:
        """Trials that should be training and have no process: promoted, or left running by a driver that died."""
        return [t for t in record.trials if t.live and t.number not in self.procs and t.rung not in t.values]

    def _fill(self, doc: SweepRecord) -> SweepRecord:
        while len(self.procs) < self.plan.max_parallel:
            waiting = self._launchable(doc)
            if waiting and self._adopt(waiting[0]):
                continue
            if waiting:
                trial = waiting[0]
            elif len(doc.trials) < self.plan.n_trials and room_for_a_new_trial(self.plan):
                made = self.state.new_trial(
                    lambda trials: decide.sample(self.plan.space, self.settings, trials, len(trials))
                )
                doc = self.state.loaded()
                log.info(
                    "sweep %s: trial %d samples %s",
                    self.state.name,
                    made.number,
                    trust.stored_params(dict(made.params)),
                )
                trial = doc.trials[made.number]
            else:
                break
            if budget_spent(self.plan):
                break
            try:
                code = self._already_at_rung(trial)
                doc = self._launch(trial, doc) if code is None else self._ended(trial, code)
            except trust.TrialRefused as err:
                doc = self._refuse(trial, err)
        return self.state.loaded()

    def _adopt(self, trial: TrialEntry) -> bool:
        """A trial a dead driver launched that still runs (its launcher alive on this host, or its submission to
        a scheduler): wait on it instead of starting it twice (``backends.adoptable``)."""
        if trial.status != "running" or trial.number in self.relaunch:
            return False
        watch = backends.adoptable(
            trial,
            self.plan.store,
            submits=self.submits,
            log_path=self.logs / f"t{trial.number}.log",
            grace=self.submit_grace,
        )
        if watch is None:
            return False
        self.procs[trial.number] = watch
        log.info(
            "sweep %s: trial %d was launched by an earlier driver and still runs; waiting on it",
            self.state.name,
            trial.number,
        )
        return True

    def _already_at_rung(self, trial: TrialEntry) -> Optional[int]:
        """A trial that reached its rung while no driver watched (the driver died after it paused): its exit code
        as the ledger tells it, so it is not launched again (it would train a step past its rung). TrialRefused when
        the ledger is not one, or says a start-up took over a week (its supervisor would hold that much)."""
        ledger = trust.trial_ledger(self.plan.store, trial.run_name)  # a start-up over a week: TrialRefused
        if not ledger.evaluated_at(self._step(trial)) or ledger.status not in ("budget_exhausted", "completed"):
            return None
        return exitcodes.COMPLETED if ledger.status == "completed" else exitcodes.BUDGET_EXHAUSTED

    def _launch(self, trial: TrialEntry, doc: SweepRecord) -> SweepRecord:
        """Launch trial ``trial`` to its rung: its parameters are the sweep's own (``trust.launch_params``: what the
        space and the seeded sampler give it; TrialRefused when the stored ones are not), its run name derived."""
        number, rung, step = trial.number, trial.rung, self._step(trial)
        if trial.params_problem:
            raise trust.TrialRefused(trial.params_problem)
        params = trust.launch_params(self.plan.space, self.settings, trial, since=doc.space_since)
        command = trial_command(
            self.plan, number, params, step, startup=startup_override(self.plan), python=self.python
        )
        before = backends.attempts_so_far(self.plan.store, trial.run_name) if self.submits else None
        path = self.logs / f"t{number}.log"
        offset = path.stat().st_size if path.exists() else 0

        def intent(d: dict) -> None:  # recorded before the launch: a driver killed in between is seen on relaunch
            t = d["trials"][number]
            t.update(
                status="running",
                launches=t["launches"] + 1,
                submitted=before,
                launched_at=time.time(),
                log_offset=offset,
                launcher=None,
            )

        self.state.update(intent)
        self.relaunch.discard(number)
        with open(path, "ab") as out:
            proc = start_trial(command, out, self.forks)
        self.procs[number] = (
            proc if before is None else backends.SubmittedTrial(proc, self.plan.store, trial.run_name, before)
        )

        def launched(d: dict) -> None:
            d["trials"][number].update(launcher=backends.launcher_identity(proc.pid))

        doc = self.state.update(launched)
        log.info("sweep %s: trial %d runs to rung %d (step %d)", self.state.name, number, rung, step)
        self.events("launched", doc.trials[number], doc)
        return doc

    # ---- a trial's process ended ----------------------------------------------------------
    def _reap(self, doc: SweepRecord) -> SweepRecord:
        for number, proc in list(self.procs.items()):
            try:
                code = proc.poll()
            except trust.TrialRefused as err:
                doc = self._refuse(doc.trials[number], err)
                continue
            if code is None:
                continue
            del self.procs[number]
            if code == backends.GONE:  # nothing runs it any more (killed with its launcher, or never submitted)
                log.warning(
                    "sweep %s: trial %d has no process or submission left; launching it again", self.state.name, number
                )
                self.relaunch.add(number)
                continue
            try:
                doc = self._ended(doc.trials[number], code)
            except trust.TrialRefused as err:
                doc = self._refuse(doc.trials[number], err)
        return doc


def trial_command(
    plan, number: int, params: dict, step: int, *, startup: list[str], python: str = sys.executable
) -> list[str]:
    """What runs trial ``number`` with ``params`` to ``step`` (its rung's): ``python -m orchestrator.launch`` with
    the sweep's fixed overrides, the trial's parameters, its run name, its rung, the sweep's cap and ``startup``
    (``startup_override``)."""
    return [
        python,
        "-m",
        "orchestrator.launch",
        *plan.fixed,
        *(override(k, v) for k, v in sorted(params.items())),
        f"run.name={trial_name(plan.state.name, number)}",
        f"train.pause_at_step={step}",
        f"train.eval_steps={decide.eval_every(plan.settings, number)}",
        *plan.trial_overrides,
        *startup,
    ]


def live_index(plan) -> dict:
    """The spend index with the holds of trials that are gone settled at their ledger cost (``spend_leases``);
    a fresh parse, released in place, never written back from here."""
    from orchestrator.money.spend_leases import dead_holds, release

    index = plan.spend_index()
    release(index, dead_holds(plan.store, index, own_run="", now=time.time()))
    return index


def startup_override(plan) -> list[str]:
    """``compute.restart_seconds``: the longest start-up (process start to first step) the trials' ledgers
    measured, so a trial's first attempt reserves its start-up too (``AttemptRecord.startup_seconds``) and one
    the budget cannot carry through its start-up stops before it spends it; none while none is measured, or
    when the sweep's command sets it."""
    if any(o.startswith("compute.restart_seconds=") for o in plan.fixed):
        return []
    seconds = longest_start_up_s(plan)
    return [f"compute.restart_seconds={seconds:.3f}"] if seconds else []


def longest_start_up_s(plan) -> float:
    """The longest start-up (process start to first step) the sweep's trials' ledgers measured; 0 before any. A
    trial's ledger that is unreadable, or says a start-up took over a week, counts for nothing here (a warning,
    once; the driver refuses that trial when it next launches or reaps it)."""
    measured = [0.0]
    for t in plan.state.loaded().trials:
        try:
            measured += trust.start_ups(trust.trial_ledger(plan.store, t.run_name))
        except trust.TrialRefused as err:
            if (plan.state.name, t.number, str(err)) not in _WARNED:
                _WARNED.add((plan.state.name, t.number, str(err)))
                log.warning("sweep %s: trial %d's start-up is not counted: %s", plan.state.name, t.number, err)
    return max(measured)


_WARNED: set = set()


def room_for_a_new_trial(plan) -> bool:
    """Whether the budget left (reservations and start-up holds counted) carries a new trial's start-up (the
    longest measured, else the start prior: ``compute.restart_seconds``, else ``BASE_START_SECONDS``). The trial's
    supervisor holds that start-up before its worker starts and refuses it (exit 3) when the room is short; this
    check spares launching a process only to be refused. Trials already launched (promoted, requeued) are not held
    back here: their supervisors' holds decide."""
    from orchestrator.money.cost import load_catalog, price_for
    from orchestrator.money.spend import experiment_total_usd
    from orchestrator.policy.restart import start_prior_seconds

    per_s = price_for(plan.cfg.compute, load_catalog()).usd_per_second
    charged = experiment_total_usd(live_index(plan), plan.experiment)
    start_up = longest_start_up_s(plan) or start_prior_seconds(plan.cfg.compute.restart_seconds)
    return charged < plan.budget_usd - per_s * start_up - 1e-9


def budget_spent(plan) -> bool:
    from orchestrator.money.spend import experiment_total_usd

    return experiment_total_usd(live_index(plan), plan.experiment) >= plan.budget_usd - 1e-9


def out_of_budget(plan, waiting: list[TrialEntry]) -> bool:
    """Nothing runs, promoted trials (``waiting``) wait and the budget is spent: no trial can start again, so
    the sweep ends (the waiting trials keep their checkpoints) instead of waiting for money that never comes."""
    if not budget_spent(plan):
        return False
    log.warning(
        "sweep %s: the budget ($%s) is spent; trial(s) %s keep their checkpoints and were not resumed",
        plan.state.name,
        plan.budget_usd,
        ", ".join(str(t.number) for t in waiting),
    )
    return True


def start_trial(command: list[str], out, forks: Optional[warm_start.Forks]):
    """A trial's launcher, its output to ``out``: forked from this driver, which imported the training stack once,
    where that is safe (``orchestrator.process.warm_start``; ``forks`` is None for trials a scheduler runs: their launcher
    imports no stack), else a fresh interpreter."""
    if forks is not None and warm_start.is_launch_command(command) and forks.ready():
        return warm_start.start(command, dict(os.environ), output=out)
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
