"""The attempt's money watch: what it costs so far, whether the budget stops it, the cost figures.

One object per attempt, built with the price of its compute. The budget guard
(alerts and the hard stop) exists on the main rank only; other ranks get the
same watch with no guard, so they never alert or stop on their own (the main
rank's decision reaches them through the callback's broadcast).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence, cast

from orchestrator.core.errors import BudgetExhausted
from orchestrator.core.exitcodes import INTERRUPTED_CLASSES
from orchestrator.money.cost import CostMeter, Price
from orchestrator.money.report import JobFigures, estimated_tokens_per_step, rollouts_per_step

log = logging.getLogger(__name__)


class MoneyWatch:
    """Args:
    price: this attempt's price (``orchestrator.money.cost.price_for``).
    max_steps: ``train.max_steps`` (for the projected total).
    budget_max_usd: the hard stop, or None.
    fallback_tokens_per_step: tokens per optimizer step until the Trainer logs its own count.
    started_at: when the meter starts (unix time): the process's start, so its imports are billed too.
    rollouts_per_step: GRPO's completions sampled per optimizer step (``usd_per_1k_rollouts``); 0 otherwise.
    """

    def __init__(
        self,
        price: Price,
        *,
        max_steps: int,
        budget_max_usd: Optional[float],
        fallback_tokens_per_step: int,
        started_at: Optional[float] = None,
        rollouts_per_step: float = 0.0,
    ):
        self.price = price
        self.meter = CostMeter(price, started_at=started_at)
        self.max_steps = int(max_steps)
        self.budget_max_usd = budget_max_usd
        self.fallback_tokens_per_step = fallback_tokens_per_step
        self.rollouts_per_step = rollouts_per_step
        self.guard = None  # the budget guard, main rank only: set by watch_budget()
        self.spend: Optional[SpendWatch] = (
            None  # the hold on the spend index (monthly/experiment caps), main rank only: watch_budget()
        )
        self.prior_cost_usd = 0.0
        self.budget_stopped = False
        self.figures: Optional[JobFigures] = None

    @classmethod
    def from_config(cls, cfg: Any, price: Price, *, started_at: Optional[float] = None) -> "MoneyWatch":
        return cls(
            price,
            max_steps=cfg.train.max_steps,
            budget_max_usd=cfg.budget.max_usd,
            fallback_tokens_per_step=estimated_tokens_per_step(cfg),
            started_at=started_at,
            rollouts_per_step=rollouts_per_step(cfg),
        )

    def watch_budget(self, guard, spend: "SpendWatch | None" = None) -> None:
        self.guard = guard
        self.spend = spend

    def start(self, prior_attempts: list, prior_cost_usd: float, step_at_start: int) -> None:
        """After the ledger's begin and the restore: the job's earlier attempts (``AttemptEntry``) and where this
        one starts."""
        self.prior_cost_usd = prior_cost_usd
        self.figures = JobFigures(
            self.price,
            prior_attempts,
            step_at_start=step_at_start,
            fallback_tokens_per_step=self.fallback_tokens_per_step,
            rollouts_per_step=self.rollouts_per_step,
        )

    def attempt_cost_usd(self) -> float:
        return self.meter.attempt_cost_usd()

    def total_cost_usd(self) -> float:
        return self.prior_cost_usd + self.meter.attempt_cost_usd()

    def stop_reason(
        self, step: int, step_at_start: int, *, first_step_seconds: Optional[float], restarts: int
    ) -> Optional[str]:
        """Send the alerts due at ``step``; a reason to stop when the budget is spent. Runs every step.

        ``first_step_seconds``: this attempt's start-up (to the end of its first step), which the
        projection counts once per restart still to come, not once per step; ``restarts``: attempts before this one.
        """
        if self.guard is None:
            return None
        capped = self.spend.stop_reason(self.meter.attempt_cost_usd()) if self.spend is not None else None
        if capped:
            self.budget_stopped = True
            return capped
        total = self.total_cost_usd()
        # plain numbers: this runs every step, and an OmegaConf lookup costs tens of microseconds
        self.guard.check(
            total,
            steps_done=step,
            max_steps=self.max_steps,
            attempt_cost_usd=self.meter.attempt_cost_usd(),
            startup_cost_usd=self.meter.cost_usd(first_step_seconds),
            steps_this_attempt=step - step_at_start,
            restarts=restarts,
        )
        if self.guard.exhausted(total):
            self.budget_stopped = True
            return f"budget exhausted (${total:.4f} of ${self.budget_max_usd})"
        return None

    def projected_total_usd(
        self, step: int, *, max_steps: int, step_at_start: int, first_step_seconds: Optional[float], restarts: int
    ) -> Optional[float]:
        """The job's projected total at ``step`` (``budget.projected_total_usd``, the figure the projection
        alert uses), for the progress display; None while there is too little to project from."""
        from orchestrator.money.budget import projected_total_usd

        return projected_total_usd(
            spent_usd=self.total_cost_usd(),
            step=step,
            max_steps=max_steps,
            attempt_usd=self.meter.attempt_cost_usd(),
            startup_usd=self.meter.cost_usd(first_step_seconds),
            steps_this_attempt=step - step_at_start,
            restarts=restarts,
        )

    def wait_for_alerts(self) -> bool:
        """True when no alert is still being sent."""
        return self.guard is None or self.guard.wait_for_delivery()

    def cost_figures(
        self,
        step: int,
        *,
        steps: Any,
        upload_seconds: float,
        window_step_seconds: Optional[float] = None,
        ledger: Any = None,
    ) -> dict:
        """Cost, GPU-hours, tokens, lost work, savings and checkpoint time at ``step``; ``steps`` (the attempt's
        ``StepClock``) has the step timing and the save stalls. With ``ledger`` (after the attempt ended) the
        totals are the ledger's (a ``LedgerRecord``: ``AttemptRecord.end``)."""
        stall = sum(steps.save_stall_seconds)
        overrides = {}
        if ledger is not None:
            attempts = ledger.attempts
            overrides = dict(
                total_cost_usd=ledger.cost_usd,
                attempts=len(attempts),
                preemptions=sum(a.exit_class in INTERRUPTED_CLASSES for a in attempts),
            )
        return cast(JobFigures, self.figures).figures(  # set by begin
            step=step,
            attempt_cost_usd=self.meter.attempt_cost_usd(),
            attempt_gpu_hours=self.meter.gpu_hours(),
            mean_step_seconds=steps.steady_seconds_per_step(),
            window_step_seconds=window_step_seconds,
            checkpoint_stall_seconds=stall,
            checkpoint_upload_seconds=upload_seconds,
            **overrides,
        )


