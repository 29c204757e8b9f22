"""Budget thresholds, the projected-total alert, and where alerts go.

:class:`BudgetGuard` is asked after each metering tick whether the job's spend
crossed a threshold or is projected to overrun. Each alert is sent at most once
per job: the guard asks ``record_alert(name)`` -- backed by the ledger in
object storage, so it holds across attempts and machines -- and sends only when
that answers True. Sinks never raise into training: a broken webhook is logged.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Protocol

log = logging.getLogger(__name__)

PROJECTION_ALERT = "budget_projection"
# Steps after an attempt's first one that the projection waits for: the first step carries the
# start-up (imports, model load, restore, the "before" evaluation) and says nothing of the rate.
MIN_STEADY_STEPS = 3


def spend_caps(budget: Any, run_name: str, experiment: str) -> Any:
    """The spend caps (``money.spend.Caps``) a job named ``run_name`` of ``experiment`` is under: ``budget``'s
    monthly and experiment caps (``budget.monthly_max_usd``, ``budget.experiment_max_usd``; None: no cap). The one
    place a cap of the config becomes the spend index's."""
    from orchestrator.money.spend import Caps

    return Caps(
        run_name, experiment, monthly_max_usd=budget.monthly_max_usd, experiment_max_usd=budget.experiment_max_usd
    )


def threshold_alert_name(fraction: float, prefix: str = "budget") -> str:
    """0.5 -> 'budget_50', 1.0 -> 'budget_100': the ledger keys on this name (the spend caps' on 'monthly_cap_50')."""
    return f"{prefix}_{round(fraction * 100):d}"


@dataclass(frozen=True)
class Alert:
    name: str
    message: str
    total_cost_usd: float
    max_usd: float
    projected_usd: Optional[float] = None


class Sink(Protocol):
    def send(self, alert: Alert) -> None: ...


