"""``run.deadline``: spot or on-demand for this job, decided before each attempt and at each heartbeat.

The decision is ``orchestrator.policy.deadline.decide_capacity`` (Uniform
Progress, pure, shared with the simulator); this module gives it the job's
standing and acts on a change:

- progress: steps done x the steady seconds per step (this attempt's, else the
  earlier attempts' in the ledger), against ``max_steps`` x the same;
- time: from the first attempt's start in the ledger to ``run.deadline``;
- one restart: ``orchestrator.policy.restart.restart_seconds`` (the override,
  the attempts' measured start to first step, ``policy.history``, or an estimate).

A decision that changes the job's capacity is logged (``capacity [spot ->
on-demand]: <reason>``), appended to the ledger's ``capacity`` list, tagged in
MLflow and sent to the budget webhook; then whoever can act does, as the
backend's script told the worker through the environment (``orchestrator.attempt.capacity_contract``):

- ``move`` (Slurm): write the wanted capacity to ``ORCH_CAPACITY_REQUEST_FILE``, save
  and stop (exit 75); the batch script moves the job to the other partition;
- ``resubmit`` (SkyPilot, Kubernetes): the attempt goes on; the next
  submission of the job renders on-demand (``planned_capacity``);
- none (local): the machine cannot change; the advice is logged and recorded.

"Deadline at risk" fires once per job when even on-demand from now on misses.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

from transformers import TrainerCallback

from orchestrator.attempt.capacity_contract import MOVE, RESUBMIT, label
from orchestrator.core.durations import parse_deadline
from orchestrator.policy.deadline import ON_DEMAND, CapacityDecision, DeadlineState, decide_capacity, reserve_seconds
from orchestrator.policy.history import (
    AttemptHistory,
    first_start,
    measured_cost_seconds,
    read_attempts,
    restart_seconds_measured,
    steady_seconds_per_step,
)

log = logging.getLogger(__name__)

AT_RISK_ALERT = "deadline_at_risk"
WEBHOOK_WAIT_SECONDS = 15.0


def deadline_seconds(text: str, first_start: float) -> float:
    """``run.deadline`` in seconds from the job's first attempt's start."""
    kind, value = parse_deadline(text)
    return value if kind == "after" else value - first_start


class CapacityWatch(TrainerCallback):
    """The deadline's decisions for one attempt (main rank; after the orchestrator callback).

    ``job``: the job's name; ``record``: the attempt's ledger record; ``tracking``: its MLflow run; ``interval``
    and ``steps``: the attempt's ``CheckpointInterval`` and ``StepClock``; ``request_stop(reason)``: save, then stop
    (the preemption handler's); ``total_cost_usd()`` and ``budget_max_usd``: the figures a webhook message carries;
    ``capacity``: what it runs on; ``action``: ``MOVE`` | ``RESUBMIT`` | None; ``webhook``: a
    ``budget.WebhookSink`` or None; ``spot_job``: ``compute.spot`` (an on-demand job has no capacity to choose: it
    only hears whether the deadline is at risk).
    """

    def __init__(
        self,
        *,
        job: str,
        record: Any,
        tracking: Any,
        interval: Any,
        steps: Any,
        request_stop: Callable[[str], None],
        total_cost_usd: Callable[[], float],
        budget_max_usd: Optional[float],
        deadline: str,
        capacity: str,
        action: Optional[str],
        request_file: str = "",
        restart_override: Optional[float] = None,
        webhook: Any = None,
        heartbeat_seconds: float = 15.0,
        spot_job: bool = True,
        clock=time.time,
        monotonic=time.monotonic,
    ):
        self.job, self.record, self.tracking = job, record, tracking
        self.interval, self.steps, self.request_stop = interval, steps, request_stop
        self.total_cost_usd, self.budget_max_usd = total_cost_usd, budget_max_usd
        self.spot_job, self.deadline, self.capacity, self.action = spot_job, deadline, capacity, action
        self.request_file, self.restart_override, self.webhook = request_file, restart_override, webhook
        self.heartbeat_seconds = heartbeat_seconds
        self.clock, self.monotonic = clock, monotonic
        self.latest: Optional[tuple[str, bool]] = None  # the newest decision's (capacity, locked)
        self.stopping = False
        self._last_check = monotonic()
        self._prior: list[AttemptHistory] = []
        self._at_risk_asked = False
        self.decisions = 0  # in the ledger so far

    # ---- the Trainer's events ----------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        from orchestrator.policy.restart import restart_seconds

        decoded = self.record.decode(self.record.load())
        attempts = read_attempts(decoded.attempts)
        self._prior = [a for a in attempts if a.fence != self.record.fence]
        self.first_start = first_start(attempts) or self.clock()
        self.deadline_s = deadline_seconds(self.deadline, self.first_start)
        newest = decoded.capacity[-1] if decoded.capacity else None
        self.latest = (newest.capacity, newest.locked) if newest is not None else None
        self.decisions = len(decoded.capacity)
        sizes = [c.size for c in decoded.checkpoints]
        self.restart_s, self.restart_source = restart_seconds(
            override=self.restart_override,
            checkpoint_bytes=sizes[-1] if sizes else 0.0,
            measured=restart_seconds_measured(self._prior),
        )
        rate = steady_seconds_per_step(self._prior)
        if rate:  # before the attempt trains: the earlier attempts' pace
            self.decide(state.global_step, state.max_steps, rate)

    def on_step_end(self, args, state, control, **kwargs):
        if self.stopping or self.monotonic() - self._last_check < self.heartbeat_seconds:
            return
        self._last_check = self.monotonic()
        rate = self.steps.steady_seconds_per_step() or steady_seconds_per_step(self._prior)
        if rate:
            self.decide(state.global_step, state.max_steps, rate)

    def on_train_end(self, args, state, control, **kwargs):
        if self.webhook is not None and not self.webhook.wait(WEBHOOK_WAIT_SECONDS):
            log.warning("a capacity message was still being sent to the webhook when the attempt ended")

    # ---- deciding and acting -----------------------------------------------------------
    def standing(self, step: int, max_steps: int, seconds_per_step: float) -> DeadlineState:
        current = self.latest[0] if self.latest else self.capacity
        every = self.interval.seconds or 0.0  # none yet (off, or auto not decided): no interval's work at risk
        stalls = self.steps.save_stall_seconds
        cost = sum(stalls) / len(stalls) if stalls else (measured_cost_seconds(self._prior) or 0.0)
        # kept in hand, as the simulator does: the work a hard kill could take back on spot (up to one checkpoint
        # interval), the checkpoints of the work left (at the interval in use) and the time to the next heartbeat
        reserve = reserve_seconds(
            at_risk_seconds=every if current != ON_DEMAND else 0.0,
            work_left_seconds=max(0, max_steps - step) * seconds_per_step,
            checkpoint_cost_seconds=cost,
            on_demand_every_seconds=every,
            until_next_decision_seconds=self.heartbeat_seconds,
        )
        return DeadlineState(
            reserve_seconds=reserve,
            elapsed_seconds=self.clock() - self.first_start,
            deadline_seconds=self.deadline_s,
            work_done_seconds=step * seconds_per_step,
            work_total_seconds=max_steps * seconds_per_step,
            restart_seconds=self.restart_s,
            # what the job follows: the newest decision (an attempt that cannot move follows it by advice)
            current=current,
            locked=bool(self.latest and self.latest[1]),
        )

    def decide(self, step: int, max_steps: int, seconds_per_step: float) -> CapacityDecision:
        decision = decide_capacity(self.standing(step, max_steps, seconds_per_step))
        if decision.at_risk:
            self.alert_at_risk(decision)
        if not self.spot_job:
            return decision
        latest = self.latest
        if latest and latest == (decision.capacity, bool(decision.locked)):
            if self.action == MOVE and decision.capacity != self.capacity:  # decided before, not yet moved
                log.warning(
                    "%s (%s)",
                    f"capacity [{label(self.capacity)} -> {label(decision.capacity)}]: {decision.reason}",
                    self.act(decision, "as decided earlier"),
                )
            return decision  # nothing new to record
        previous = latest[0] if latest else self.capacity
        line = f"capacity [{label(previous)} -> {label(decision.capacity)}]: {decision.reason}"
        action = self.act(decision, line)
        entry = dict(
            capacity=decision.capacity,
            previous=previous,
            reason=decision.reason,
            locked=decision.locked,
            at_risk=decision.at_risk,
            action=action,
            step=step,
            restart_s=self.restart_s,
            restart_source=self.restart_source,
            seconds_per_step=seconds_per_step,
        )
        self.record.record_capacity(entry)
        self.latest = (decision.capacity, bool(decision.locked))
        log.warning("%s (%s)", line, action)
        self.decisions += 1
        n = self.decisions
        tracking = self.tracking
        tracking.set_tags(
            {
                "capacity": decision.capacity,
                "capacity.reason": decision.reason,
                f"capacity.decision.{n}": f"{line} ({action})",
            }
        )
        tracking.log_metrics({"capacity_on_demand": float(decision.capacity == ON_DEMAND)}, step)
        self.send("capacity", f"[capacity] job {self.job!r}: {line} ({action})")
        return decision

    def act(self, decision: CapacityDecision, line: str) -> str:
        """Do what this backend can about ``decision``; returns what was done, for the ledger."""
        wanted = label(decision.capacity)
        if decision.capacity == self.capacity:
            return f"stays on {wanted}"
        if self.action == MOVE and self.request_file:
            Path(self.request_file).write_text(decision.capacity + "\n")
            self.record.note(capacity_switch=decision.capacity)
            self.stopping = True
            self.request_stop(f"{line}; saving, then the job moves to {wanted}")
            return f"saving, then moving the job to {wanted}"
        if self.action == RESUBMIT:
            return f"the next submission of run.name={self.job} (python -m orchestrator.launch) takes {wanted}"
        return (
            f"advice only: this backend cannot change the machine; run the job on {wanted} capacity "
            f"(compute.spot={'false' if decision.capacity == ON_DEMAND else 'true'}) to follow it"
        )

    def alert_at_risk(self, decision: CapacityDecision) -> None:
        if self._at_risk_asked:
            return
        self._at_risk_asked = True
        if not self.record.record_alert(AT_RISK_ALERT):  # once per job, across attempts
            return
        message = (
            f"[{AT_RISK_ALERT}] job {self.job!r}: deadline at risk: even on-demand from now on "
            f"misses it; {decision.reason}"
        )
        log.warning(message)
        self.tracking.set_tag(f"alert.{AT_RISK_ALERT}", decision.reason)
        self.send(AT_RISK_ALERT, message)

    def send(self, name: str, message: str) -> None:
        if self.webhook is None:
            return
        from orchestrator.money.budget import Alert

        self.webhook.send(
            Alert(name, message, total_cost_usd=self.total_cost_usd(), max_usd=float(self.budget_max_usd or 0.0))
        )
