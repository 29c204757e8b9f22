"""Budget alerts: each threshold once per job, the projection early, webhooks that never hurt training."""
from __future__ import annotations

import logging
import re

import pytest

from orchestrator.money.budget import BudgetGuard, LogSink, MlflowTagSink, WebhookSink, projected_total_usd
from orchestrator.config.schema import BudgetConfig
from tests.helpers import jobs
from tests.helpers.webhooks import WebhookReceiver
from tests.helpers.net import free_port


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
        first.check(cost, steps_done=1, max_steps=100)
    assert first_sink.wait(10)
    # Attempt 2 (after a preemption) is a fresh process with the same ledger.
    second_sink = WebhookSink(receiver.url, backoff_initial_s=0.05)
    second = _guard(cfg, ledger, [second_sink])
    for cost in [8.3, 9.0, 10.0, 10.5, 11.0]:
        second.check(cost, steps_done=1, max_steps=100)
    assert second_sink.wait(10)

    texts = [b["text"] for b in receiver.bodies]
    assert sorted(t.split("]")[0].lstrip("[") for t in texts) == ["budget_100", "budget_50", "budget_80"]
    assert any("$10.00" in t and "exp1" in t for t in texts)
    assert second.exhausted(10.0) and not second.exhausted(9.99)


def test_projection_alert_fires_before_any_threshold():
    ledger = LedgerAlerts()
    guard = _guard(BudgetConfig(max_usd=10.0), ledger, [])
    # $0.05 of start-up, then $0.05 per step for 19 more steps: $1 spent at step 20 of 500;
    # 480 more at $0.05 = $25 projected
    alerts = guard.check(1.0, steps_done=20, max_steps=500, attempt_cost_usd=1.0, startup_cost_usd=0.05,
                         steps_this_attempt=20)
    assert [a.name for a in alerts] == ["budget_projection"]
    assert alerts[0].projected_usd == pytest.approx(25.0)
    assert "budget.max_usd" in alerts[0].message
    assert guard.check(1.1, steps_done=22, max_steps=500, attempt_cost_usd=1.1, startup_cost_usd=0.05,
                       steps_this_attempt=22) == []


def test_projection_under_budget_stays_quiet():
    guard = _guard(BudgetConfig(max_usd=10.0), LedgerAlerts(), [])
    assert guard.check(1.0, steps_done=50, max_steps=100, attempt_cost_usd=1.0, startup_cost_usd=0.02,
                       steps_this_attempt=50) == []


def test_projection_leaves_the_start_up_out_of_the_rate():
    # $4 of start-up and $0.01 per step after it: at step 5 of 100 the job is headed for ~$5,
    # not for (attempt cost / steps) x 100 = $84
    projected = projected_total_usd(spent_usd=4.04, step=5, max_steps=100, attempt_usd=4.04, startup_usd=4.0,
                                    steps_this_attempt=5)
    assert projected == pytest.approx(4.04 + 95 * 0.01)
    guard = _guard(BudgetConfig(max_usd=10.0), LedgerAlerts(), [])
    assert guard.check(4.04, steps_done=5, max_steps=100, attempt_cost_usd=4.04, startup_cost_usd=4.0,
                       steps_this_attempt=5) == []


def test_projection_waits_for_steady_steps():
    # the first step is all start-up: nothing to project from until a few steps follow it
    for steps in (0, 1, 2, 3):
        assert projected_total_usd(spent_usd=5.0, step=steps, max_steps=1000, attempt_usd=5.0, startup_usd=4.9,
                                   steps_this_attempt=steps) is None
    assert projected_total_usd(spent_usd=5.0, step=4, max_steps=1000, attempt_usd=5.0, startup_usd=None,
                               steps_this_attempt=4) is None
    assert projected_total_usd(spent_usd=5.0, step=4, max_steps=0, attempt_usd=5.0, startup_usd=4.9,
                               steps_this_attempt=4) is None


