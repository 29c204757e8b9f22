"""Money told truthfully by the spend index: the caps' alerts count money spent, not reserved, and an
attempt that vanished is settled at its last heartbeat's cost (as its ledger counts it), not its reservation.

In-process on a real S3 server (moto), with the real ledger and the attempt's record.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from orchestrator.attempt.money import SpendWatch
from orchestrator.attempt.record import AttemptRecord
from orchestrator.records.ledger import Ledger
from orchestrator.policy.requeue import RequeuePolicy
from orchestrator.money.spend import Caps, SpendIndex, month_of, month_total_usd


class _Sent(list):
    def send(self, alert):
        self.append(alert.message)


def _watch(store, run, *, monthly, window_s, spent=lambda: 0.0, sent=None):
    watch = SpendWatch(SpendIndex(store, Caps(run, "x", monthly_max_usd=monthly)), usd_per_second=0.01,
                       window_s=window_s, spent=spent)
    if sent is not None:
        watch.with_alerts(SimpleNamespace(alert_thresholds=[0.5, 0.8, 1.0]), [sent])
    return watch


def test_a_cap_s_alerts_fire_on_money_spent_not_on_the_reservation(s3_store):
    """The audit's case: a job under a $0.50 cap reserved $0.50 at its start and was told it had spent it."""
    sent = _Sent()
    watch = _watch(s3_store, "a", monthly=0.5, window_s=50.0, sent=sent)  # a 50 s window at $0.01/s: $0.50
    watch.begin(1)
    assert watch.through == pytest.approx(0.5)  # the whole cap is held...
    assert sent == []  # ...but nothing is spent: no alert
    watch.capped = False  # ask again at this spend (the cheap path would wait for the grant to be used up)
    assert watch.stop_reason(0.26) is None and len(sent) == 1
    assert sent[0].startswith("[monthly_cap_50]") and "has spent $0.26 of" in sent[0]
    watch.settle(0.26)
    assert len(sent) == 1  # settling at what was spent sends nothing more


def _record(store, run, spend):
    from orchestrator.app.compose import compose_config

    cfg = compose_config(["recipe=sft", f"run.name={run}"])
    return AttemptRecord(Ledger(store, run), RequeuePolicy(cfg.requeue), compute=cfg.compute, budget_max_usd=None,
                         spend=spend)


def test_a_vanished_attempt_is_settled_in_the_index_at_its_last_heartbeat_cost(s3_store):
    spent = [0.0]
    first = _record(s3_store, "job", _watch(s3_store, "job", monthly=None, window_s=200.0, spent=lambda: spent[0]))
    first.begin(0)  # reserves 200 s at $0.01/s: $2.00
    spent[0] = 0.3
    first.heartbeat(10, 0.3)  # then SIGKILL: no end, no settle

    spent[0] = 0.0
    second = _record(s3_store, "job", _watch(s3_store, "job", monthly=None, window_s=200.0, spent=lambda: spent[0]))
    second.begin(10)
    ledger = second.load()
    assert [a["exit_class"] for a in ledger["attempts"]] == ["vanished", "running"]
    month = month_of(time.time())
    job = SpendIndex(s3_store, Caps("job", "x")).load()["jobs"]["job"]
    assert job["months"] == {month: pytest.approx(0.3)}  # the ledger's $0.30, not the $2.00 reservation
    spent[0] = 0.5
    second.end("completed", 20, 0.5)
    index = SpendIndex(s3_store, Caps("job", "x")).load()
    assert month_total_usd(index, month) == pytest.approx(second.load()["cost_usd"]) == pytest.approx(0.8)


def test_a_vanished_attempt_the_ledger_has_no_cost_for_is_settled_at_its_reservation(s3_store):
    index = SpendIndex(s3_store, Caps("job", "x"))
    index.reserve(1, 0.1, 2.0)
    index.reserve(2, 0.0, 0.5, vanished_usd={"1": float("nan")})  # an untrusted number is no number
    assert index.load()["jobs"]["job"]["months"] == {month_of(time.time()): pytest.approx(2.0)}
