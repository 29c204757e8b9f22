"""The spend index and the monthly and experiment caps: reservations, settling, the race, the alerts.

In-process against a local folder and a real S3 server (moto): the index moves by the
ledger's conditional writes, which is what keeps racing jobs from overspending a cap.
"""
from __future__ import annotations

import calendar
import threading

import pytest

from orchestrator.attempt.money import SpendWatch
from orchestrator.money.budget import BudgetGuard
from orchestrator.core.errors import BudgetExhausted
from orchestrator.money.spend import Caps, SpendIndex, experiment_total_usd, month_total_usd
from orchestrator.storage import LocalStore

DEC = calendar.timegm((2026, 12, 31, 23, 59, 0))
JAN = calendar.timegm((2027, 1, 1, 0, 1, 0))


def _index(store, run="a", experiment="exp", monthly=None, per_experiment=None, clock=lambda: DEC):
    return SpendIndex(store, Caps(run, experiment, monthly_max_usd=monthly, experiment_max_usd=per_experiment), clock=clock)


def test_reservations_are_charged_before_spending_and_settled_to_what_was_spent(store):
    index = _index(store, monthly=10.0)
    grant = index.reserve(1, 0.0, 4.0)
    assert grant.through == 4.0 and grant.month_usd == 4.0 and grant.refusal is None
    index.settle(1, 2.5)
    assert month_total_usd(index.load(), "2026-12") == 2.5
    other = _index(store, run="b", monthly=10.0)
    grant = other.reserve(1, 0.0, 100.0)  # only the room left is granted
    assert grant.through == pytest.approx(7.5) and grant.month_usd == pytest.approx(10.0)
    assert "monthly spend cap reached" in grant.refusal and "a $2.5000" in grant.refusal
    assert "monthly spend cap reached" in _index(store, run="c", monthly=10.0).refusal()


def test_a_vanished_attempt_is_settled_at_its_reservation_by_the_next_one(store):
    index = _index(store)
    index.reserve(1, 1.0, 3.0)  # attempt 1 is SIGKILLed here: it never settles
    index.reserve(2, 0.0, 1.0)
    job = index.load()["jobs"]["a"]
    assert job["months"] == {"2026-12": 3.0} and list(job["open"]) == ["2"]


def test_a_sigkilled_attempts_unspent_hold_does_not_stop_its_own_jobs_restart(store):
    """The killed attempt held the experiment's last dollars but spent a tenth of them (its ledger says so):
    the restart is refused only if what the next reservation settles leaves no room."""
    index = _index(store, per_experiment=1.0)
    index.reserve(1, 0.1, 1.0)  # attempt 1 holds the whole cap, then is SIGKILLed
    assert "experiment spend cap reached" in _index(store, run="b", per_experiment=1.0).refusal()  # other jobs: held
    assert index.refusal(vanished_usd={"1": 0.1}) is None  # its own job: settled at its ledger cost, $0.90 left
    assert "experiment spend cap reached" in index.refusal(vanished_usd={"1": 1.0})  # it did spend it all
    assert "experiment spend cap reached" in index.refusal()  # no ledger cost: its whole reservation
    watch = SpendWatch(index, usd_per_second=0.01, window_s=10, spent=lambda: 0.0)
    assert watch.start_refusal(vanished_usd={"1": 0.1}) is None
    assert isinstance(watch.start_refusal(vanished_usd={"1": 1.0}), BudgetExhausted)


def test_an_attempt_across_new_year_charges_each_month_what_it_spent_there(store):
    now = [DEC]
    index = _index(store, clock=lambda: now[0], monthly=5.0)
    index.reserve(1, 0.0, 2.0)
    now[0] = JAN
    grant = index.reserve(1, 1.5, 3.5)
    assert grant.month == "2027-01" and grant.through == 3.5
    index.settle(1, 3.0)
    data = index.load()
    assert month_total_usd(data, "2026-12") == 1.5 and month_total_usd(data, "2027-01") == 1.5
    assert experiment_total_usd(data, "exp") == 3.0