def startup_to_come_s(startup_s: float, spent_usd: float, usd_per_second: float) -> float:
    """Seconds of the start-up (process start to first step: ``startup_s``) still ahead of an attempt that has
    spent ``spent_usd`` since its process started."""
    elapsed = spent_usd / usd_per_second if usd_per_second > 0 else 0.0
    return max(0.0, float(startup_s) - elapsed)


def start_up_refusal(
    max_usd: Optional[float], *, prior_usd: float, spent_usd: float, usd_per_second: float, startup_s: float
) -> Optional[str]:
    """Why ``budget.max_usd`` cannot carry an attempt through the start-up still ahead of it (``startup_s``: process
    start to first step, ``AttemptRecord.startup_seconds``), or None: a step is the first moment the guard can
    stop it, so it would pass the budget by that start-up. ``prior_usd``: the job's earlier attempts."""
    if max_usd is None:
        return None
    to_come = usd_per_second * startup_to_come_s(startup_s, spent_usd, usd_per_second)
    left = float(max_usd) - prior_usd - spent_usd
    if to_come <= 0 or left >= to_come:
        return None
    return (
        f"budget nearly spent: ${max(0.0, left):.6f} left of budget.max_usd=${max_usd}, less than the start-up "
        f"still ahead of this attempt (${to_come:.6f}: {startup_s:.1f} s from process start to first step, the "
        "job's last measured), so it stops before loading the model; raise budget.max_usd to let the job go on "
        "from its last checkpoint"
    )