def test_projection_charges_the_start_ups_the_next_attempts_will_pay():
    # attempt 3 of a job (2 restarts in its first $10) resumed at step 90: $2 start-up, $0.01/step.
    # 100 steps to go cost $1 of machine time: at 2 restarts per $10, 0.2 more start-ups at $2
    projected = projected_total_usd(spent_usd=10.0, step=100, max_steps=200, attempt_usd=2.09, startup_usd=2.0,
                                    steps_this_attempt=10, restarts=2)
    assert projected == pytest.approx(10.0 + 100 * 0.01 + 0.2 * 2.0)
    # three kills during loading, then 4 steps: the rate is per machine-hour, not per step reached
    early = projected_total_usd(spent_usd=8.0, step=4, max_steps=2004, attempt_usd=2.03, startup_usd=2.0,
                                steps_this_attempt=4, restarts=3)
    assert early == pytest.approx(8.0 + 20.0 + 3 * 20.0 / 8.0 * 2.0)
    resumed_in_place = projected_total_usd(spent_usd=10.0, step=100, max_steps=200, attempt_usd=2.09,
                                           startup_usd=2.0, steps_this_attempt=10, restarts=0)
    assert resumed_in_place == pytest.approx(10.0 + 100 * 0.01)


def test_no_budget_never_alerts():
    ledger = LedgerAlerts()
    guard = _guard(BudgetConfig(max_usd=None), ledger, [])
    assert guard.check(1e6, steps_done=10, max_steps=10, attempt_cost_usd=1e6, startup_cost_usd=1.0, steps_this_attempt=10) == []
    assert not guard.exhausted(1e6)
    assert ledger.names == []


def test_ledger_is_asked_once_per_name_per_attempt():
    calls = []

    def record_alert(name):
        calls.append(name)
        return False  # already fired by an earlier attempt

    guard = _guard(BudgetConfig(max_usd=10.0, projection_alert=False), record_alert, [])
    for _ in range(50):
        assert guard.check(6.0, steps_done=1, max_steps=10) == []
    assert calls == ["budget_50"]


def test_failing_ledger_does_not_stop_training_and_is_asked_again():
    state = {"fail": True}

    def record_alert(name):
        if state["fail"]:
            raise ConnectionError("storage down")
        return True

    guard = _guard(BudgetConfig(max_usd=10.0, projection_alert=False), record_alert, [])
    assert guard.check(6.0, steps_done=1, max_steps=10) == []
    state["fail"] = False
    assert [a.name for a in guard.check(6.0, steps_done=1, max_steps=10)] == ["budget_50"]


def test_webhook_returning_500_is_retried_then_logged_never_raised(caplog):
    receiver = WebhookReceiver(status=500)
    try:
        sink = WebhookSink(receiver.url, attempts=3, backoff_initial_s=0.05)
        guard = _guard(BudgetConfig(max_usd=10.0, projection_alert=False), LedgerAlerts(), [sink])
        with caplog.at_level(logging.ERROR, logger="orchestrator.money.budget"):
            alerts = guard.check(5.0, steps_done=1, max_steps=10)
            assert sink.wait(10)
        assert [a.name for a in alerts] == ["budget_50"]
        assert len(receiver.bodies) == 3  # retried
        assert "could not be delivered" in caplog.text and "HTTP 500" in caplog.text
        assert "SECRETPATH" not in caplog.text  # the webhook URL is a credential
    finally:
        receiver.close()


def test_webhook_refusing_connections_never_raises(caplog):
    port = free_port()  # a port nobody listens on
    sink = WebhookSink(f"http://127.0.0.1:{port}/hook", attempts=2, backoff_initial_s=0.05, timeout_s=1)
    guard = _guard(BudgetConfig(max_usd=10.0, projection_alert=False), LedgerAlerts(), [LogSink(), sink])
    with caplog.at_level(logging.WARNING, logger="orchestrator.money.budget"):
        alerts = guard.check(8.0, steps_done=1, max_steps=10)
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
    guard.check(5.0, steps_done=1, max_steps=10)
    assert "alert.budget_50" in tags


# ---- end to end: real jobs (python -m orchestrator.launch) and a real webhook receiver ----------
# compute.price_per_hour=3600 on the cpu preset: $1 per second of the attempt, start-up included.
USD_PER_SECOND = ["compute.price_per_hour=3600", "budget.alert_thresholds=[]"]