class BudgetGuard:
    """Fires budget alerts once per job.

    Args:
        budget_cfg: ``orchestrator.config.schema.BudgetConfig`` (max_usd None: no budget, no alerts).
        record_alert: ``name -> bool``, True only the first time ``name`` is
            recorded for the whole job (all attempts).
        sinks: objects with ``send(alert)``; each is called in turn and its
            exceptions are logged, never raised.
        job_name: for the alert text.
        prefix: the alerts' names (``<prefix>_50``); the spend caps use ``monthly_cap`` and ``experiment_cap``.
        subject: who spends, for the alert text (default: ``job '<job_name>'``); ``budget_key``: the key to raise.
    """

    def __init__(
        self,
        budget_cfg: Any,
        *,
        record_alert: Callable[[str], bool],
        sinks: Iterable[Sink],
        job_name: str = "job",
        prefix: str = "budget",
        subject: Optional[str] = None,
        budget_key: str = "budget.max_usd",
    ):
        self.max_usd: Optional[float] = None if budget_cfg.max_usd is None else float(budget_cfg.max_usd)
        self.thresholds = sorted(float(t) for t in (budget_cfg.alert_thresholds or []))
        self.projection_alert = bool(budget_cfg.projection_alert)
        self.job_name = job_name
        self.prefix = prefix
        self.subject = subject or f"job {job_name!r}"
        self.budget_key = budget_key
        self._record_alert = record_alert
        self._sinks = list(sinks)
        # Names already decided in this process. The ledger is the authority, but
        # asking it (a conditional write to object storage) on every step would be
        # slow and costly, so each name is asked about at most once per guard.
        self._decided: set[str] = set()

    def exhausted(self, total_cost_usd: float) -> bool:
        return self.max_usd is not None and total_cost_usd >= self.max_usd

    def check(
        self,
        total_cost_usd: float,
        *,
        steps_done: int,
        max_steps: int,
        attempt_cost_usd: Optional[float] = None,
        startup_cost_usd: Optional[float] = None,
        steps_this_attempt: int = 0,
        restarts: int = 0,
    ) -> list[Alert]:
        """Return (and send) the alerts that fire now for the first time in this job.

        Args:
            total_cost_usd: the job's spend so far (all attempts).
            steps_done: the job's optimizer step; max_steps: where it ends.
            attempt_cost_usd, startup_cost_usd, steps_this_attempt, restarts: this attempt's
                figures for the projection (see :func:`projected_total_usd`); None: no projection.
        """
        if self.max_usd is None:
            return []
        fired = []
        for fraction in self.thresholds:
            if total_cost_usd >= fraction * self.max_usd:
                name = threshold_alert_name(fraction, self.prefix)
                message = (
                    f"[{name}] {self.subject} has spent ${total_cost_usd:,.2f} of its "
                    f"${self.max_usd:,.2f} budget ({self.budget_key}; {total_cost_usd / self.max_usd:.0%})"
                    + ("; it stops at the next checkpoint." if fraction >= 1.0 else ".")
                )
                fired += self._fire(Alert(name, message, total_cost_usd, self.max_usd))
        if self.projection_alert and PROJECTION_ALERT not in self._decided:
            projected = projected_total_usd(
                spent_usd=total_cost_usd,
                step=steps_done,
                max_steps=max_steps,
                attempt_usd=attempt_cost_usd,
                startup_usd=startup_cost_usd,
                steps_this_attempt=steps_this_attempt,
                restarts=restarts,
            )
            if projected is not None and projected > self.max_usd:
                message = (
                    f"[{PROJECTION_ALERT}] job {self.job_name!r} is projected to cost ${projected:,.2f} "
                    f"(spent ${total_cost_usd:,.2f} at step {steps_done}/{max_steps}), over its "
                    f"${self.max_usd:,.2f} budget. Raise budget.max_usd or lower train.max_steps."
                )
                fired += self._fire(Alert(PROJECTION_ALERT, message, total_cost_usd, self.max_usd, projected))
        return fired

    def wait_for_delivery(self, timeout_s: float = 15.0) -> bool:
        """Wait for alerts still being sent (webhooks post from daemon threads, which die with the
        process). The worker calls this before it exits. True if nothing is left in flight."""
        deadline = time.monotonic() + timeout_s
        done = True
        for sink in self._sinks:
            wait = getattr(sink, "wait", None)
            if wait is not None:
                done = wait(max(0.0, deadline - time.monotonic())) and done
        return done

    def _fire(self, alert: Alert) -> list[Alert]:
        if alert.name in self._decided:
            return []
        try:
            first_time = bool(self._record_alert(alert.name))
        except Exception:  # the ledger being unreachable must not stop training
            log.exception("could not record alert %s; will ask again at the next check", alert.name)
            return []
        self._decided.add(alert.name)
        if not first_time:
            return []
        for sink in self._sinks:
            try:
                sink.send(alert)
            except Exception:
                log.exception("alert sink %s failed for %s", type(sink).__name__, alert.name)
        return [alert]


def projected_total_usd(
    *,
    spent_usd: float,
    step: int,
    max_steps: int,
    attempt_usd: Optional[float],
    startup_usd: Optional[float],
    steps_this_attempt: int,
    restarts: int = 0,
) -> Optional[float]:
    """What the job will have cost when it reaches ``max_steps``, from the steady-state rate.

    projected = spent + remaining x steady cost per step + expected start-ups x start-up cost

    - start-up cost (``startup_usd``): this attempt's cost from its start to the end of its
      first step -- imports, model load, download and restore, the "before" evaluation, the
      first step's warm-up. Paid once per attempt, so it is not a per-step cost.
    - steady cost per step: (``attempt_usd`` - start-up cost) / (steps_this_attempt - 1), the
      steps after the first one; checkpoint saves and logging between them are included.
    - expected start-ups: the attempts still to come, each paying the start-up again,
      estimated from the job's own interruption rate: ``restarts`` (attempts before this one)
      per dollar spent so far, times what the remaining steps will cost. The price per hour is
      fixed, so that is restarts per machine-hour times the hours to go. A job never
      interrupted projects none.

    Lost work (steps redone after an interruption) is not projected.

    Args:
        spent_usd: the job's spend so far, all attempts.
        step: the job's optimizer step now; max_steps: its last step.
        attempt_usd: this attempt's cost so far; startup_usd: its cost at its first step.
        steps_this_attempt: optimizer steps this attempt has done (its first included).
        restarts: attempts of the job before this one.

    Returns None while there is nothing to project from: no start-up figure yet, fewer than
    ``MIN_STEADY_STEPS`` steps after the first, or no step limit (``max_steps <= 0``).
    """
    if attempt_usd is None or startup_usd is None or max_steps <= 0:
        return None
    steady_steps = steps_this_attempt - 1
    if steady_steps < MIN_STEADY_STEPS:
        return None
    usd_per_step = max(0.0, attempt_usd - startup_usd) / steady_steps
    remaining = max(0, max_steps - step)
    steps_usd = remaining * usd_per_step
    startups_to_come = restarts * steps_usd / spent_usd if spent_usd > 0 else 0.0
    return spent_usd + steps_usd + startups_to_come * startup_usd