def test_the_experiment_cap_counts_every_job_of_the_experiment_only(store):
    _index(store, run="a", experiment="x").reserve(1, 0.0, 6.0)
    _index(store, run="b", experiment="y").reserve(1, 0.0, 50.0)
    index = _index(store, run="c", experiment="x", per_experiment=8.0)
    assert index.reserve(1, 0.0, 5.0).through == pytest.approx(2.0)
    assert "experiment spend cap reached" in index.refusal()


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_jobs_racing_for_the_last_dollars_never_charge_past_the_cap(kind, tmp_path, request):
    """Eight jobs, each asking for $1 at a time from a $5 month: the index never holds more than $5."""
    store = LocalStore(tmp_path / "store") if kind == "local" else request.getfixturevalue("s3_store")
    grants: dict[str, float] = {}
    barrier = threading.Barrier(8)

    def job(name: str) -> None:
        index = _index(store, run=name, monthly=5.0)
        barrier.wait()
        through = 0.0
        while True:
            grant = index.reserve(1, through, through + 1.0)
            if grant.through <= through:
                break
            through = grant.through
        grants[name] = through

    threads = [threading.Thread(target=job, args=(f"job{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sum(grants.values()) == pytest.approx(5.0)
    assert month_total_usd(_index(store).load(), "2026-12") == pytest.approx(5.0)


class _Sent(list):
    def send(self, alert):
        self.append(alert.name)


def _watch(store, run):
    return SpendWatch(_index(store, run=run, monthly=10.0), usd_per_second=1.0, window_s=2.0, spent=lambda: 0.0)


def test_the_watch_alerts_once_each_for_every_job_and_stops_at_its_reservation(store):
    sent = _Sent()
    budget = type("B", (), {"alert_thresholds": [0.5, 0.8, 1.0]})()
    first = _watch(store, "a").with_alerts(budget, [sent])
    first.begin(1)
    for spent in (0.5, 1.0, 3.0, 5.5, 7.0):
        assert first.stop_reason(spent) is None
    assert sent == ["monthly_cap_50"]  # $7 spent (and $9 charged): the alerts count what is spent
    second = _watch(store, "b").with_alerts(budget, [sent])
    second.begin(1)  # $9 charged: $1 left, granted to b; nothing more is spent, so no alert
    assert second.through == pytest.approx(1.0) and sent == ["monthly_cap_50"]
    assert second.stop_reason(0.6) is None  # a capped grant: no write until it is used up
    assert "monthly spend cap reached" in second.stop_reason(1.0)
    assert sent == ["monthly_cap_50", "monthly_cap_80"]  # $8 spent; the 50% alert is not sent again
    second.settle(1.0)
    reason = first.stop_reason(9.0)
    assert reason and "budget.monthly_max_usd=$10" in reason
    assert sent == ["monthly_cap_50", "monthly_cap_80", "monthly_cap_100"]
    with pytest.raises(BudgetExhausted, match="monthly spend cap reached"):
        _watch(store, "c").begin(1)


def test_budget_guard_names_and_texts_for_a_cap():
    sent: list = []
    limits = type("B", (), {"max_usd": 4.0, "alert_thresholds": [0.5], "projection_alert": False})()
    guard = BudgetGuard(limits, record_alert=lambda name: True, sinks=[type("S", (), {"send": lambda s, a: sent.append(a)})()],
                        prefix="monthly_cap", subject="every job under s3://b/r in 2026-12 (UTC)",
                        budget_key="budget.monthly_max_usd")
    guard.check(2.5, steps_done=0, max_steps=0)
    assert [a.name for a in sent] == ["monthly_cap_50"]
    assert sent[0].message.startswith("[monthly_cap_50] every job under s3://b/r in 2026-12 (UTC) has spent $2.50")
    assert "budget.monthly_max_usd" in sent[0].message


@pytest.mark.parametrize("bad,needle", [
    (["budget.monthly_max_usd=0"], "budget.monthly_max_usd=0.0 must be positive"),
    (["budget.experiment_max_usd=-3"], "budget.experiment_max_usd=-3.0 must be positive"),
    (["budget.monthly_max_usd=5", "budget.reserve_ahead=off"], "set budget.reserve_ahead to a duration"),
    (["budget.reserve_ahead=soon"], "budget.reserve_ahead='soon' is not a duration"),
])
def test_bad_spend_caps_are_refused_at_launch(bad, needle):
    from orchestrator.app.compose import compose_config
    from orchestrator.core.errors import ConfigError

    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        compose_config(["recipe=sft", *bad])


def test_status_spend_prints_the_month_and_each_experiment_by_job(s3_server, s3_store, capsys):
    from orchestrator.cli import status
    _index(s3_store, run="a", experiment="x", clock=lambda: DEC).reserve(1, 0.0, 2.0)
    _index(s3_store, run="a", experiment="x", clock=lambda: DEC).settle(1, 1.25)
    _index(s3_store, run="b", experiment="y", clock=lambda: DEC).reserve(1, 0.5, 3.0)  # still running: $3 held
    now = DEC
    out = status.format_spend(_index(s3_store).load(), s3_store.uri, now=now)
    assert "month 2026-12 (UTC): $4.2500" in out
    assert "experiment 'x': $1.2500" in out and "experiment 'y': $3.0000" in out
    assert status.main(["--spend", s3_store.uri, "--endpoint-url", s3_server.endpoint_url]) == 0
    printed = capsys.readouterr().out
    assert "spend under " + s3_store.uri in printed and "a " in printed and "b " in printed
    assert status.main(["--spend", s3_store.uri + "-empty", "--endpoint-url", s3_server.endpoint_url]) == 2  # a user error (docs/cli.md)
    assert "no spend index at" in capsys.readouterr().err


def test_an_attempt_the_caps_cannot_carry_through_its_start_up_stops_before_spending_it(store):
    """A step is the first moment a running attempt can stop, so its first reservation must cover the start-up
    still ahead of it (process start to first step, less what it has run): one the caps cannot carry stops at
    once, having spent only what it had when it asked, and the caps' total never passes the cap."""
    _index(store, run="other", monthly=1.0).reserve(1, 0.0, 0.95)  # another job holds $0.95 of the $1 cap
    late = SpendWatch(_index(store, monthly=1.0), usd_per_second=0.01, window_s=60, spent=lambda: 0.01)
    with pytest.raises(BudgetExhausted, match=r"leave this attempt \$0.040000, less than the start-up still ahead "
                                              r"of it \(\$0.090000: 10.0 s from process start to first step"):
        late.begin(1, startup_s=10.0)  # 1 s run ($0.01), 9 s ($0.09) to come; the cap leaves $0.04 beyond it
    late.settle(0.01)  # what the runner's end does
    assert month_total_usd(store_index(store), "2026-12") == pytest.approx(0.96)
    quick = SpendWatch(_index(store, run="b", monthly=1.0), usd_per_second=0.01, window_s=60, spent=lambda: 0.01)
    quick.begin(1, startup_s=3.0)  # $0.02 to come: the $0.03 left carries it (and a little training)
    assert quick.through == pytest.approx(0.04)


def store_index(store) -> dict:
    return _index(store).load()


def test_another_jobs_hold_is_released_once_its_attempt_is_gone_and_kept_while_it_lives(store):
    """A job SIGKILLed that never runs again (a sweep's trial killed with its launcher, then pruned) must not hold
    its unspent reservation against the caps for good: the next capped job to reserve settles it at the dead
    attempt's ledger cost. While its process lives, the hold stands."""
    import signal
    import socket
    import subprocess
    import sys
    import time

    from orchestrator.money.spend import month_of
    from orchestrator.records.ledger import Ledger

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    ledger = Ledger(store, "a")
    attempt = ledger.begin_attempt(host=socket.gethostname(), pid=holder.pid, instance_type="cpu", gpu_type=None,
                                   gpus=0, spot=False, checkpoint_step=0)
    _index(store, run="a", monthly=1.0, clock=time.time).reserve(attempt["fence"], 0.0, 0.9)  # a holds $0.9 of the $1 cap
    ledger.heartbeat(3, 0.1)  # and had spent $0.10 by its last heartbeat
    try:
        assert _index(store, run="b", monthly=1.0, clock=time.time).reserve(1, 0.0, 0.8).through == pytest.approx(0.1)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    assert _index(store, run="c", monthly=1.0, clock=time.time).refusal() is None
    grant = _index(store, run="c", monthly=1.0, clock=time.time).reserve(1, 0.0, 0.8)
    assert grant.through == pytest.approx(0.8)  # a's $0.80 unspent came back; its $0.10 stays charged
    jobs = store_index(store)["jobs"]
    assert jobs["a"]["open"] == {} and jobs["a"]["months"][month_of(time.time())] == pytest.approx(0.1)
    assert month_total_usd(store_index(store), month_of(time.time())) == pytest.approx(1.0)


def test_a_neighbours_ledger_whose_attempts_lost_their_fence_degrades_only_its_own_holds(store, caplog):
    """A ledger is untrusted input: one whose attempts lost ``fence`` (written by hand, or by a tool that dropped
    it), of a job holding an open reservation, crashed every capped job under the store (``KeyError: 'fence'``
    in the dead-hold sweep). Now that job's holds stay held, a warning names it, and the others go on."""
    import json
    import socket
    import time

    from orchestrator.records.ledger import Ledger

    ledger = Ledger(store, "a")
    attempt = ledger.begin_attempt(host=socket.gethostname(), pid=2 ** 22 + 7, instance_type="cpu", gpu_type=None,
                                   gpus=0, spot=False, checkpoint_step=0)
    _index(store, run="a", monthly=1.0, clock=time.time).reserve(attempt["fence"], 0.0, 0.9)
    stored = json.loads(store.get_bytes("a/ledger.json"))
    for record in stored["attempts"]:
        record.pop("fence")
    store.put_bytes("a/ledger.json", json.dumps(stored).encode())
    with caplog.at_level("WARNING"):
        grant = _index(store, run="b", monthly=1.0, clock=time.time).reserve(1, 0.0, 0.8)
    assert grant.through == pytest.approx(0.1)  # a's $0.90 is still held: nothing proved its attempt gone
    assert "job 'a''s ledger is unreadable (" in caplog.text  # the ledger and the field, as LedgerRecord names them
    assert f"{store.get_uri('a/ledger.json')} attempts[0] is corrupt: 'fence' is missing" in caplog.text
    assert store_index(store)["jobs"]["a"]["open"]  # a's hold kept, not released at a guessed cost


def test_a_start_up_hold_takes_the_room_before_the_worker_and_its_first_reservation_takes_it_over(store):
    """The supervisor holds the start-up before the worker's process exists, so two attempts launched into the same
    room cannot both spend a start-up there; the worker's first reservation turns the hold into its entry (counted
    once), and its own start check does not count the hold that was taken for it."""
    import os

    from orchestrator.money.spend_holds import HoldAsk, hold_key, take_hold

    _index(store, run="other", monthly=1.0).reserve(1, 0.0, 0.7)  # another job holds $0.70 of the $1 cap
    index = _index(store, monthly=1.0)
    key = hold_key(1, pid=os.getpid())  # a live supervisor's (a dead one's hold is released: the next test)
    assert take_hold(index, key, HoldAsk(10.0, 0.03)) is None  # $0.30: the last room
    assert month_total_usd(store_index(store), "2026-12") == pytest.approx(1.0)
    late = _index(store, run="late", monthly=1.0)
    refusal = take_hold(late, hold_key(2, pid=os.getpid()), HoldAsk(10.0, 0.03))
    assert "monthly spend cap reached" in refusal and "a $0.3000" in refusal
    assert "late" not in store_index(store)["jobs"]  # refused: nothing written
    _index(store, run="other", monthly=1.0).settle(1, 0.6)  # $0.10 comes back: less than a start-up
    refusal = take_hold(late, hold_key(2, pid=os.getpid()), HoldAsk(10.0, 0.03))
    assert "less than the start-up" in refusal and "$0.100000" in refusal and "$0.300000: 10.0 s" in refusal

    _index(store, run="other", monthly=1.0).reserve(2, 0.0, 0.1)  # the $0.10 is taken again: the cap is full
    worker = SpendWatch(index, usd_per_second=0.03, window_s=60, spent=lambda: 0.03, hold=key)
    assert isinstance(SpendWatch(index, usd_per_second=0.03, window_s=60, spent=lambda: 0.03).start_refusal(),
                      BudgetExhausted)  # counted as anyone's reservation, the hold would refuse its own attempt
    assert worker.start_refusal() is None
    worker.begin(1, startup_s=8.0)  # 1 s run, 7 s ($0.21) to come: the hold carries it
    job = store_index(store)["jobs"]["a"]
    assert list(job["open"]) == ["1"] and job["open"]["1"]["through"] == pytest.approx(0.3)
    assert worker.through == pytest.approx(0.3)
    assert month_total_usd(store_index(store), "2026-12") == pytest.approx(1.0)  # not $1.30: no double count


def test_a_hold_nobody_took_over_is_settled_at_what_its_run_cost_or_whole_once_its_supervisor_is_gone(store):
    """A worker that died before it reserved leaves its supervisor's hold: the supervisor settles it at what the
    child's run cost. A supervisor SIGKILLed with its hold open leaves a dead hold: the next capped job settles it
    at the whole hold (nothing says what its worker spent); a hold whose supervisor lives stands."""
    import os
    import subprocess
    import sys
    import time

    from orchestrator.money.spend import month_of
    from orchestrator.money.spend_holds import HoldAsk, hold_key, release_hold, take_hold

    month = month_of(time.time())
    index = _index(store, monthly=1.0, clock=time.time)
    key = hold_key(1, pid=os.getpid())
    assert take_hold(index, key, HoldAsk(10.0, 0.03)) is None
    assert release_hold(index, key, 0.05) and not release_hold(index, key, 0.05)
    job = store_index(store)["jobs"]["a"]
    assert job["open"] == {} and job["months"][month] == pytest.approx(0.05)

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    assert take_hold(_index(store, run="dead", monthly=1.0, clock=time.time), hold_key(1, pid=gone.pid),
                     HoldAsk(10.0, 0.03)) is None
    assert take_hold(_index(store, run="alive", monthly=1.0, clock=time.time), hold_key(1, pid=os.getpid()),
                     HoldAsk(10.0, 0.03)) is None
    _index(store, run="b", monthly=1.0, clock=time.time).reserve(1, 0.0, 0.1)
    jobs = store_index(store)["jobs"]
    assert jobs["dead"]["open"] == {} and jobs["dead"]["months"][month] == pytest.approx(0.3)
    assert list(jobs["alive"]["open"]) == [hold_key(1, pid=os.getpid())]