class SpendWatch:
    """The attempt's hold on the store's spend index (``orchestrator.money.spend``): main rank only.

    ``begin`` reserves the start-up still to come (the job's last measured start to first step, less what
    the process has run) and one window (``budget.reserve_ahead``) at this attempt's price, or raises
    BudgetExhausted when a cap is spent or leaves less than that start-up (before the model's load: a step is the
    first moment a running attempt can stop, so a start-up the grant does not cover would pass the cap);
    ``stop_reason``, every step, extends the reservation when half a window is left (one
    conditional write), sends the caps' alerts once each, and says stop once the attempt's spend
    reaches its reservation and the caps grant no more; ``settle`` at the end.

    Args:
        index: ``orchestrator.money.spend.SpendIndex`` for this job.
        usd_per_second: this attempt's price.
        window_s: ``budget.reserve_ahead`` in seconds.
        spent: the attempt's spend so far (its cost meter).
        guards: ``(scope kind, BudgetGuard)`` per cap set: "monthly" or "experiment" (``with_alerts``).
        hold: the start-up hold its supervisor took before this process started (``ORCH_START_HOLD``,
            ``orchestrator.money.spend_holds``), which ``begin`` takes over; None when no launcher took one.
    """

    def __init__(
        self,
        index: Any,
        *,
        usd_per_second: float,
        window_s: float,
        spent: Callable[[], float],
        guards: Sequence[Any] = (),
        hold: Optional[str] = None,
    ):
        self.index = index
        self.hold = hold
        self.usd_per_second = max(0.0, float(usd_per_second))
        self.window_usd = self.usd_per_second * max(0.0, float(window_s))
        self.spent = spent
        self.guards = list(guards)
        self.fence: Optional[int] = None
        self.through = 0.0
        self.capped = False  # the last grant was cut short by a cap: ask again only when it is used up
        self.refusal: Optional[str] = None
        self.unreadable: Optional[str] = None  # a job with no cap under a corrupt index: why it stopped writing there

    @property
    def has_caps(self) -> bool:
        caps = self.index.caps
        return caps.monthly_max_usd is not None or caps.experiment_max_usd is not None

    def _unless_corrupt(self, call: Callable[[], Any]) -> Any:
        """``call()``; a corrupt index (SpendIndexCorrupt) is raised for a job with a cap, and for one with
        none said once, after which this watch leaves the index alone (None)."""
        from orchestrator.money.spend import SpendIndexCorrupt

        if self.unreadable is not None:
            return None
        try:
            return call()
        except SpendIndexCorrupt as err:
            if self.has_caps:
                raise
            self.unreadable = str(err)
            log.warning("%s. This job has no spend cap, so it runs on without recording its spend there", err)
            return None

    def start_refusal(self, vanished_usd: Optional[dict] = None) -> Optional[Exception]:
        """Before the attempt takes a fence: why a cap forbids it to start (BudgetExhausted, with the numbers;
        SpendIndexCorrupt when a capped job's index is unreadable), or None. ``vanished_usd``: as ``begin``'s."""
        from orchestrator.money.spend import SpendIndexCorrupt

        try:
            reason = self._unless_corrupt(lambda: self.index.refusal(vanished_usd, hold=self.hold))
        except SpendIndexCorrupt as err:
            return err
        return BudgetExhausted(reason) if reason else None

    def begin(self, fence: int, *, startup_s: float = 0.0, vanished_usd: Optional[dict] = None) -> None:
        """``vanished_usd``: the job's earlier attempts' costs in the ledger (fence -> $), which settle
        the open entries of attempts that vanished."""
        self.fence = fence
        spent = self.spent()
        to_come = self.usd_per_second * startup_to_come_s(startup_s, spent, self.usd_per_second)
        ahead = self.window_usd + to_come
        grant = self._unless_corrupt(
            lambda: self.index.reserve(fence, spent, spent + ahead, vanished_usd=vanished_usd, hold=self.hold)
        )
        if grant is None:
            return
        self._take(grant, spent, ahead)
        if grant.through <= spent and ahead > 0:  # another job took the last dollars since the ledger's check
            raise BudgetExhausted(grant.refusal or f"spend cap reached: {self.index.where} grants this job nothing")
        if grant.through < spent + to_come - 1e-12:  # it would pass the cap before its first step could stop it
            raise BudgetExhausted(
                f"spend cap nearly reached: the caps on {self.index.where} leave this attempt "
                f"${grant.through - spent:.6f}, less than the start-up still ahead of it (${to_come:.6f}: "
                f"{startup_s:.1f} s from process start to first step: compute.restart_seconds, else "
                "the job's last measured, else the start prior), so it stops before loading the model. "
                f"{grant.refusal or 'Raise the cap (budget.monthly_max_usd, budget.experiment_max_usd)'} "
                "to go on from the last checkpoint"
            )

    def stop_reason(self, spent: float) -> Optional[str]:
        if self.fence is None or self.window_usd <= 0:
            return None
        if spent < self.through and (self.capped or spent < self.through - self.window_usd / 2):
            return None  # the cheap path: most steps end here
        if self.unreadable is not None:
            return None
        from orchestrator.money.spend import SpendIndexCorrupt

        try:
            self._unless_corrupt(
                lambda: self._take(
                    self.index.reserve(self.fence, spent, spent + self.window_usd), spent, self.window_usd
                )
            )
        except SpendIndexCorrupt as err:  # a cap it cannot check: stop at the final checkpoint (exit 3)
            return str(err)
        if self.unreadable is not None or spent < self.through:
            return None
        return self.refusal or (
            f"spend cap reached: the spend index {self.index.where} grants this job no more "
            f"than ${self.through:.4f} this attempt"
        )

    def with_alerts(self, budget_cfg: Any, sinks: list) -> "SpendWatch":
        """Add the 50/80/100% alerts (``budget.alert_thresholds``) of each cap set, once each for every job under it."""
        from orchestrator.config.schema import BudgetConfig
        from orchestrator.money.budget import BudgetGuard
        from orchestrator.money.spend import month_of

        caps = self.index.caps
        for kind, max_usd, key in (
            ("monthly", caps.monthly_max_usd, "budget.monthly_max_usd"),
            ("experiment", caps.experiment_max_usd, "budget.experiment_max_usd"),
        ):
            if max_usd is None:
                continue
            scope = month_of(self.index.clock()) if kind == "monthly" else caps.experiment
            subject = (
                f"every job under {self.index.where} in {scope} (UTC)"
                if kind == "monthly"
                else f"experiment {scope!r} under {self.index.where}"
            )
            limits = BudgetConfig(
                max_usd=max_usd, alert_thresholds=list(budget_cfg.alert_thresholds), projection_alert=False
            )

            def record_alert(name: str, scope: Any = scope) -> Any:
                return self.index.record_alert(scope, name)

            self.guards.append(
                (
                    kind,
                    BudgetGuard(
                        limits,
                        record_alert=record_alert,
                        sinks=sinks,
                        job_name=caps.run_name,
                        prefix=f"{kind}_cap",
                        subject=subject,
                        budget_key=key,
                    ),
                )
            )
        return self

    def settle(self, spent: float) -> None:
        if self.fence is not None and self.unreadable is None:
            self.index.settle(self.fence, spent)

    def _take(self, grant, spent: float, asked: float) -> None:
        self.capped = grant.through < spent + asked - 1e-12
        self.through = grant.through
        self.refusal = grant.refusal
        for kind, guard in self.guards:
            # alerts tell money spent, never reservations (a cap's stop counts those)
            guard.check(
                grant.month_spent_usd if kind == "monthly" else grant.experiment_spent_usd, steps_done=0, max_steps=0
            )