def _budgeted_job(tmp_path, receiver, *extra, env=None):
    storage = jobs.Storage(str(tmp_path / "runs"))
    overrides = jobs.with_overrides(jobs.FAST + storage.overrides() + USD_PER_SECOND,
                                    "run.name=budgeted", f"budget.webhook_url={receiver.url}", *extra)
    # started fresh, as a user's first attempt is: its start-up, which these tests weigh, includes the import
    done = jobs.run_job(overrides, tmp_path, env=jobs.job_env(tmp_path, env), timeout=600, fresh=True)
    out = done.stdout + done.stderr
    first_step = re.search(r"metered start-up: ([0-9.]+)s", out)
    assert first_step, out[-3000:]
    return done, out, float(first_step.group(1)), jobs.ledger(storage, "budgeted")


@pytest.mark.e2e
def test_start_up_alone_sets_off_no_projection_alert(tmp_path, receiver):
    """Seconds of start-up (the "before" evaluation made long), then 100 fast steps and no final
    evaluation: the job costs several times less than its $200, while start-up over one step, times 100
    steps, is several times more (the alert the issue saw at step 1)."""
    done, out, startup_usd, ledger = _budgeted_job(
        tmp_path, receiver, "train.max_steps=100", "budget.max_usd=200", "checkpoint.every=off",
        "train.eval_at_end=false", "data.num_examples=1000", "recipe.eval_generate_max_new_tokens=24",
        # no floor under the step time, and one thread: steps stay fast next to the start-up on a busy machine
        env={"ORCH_STEP_DELAY_SECONDS": "0", "OMP_NUM_THREADS": "1"})
    print(f"start-up ${startup_usd:.2f}, job ${ledger['cost_usd']:.2f}")
    assert done.returncode == 0, out[-3000:]
    assert ledger["cost_usd"] < 200, ledger["cost_usd"]
    assert startup_usd * 100 > 200, f"start-up of ${startup_usd:.2f} is too short for this test to prove anything"
    assert receiver.alert_names()["budget_projection"] == 0, [b["text"] for b in receiver.bodies]


@pytest.mark.e2e
def test_a_real_overrun_gets_exactly_one_projection_alert_near_the_truth(tmp_path, receiver):
    """2000 steps on a $45 budget (the start-up, imports included, is about a third of it): the projection fires once, early, and says about what 2000 steps
    at this job's own steady rate would cost; the budget then stops the job."""
    done, out, startup_usd, ledger = _budgeted_job(tmp_path, receiver, "train.max_steps=2000", "budget.max_usd=45",
                                                   env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 3, out[-3000:]
    assert receiver.alert_names()["budget_projection"] == 1, [b["text"] for b in receiver.bodies]
    (text,) = [b["text"] for b in receiver.bodies if b["text"].startswith("[budget_projection]")]
    projected = float(re.search(r"projected to cost \$([0-9,.]+)", text).group(1).replace(",", ""))
    attempt = ledger["attempts"][0]
    steady_usd_per_step = (attempt["cost_usd"] - startup_usd) / (attempt["step_end"] - 1)
    truth = startup_usd + steady_usd_per_step * 1999
    assert truth / 3 < projected < truth * 3, (projected, truth, text)


def test_webhook_named_by_an_environment_variable_gets_the_alert(receiver, monkeypatch):
    """budget.webhook_url_env: the config names a variable, the URL (a credential) stays out of the config."""
    from orchestrator.money.budget import default_sinks

    monkeypatch.setenv("TEST_SLACK_WEBHOOK", receiver.url)
    cfg = BudgetConfig(max_usd=10.0, webhook_url_env="TEST_SLACK_WEBHOOK", projection_alert=False)
    sinks = default_sinks(cfg)
    hooks = [s for s in sinks if isinstance(s, WebhookSink)]
    assert len(hooks) == 1
    guard = _guard(cfg, LedgerAlerts(), sinks)
    guard.check(6.0, steps_done=1, max_steps=100)
    assert hooks[0].wait(10)
    assert [b["text"].split("]")[0] for b in receiver.bodies] == ["[budget_50"]