class LogSink:
    """One WARNING line per alert in the job's log."""

    def __init__(self, logger: Optional[logging.Logger] = None):
        self._log = logger or log

    def send(self, alert: Alert) -> None:
        self._log.warning("budget alert: %s", alert.message)


class MlflowTagSink:
    """Marks the MLflow run: ``alert.<name>`` = the message (``set_tag(key, value)`` is given)."""

    def __init__(self, set_tag: Callable[[str, str], Any]):
        self._set_tag = set_tag

    def send(self, alert: Alert) -> None:
        self._set_tag(f"alert.{alert.name}", alert.message)


class WebhookSink:
    """POSTs Slack-compatible ``{"text": message}`` to ``url`` from a background thread.

    Retries connection errors, 429 and 5xx with exponential backoff; gives up
    after ``attempts`` tries and logs it. ``send`` returns at once. The URL is a
    credential (Slack's carry a token in the path), so logs show only its host.
    """

    def __init__(self, url: str, *, timeout_s: float = 5.0, attempts: int = 4, backoff_initial_s: float = 1.0):
        self.url = url
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self.backoff_initial_s = backoff_initial_s
        self._threads: list[threading.Thread] = []
        self._host = urllib.parse.urlsplit(url).hostname or "webhook"

    def send(self, alert: Alert) -> None:
        thread = threading.Thread(target=self._deliver, args=(alert,), name=f"webhook-{alert.name}", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def wait(self, timeout_s: float = 30.0) -> bool:
        """Wait for deliveries in flight (end of job, tests). True if none is left."""
        deadline = time.monotonic() + timeout_s
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _deliver(self, alert: Alert) -> None:
        import requests

        body = json.dumps({"text": alert.message})
        delay = self.backoff_initial_s
        problem = "no attempt made"
        for attempt in range(1, self.attempts + 1):
            try:
                response = requests.post(
                    self.url, data=body, headers={"Content-Type": "application/json"}, timeout=self.timeout_s
                )
                if response.status_code < 300:
                    log.info("budget alert %s delivered to webhook at %s", alert.name, self._host)
                    return
                problem = f"HTTP {response.status_code}"
                if response.status_code < 500 and response.status_code != 429:
                    break  # a 4xx other than 429 will not get better by retrying
            except Exception as err:  # connection refused, DNS, timeout: all retryable
                problem = type(err).__name__
            if attempt < self.attempts:
                time.sleep(delay)
                delay *= 2
        log.error(
            "budget alert %s could not be delivered to the webhook at %s (%s after %d tries); "
            "check budget.webhook_url. Training continues.",
            alert.name,
            self._host,
            problem,
            attempt,
        )


def default_sinks(budget_cfg: Any, *, set_tag: Optional[Callable[[str, str], Any]] = None) -> list[Sink]:
    """The sinks a job uses: the log always, MLflow tags when tracking, the webhook when configured."""
    sinks: list[Sink] = [LogSink()]
    if set_tag is not None:
        sinks.append(MlflowTagSink(set_tag))
    url = webhook_url(budget_cfg)
    if url:
        sinks.append(WebhookSink(url))
    return sinks


def webhook_url(budget_cfg: Any) -> Optional[str]:
    """The alert webhook: ``$<budget.webhook_url_env>`` when that names a variable, else ``budget.webhook_url``.

    A variable named but unset gives no webhook (launch refuses that case; see launch_checks.validate).
    """
    name = budget_cfg.webhook_url_env
    if name:
        return os.environ.get(name) or None
    return budget_cfg.webhook_url or None
