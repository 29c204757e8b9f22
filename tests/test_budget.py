"""Budget alerts: each threshold once per job, the projection early, webhooks that never hurt training."""
from __future__ import annotations

import logging
import socket

import pytest

from orchestrator.budget import BudgetGuard, LogSink, MlflowTagSink, WebhookSink
from orchestrator.config import BudgetConfig
from tests.webhooks import WebhookReceiver


@pytest.fixture
def receiver():
    r = WebhookReceiver(path="/hooks/T000/B000/SECRETPATH")
    yield r
    r.close()


class LedgerAlerts:
    """Stands in for the ledger's record_alert: True only the first time per name, job-wide."""

    def __init__(self):
        self.names: list[str] = []

    def __call__(self, name: str) -> bool:
        if name in self.names:
            return False
        self.names.append(name)
        return True


def _guard(cfg, ledger, sinks):
    return BudgetGuard(cfg, record_alert=ledger, sinks=sinks, job_name="exp1")


def test_each_threshold_alert_reaches_the_webhook_exactly_once_across_two_attempts(receiver):
    cfg = BudgetConfig(max_usd=10.0, webhook_url=receiver.url, projection_alert=False)
    ledger = LedgerAlerts()
    first_sink = WebhookSink(receiver.url, backoff_initial_s=0.05)
    first = _guard(cfg, ledger, [first_sink])
    for cost in [1.0, 5.0, 5.5, 6.0, 8.1, 8.2]:  # many checks past 50% and 80%
        first.check(cost, steps_done=1, max_steps=100, recent_usd_per_step=None)
    assert first_sink.wait(10)
    # Attempt 2 (after a preemption) is a fresh process with the same ledger.
    second_sink = WebhookSink(receiver.url, backoff_initial_s=0.05)
    second = _guard(cfg, ledger, [second_sink])
    for cost in [8.3, 9.0, 10.0, 10.5, 11.0]:
        second.check(cost, steps_done=1, max_steps=100, recent_usd_per_step=None)
    assert second_sink.wait(10)

    texts = [b["text"] for b in receiver.bodies]
    assert sorted(t.split("]")[0].lstrip("[") for t in texts) == ["budget_100", "budget_50", "budget_80"]
    assert any("$10.00" in t and "exp1" in t for t in texts)
    assert second.exhausted(10.0) and not second.exhausted(9.99)


def test_projection_alert_fires_before_any_threshold():
    ledger = LedgerAlerts()
    guard = _guard(BudgetConfig(max_usd=10.0), ledger, [])
    # $1 spent over 20 of 500 steps: 480 more at $0.05 = $25 projected
    alerts = guard.check(1.0, steps_done=20, max_steps=500, recent_usd_per_step=0.05)
    assert [a.name for a in alerts] == ["budget_projection"]
    assert alerts[0].projected_usd == pytest.approx(25.0)
    assert "budget.max_usd" in alerts[0].message
    assert guard.check(1.1, steps_done=22, max_steps=500, recent_usd_per_step=0.05) == []


def test_projection_under_budget_stays_quiet():
    guard = _guard(BudgetConfig(max_usd=10.0), LedgerAlerts(), [])
    assert guard.check(1.0, steps_done=50, max_steps=100, recent_usd_per_step=0.02) == []


def test_no_budget_never_alerts():
    ledger = LedgerAlerts()
    guard = _guard(BudgetConfig(max_usd=None), ledger, [])
    assert guard.check(1e6, steps_done=1, max_steps=10, recent_usd_per_step=100.0) == []
    assert not guard.exhausted(1e6)
    assert ledger.names == []


def test_ledger_is_asked_once_per_name_per_attempt():
    calls = []

    def record_alert(name):
        calls.append(name)
        return False  # already fired by an earlier attempt

    guard = _guard(BudgetConfig(max_usd=10.0, projection_alert=False), record_alert, [])
    for _ in range(50):
        assert guard.check(6.0, steps_done=1, max_steps=10, recent_usd_per_step=None) == []
    assert calls == ["budget_50"]


def test_failing_ledger_does_not_stop_training_and_is_asked_again():
    state = {"fail": True}

    def record_alert(name):
        if state["fail"]:
            raise ConnectionError("storage down")
        return True

    guard = _guard(BudgetConfig(max_usd=10.0, projection_alert=False), record_alert, [])
    assert guard.check(6.0, steps_done=1, max_steps=10, recent_usd_per_step=None) == []
    state["fail"] = False
    assert [a.name for a in guard.check(6.0, steps_done=1, max_steps=10, recent_usd_per_step=None)] == ["budget_50"]


def test_webhook_returning_500_is_retried_then_logged_never_raised(caplog):
    receiver = WebhookReceiver(status=500)
    try:
        sink = WebhookSink(receiver.url, attempts=3, backoff_initial_s=0.05)
        guard = _guard(BudgetConfig(max_usd=10.0, projection_alert=False), LedgerAlerts(), [sink])
        with caplog.at_level(logging.ERROR, logger="orchestrator.budget"):
            alerts = guard.check(5.0, steps_done=1, max_steps=10, recent_usd_per_step=None)
            assert sink.wait(10)
        assert [a.name for a in alerts] == ["budget_50"]
        assert len(receiver.bodies) == 3  # retried
        assert "could not be delivered" in caplog.text and "HTTP 500" in caplog.text
        assert "SECRETPATH" not in caplog.text  # the webhook URL is a credential
    finally:
        receiver.close()


def test_webhook_refusing_connections_never_raises(caplog):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sink = WebhookSink(f"http://127.0.0.1:{port}/hook", attempts=2, backoff_initial_s=0.05, timeout_s=1)
    guard = _guard(BudgetConfig(max_usd=10.0, projection_alert=False), LedgerAlerts(), [LogSink(), sink])
    with caplog.at_level(logging.WARNING, logger="orchestrator.budget"):
        alerts = guard.check(8.0, steps_done=1, max_steps=10, recent_usd_per_step=None)
        assert sink.wait(10)
    assert [a.name for a in alerts] == ["budget_50", "budget_80"]
    assert "budget alert: [budget_80]" in caplog.text  # the log sink still got it
    assert "ConnectionError" in caplog.text


def test_a_raising_sink_does_not_stop_the_others():
    tags = {}

    class Broken:
        def send(self, alert):
            raise RuntimeError("boom")

    guard = _guard(BudgetConfig(max_usd=10.0, projection_alert=False), LedgerAlerts(), [Broken(), MlflowTagSink(tags.__setitem__)])
    guard.check(5.0, steps_done=1, max_steps=10, recent_usd_per_step=None)
    assert "alert.budget_50" in tags


def test_webhook_named_by_an_environment_variable_gets_the_alert(receiver, monkeypatch):
    """budget.webhook_url_env: the config names a variable, the URL (a credential) stays out of the config."""
    from orchestrator.budget import default_sinks

    monkeypatch.setenv("TEST_SLACK_WEBHOOK", receiver.url)
    cfg = BudgetConfig(max_usd=10.0, webhook_url_env="TEST_SLACK_WEBHOOK", projection_alert=False)
    sinks = default_sinks(cfg)
    hooks = [s for s in sinks if isinstance(s, WebhookSink)]
    assert len(hooks) == 1
    guard = _guard(cfg, LedgerAlerts(), sinks)
    guard.check(6.0, steps_done=1, max_steps=100, recent_usd_per_step=None)
    assert hooks[0].wait(10)
    assert [b["text"].split("]")[0] for b in receiver.bodies] == ["[budget_50"]
