"""MLflow for a sweep: one parent run per sweep, each trial's own run nested under it.

The parent run is tagged ``sweep=<sweep.name>`` in the sweep's experiment; its id is kept in the sweep's record
(``mlflow_run_id``), so a relaunched driver (any machine) resumes it instead of making a second one. Trials get
``tracking.parent_run_id=<id>``: each trial's job sets ``mlflow.parentRunId`` on its own run (MLflow's nested
runs). At each rung result and decision the parent logs the best-so-far metric with the experiment's cumulative
dollars beside it (``best_<metric>`` and ``spent_usd`` at the same step; each point its own step, one past the
parent's last, so a relaunched driver goes on after it), and at the end the trial table and the decisions as
artifacts. The dollars are money spent (settled, and what open attempts had spent at their last write), not
reservations: a hold settles below what it reserved, so a figure with holds in it would fall when a trial ends. MLflow being down never stops the sweep: a warning, and it goes on.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Optional, cast

from orchestrator.records.sweep_record import SweepRecord, TrialEntry

log = logging.getLogger(__name__)

SWEEP_TAG = "sweep"


def _find_or_create(client, experiment_id: str, name: str, run_id: Optional[str], params: dict):
    if run_id:
        try:
            run = client.get_run(run_id)
            if run.info.lifecycle_stage == "active":
                return run.info.run_id
        except Exception as err:  # deleted or from another server: found again by tag below
            log.warning("the sweep's MLflow run %s is gone (%s); looking for it by tag", run_id, type(err).__name__)
    quoted = name.replace("\\", "\\\\").replace("'", "\\'")
    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.{SWEEP_TAG} = '{quoted}'",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    if found:
        return found[0].info.run_id
    from mlflow.entities import Param

    from orchestrator.tracking.run import KIND_TAG

    run = client.create_run(experiment_id, tags={SWEEP_TAG: name, KIND_TAG: "sweep"}, run_name=name)
    items = [Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
    client.log_batch(run.info.run_id, params=items[:100], synchronous=True)
    return run.info.run_id


class SweepTracking:
    """The sweep's parent run; ``event`` is the driver's callback, ``finish`` logs the tables."""

    def __init__(self, plan, client, run_id: str, *, last_step: int = -1):
        self.plan, self.client, self.run_id = plan, client, run_id
        self.last_step = last_step  # the parent's last logged point: each new one goes one past it

    @classmethod
    def open(cls, plan) -> Optional["SweepTracking"]:
        """The parent run (resumed, or made), its id in the record and in every trial's overrides; None when
        tracking is off or MLflow cannot be reached (trials then log as plain jobs)."""
        cfg = plan.cfg.tracking
        if not cfg.enabled:
            return None
        from orchestrator.tracking.run import (
            MLFLOW_HTTP_ENV_DEFAULTS,
            _experiment_id,
            quiet_telemetry,
            resolve_tracking_uri,
        )

        for name, value in MLFLOW_HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
        quiet_telemetry()
        from mlflow import MlflowClient

        from orchestrator.core.redaction import redact, scrub_text

        uri = resolve_tracking_uri(cfg)
        client = MlflowClient(tracking_uri=uri)
        doc = plan.state.loaded()
        params = {f"sweep.{k}": v for k, v in doc.settings.items()}
        params.update({f"space.{k}": v for k, v in doc.space.items()})
        params = redact(params, set())
        try:
            experiment_id = _experiment_id(client, plan.experiment, uri)
            run_id = _find_or_create(client, experiment_id, plan.state.name, doc.mlflow_run_id, params)
            client.update_run(run_id, status="RUNNING")  # a relaunch: running again until finish()
            last_step = max((m.step for m in client.get_metric_history(run_id, "spent_usd")), default=-1)
        except Exception as err:
            log.warning(
                "MLflow at %s unavailable for the sweep's parent run (%s: %s); trials log as plain jobs",
                scrub_text(uri),
                type(err).__name__,
                scrub_text(str(err))[:200],
            )
            return None

        def note(d: dict) -> None:
            d.update(mlflow_run_id=run_id)

        plan.state.update(note)
        plan.trial_overrides.append(f"tracking.parent_run_id={run_id}")
        log.info("sweep %s: MLflow parent run %s at %s", plan.state.name, run_id, scrub_text(uri))
        return cls(plan, client, run_id, last_step=last_step)

    def _safe(self, what: str, fn) -> None:
        try:
            fn()
        except Exception as err:
            log.warning(
                "sweep %s: MLflow %s failed (%s: %s); the sweep goes on",
                self.plan.state.name,
                what,
                type(err).__name__,
                str(err)[:200],
            )

    def event(self, kind: str, trial: TrialEntry, doc: SweepRecord) -> None:
        if kind in ("reported", "decided"):
            self._safe("metrics", lambda: self._log_best(doc))

    def _log_best(self, doc: SweepRecord) -> None:
        from mlflow.entities import Metric

        from orchestrator.money.spend import experiment_total_usd
        from orchestrator.sweep.decide import leader, reached

        settings = dict(doc.settings)
        best = leader(doc.trials, settings)
        step = self.last_step + 1
        spent = experiment_total_usd(self.plan.spend_index(), self.plan.experiment, held=False)
        now = int(time.time() * 1000)
        metrics = [
            Metric("spent_usd", float(spent), now, step),
            Metric("decisions", len(doc.decisions), now, step),
            Metric("rung_results", sum(len(t.values) for t in doc.trials), now, step),
        ]
        if best is not None:
            at_step, value = cast("tuple[int, float]", reached(settings, best))  # the leader has a result
            metrics += [
                Metric(f"best_{settings['metric']}", float(value), now, step),
                Metric("best_trial", best.number, now, step),
                Metric("best_step", at_step, now, step),
            ]
        self.client.log_batch(self.run_id, metrics=metrics, synchronous=True)
        self.last_step = step

    def finish(self, doc: SweepRecord, spent: dict[str, float], *, code: int) -> None:
        """The trial table and the decisions as artifacts; the run ends FINISHED (0) or FAILED."""

        def log_tables() -> None:
            from orchestrator.sweep.decide import leader

            trials = [
                {
                    "number": t.number,
                    "run_name": t.run_name,
                    "status": t.status,
                    "rung": t.rung,
                    "params": dict(t.params),
                    "values": {str(r): v for r, v in sorted(t.values.items())},
                    "spent_usd": spent.get(t.run_name, 0.0),
                }
                for t in doc.trials
            ]
            best = leader(doc.trials, dict(doc.settings))
            self.client.log_dict(self.run_id, {"trials": trials, "leader": best and best.run_name}, "sweep/trials.json")
            self.client.log_dict(
                self.run_id, {"decisions": [d.encode() for d in doc.decisions]}, "sweep/decisions.json"
            )
            self._log_best(doc)
            self.client.set_terminated(self.run_id, status="FINISHED" if code == 0 else "FAILED")

        self._safe("tables", log_tables)
