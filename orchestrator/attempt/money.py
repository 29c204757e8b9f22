"""The attempt's money watch: what it costs so far, whether the budget stops it, the cost figures.

One object per attempt, built with the price of its compute. The budget guard
(alerts and the hard stop) exists on the main rank only; other ranks get the
same watch with no guard, so they never alert or stop on their own (the main
rank's decision reaches them through the callback's broadcast).
"""
from __future__ import annotations

from typing import Any, Optional

from orchestrator.cost import CostMeter, Price
from orchestrator.cost_report import JobFigures, estimated_tokens_per_step
from orchestrator.exitcodes import INTERRUPTED_CLASSES


class MoneyWatch:
    """Args:
        price: this attempt's price (``orchestrator.cost.price_for``).
        max_steps: ``train.max_steps`` (for the projected total).
        budget_max_usd: the hard stop, or None.
        fallback_tokens_per_step: tokens per optimizer step until the Trainer logs its own count.
    """

    def __init__(self, price: Price, *, max_steps: int, budget_max_usd: Optional[float], fallback_tokens_per_step: int):
        self.price = price
        self.meter = CostMeter(price)
        self.max_steps = int(max_steps)
        self.budget_max_usd = budget_max_usd
        self.fallback_tokens_per_step = fallback_tokens_per_step
        self.guard = None  # the budget guard, main rank only: set by watch_budget()
        self.prior_cost_usd = 0.0
        self.budget_stopped = False
        self.figures: Optional[JobFigures] = None

    @classmethod
    def from_config(cls, cfg: Any, price: Price) -> "MoneyWatch":
        return cls(price, max_steps=cfg.train.max_steps, budget_max_usd=cfg.budget.max_usd,
                   fallback_tokens_per_step=estimated_tokens_per_step(cfg))

    def watch_budget(self, guard) -> None:
        self.guard = guard

    def start(self, prior_attempts: list[dict], prior_cost_usd: float, step_at_start: int) -> None:
        """After the ledger's begin and the restore: the job's earlier attempts and where this one starts."""
        self.prior_cost_usd = prior_cost_usd
        self.figures = JobFigures(self.price, prior_attempts, step_at_start=step_at_start,
                                  fallback_tokens_per_step=self.fallback_tokens_per_step)

    def attempt_cost_usd(self) -> float:
        return self.meter.attempt_cost_usd()

    def total_cost_usd(self) -> float:
        return self.prior_cost_usd + self.meter.attempt_cost_usd()

    def stop_reason(self, step: int, step_at_start: int, *, first_step_seconds: Optional[float],
                    restarts: int) -> Optional[str]:
        """Send the alerts due at ``step``; a reason to stop when the budget is spent. Runs every step.

        ``first_step_seconds``: this attempt's start-up (to the end of its first step), which the
        projection counts once per restart still to come, not once per step; ``restarts``: attempts before this one.
        """
        if self.guard is None:
            return None
        total = self.total_cost_usd()
        # plain numbers: this runs every step, and an OmegaConf lookup costs tens of microseconds
        self.guard.check(total, steps_done=step, max_steps=self.max_steps,
                         attempt_cost_usd=self.meter.attempt_cost_usd(),
                         startup_cost_usd=self.meter.cost_usd(first_step_seconds),
                         steps_this_attempt=step - step_at_start, restarts=restarts)
        if self.guard.exhausted(total):
            self.budget_stopped = True
            return f"budget exhausted (${total:.4f} of ${self.budget_max_usd})"
        return None

    def projected_total_usd(self, step: int, *, max_steps: int, step_at_start: int,
                            first_step_seconds: Optional[float], restarts: int) -> Optional[float]:
        """The job's projected total at ``step`` (``budget.projected_total_usd``, the figure the projection
        alert uses), for the progress display; None while there is too little to project from."""
        from orchestrator.budget import projected_total_usd

        return projected_total_usd(spent_usd=self.total_cost_usd(), step=step, max_steps=max_steps,
                                   attempt_usd=self.meter.attempt_cost_usd(),
                                   startup_usd=self.meter.cost_usd(first_step_seconds),
                                   steps_this_attempt=step - step_at_start, restarts=restarts)

    def wait_for_alerts(self) -> bool:
        """True when no alert is still being sent."""
        return self.guard is None or self.guard.wait_for_delivery()

    def cost_figures(self, step: int, *, callback: Any, upload_seconds: float,
                     window_step_seconds: Optional[float] = None, ledger: Optional[dict] = None) -> dict:
        """Cost, GPU-hours, tokens, lost work, savings and checkpoint time at ``step``; ``callback`` (the
        Trainer callback, or None before it exists) has the step timing and the save stalls. With ``ledger``
        (after the attempt ended) the totals are the ledger's."""
        whole = callback.timing_metrics(reset=False, whole_run=True) if callback is not None else {}
        stall = sum(callback.save_stall_seconds) if callback is not None else 0.0
        overrides = {}
        if ledger is not None:
            attempts = ledger["attempts"]
            overrides = dict(total_cost_usd=float(ledger["cost_usd"]), attempts=len(attempts),
                             preemptions=sum(a["exit_class"] in INTERRUPTED_CLASSES for a in attempts))
        return self.figures.figures(
            step=step, attempt_cost_usd=self.meter.attempt_cost_usd(), attempt_gpu_hours=self.meter.gpu_hours(),
            mean_step_seconds=whole.get("step_time_s"), window_step_seconds=window_step_seconds,
            checkpoint_stall_seconds=stall, checkpoint_upload_seconds=upload_seconds, **overrides)
