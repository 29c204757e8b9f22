"""The spend index is untrusted storage: checked on every read, rebuilt from the ledgers when it is bad.

In-process, against a real S3 server (moto) where the store matters: a corrupt or NaN-poisoned index
never switches a cap off (a capped job is refused, exit 3, naming the object and the fix), a job with
no cap runs on and says so once, ``orchestrator status --spend`` prints a message instead of a
traceback, and ``orchestrator storage repair-spend`` rebuilds the index from the ledgers' costs.
"""
from __future__ import annotations

import calendar
import json
import logging

import pytest

from orchestrator.attempt.money import SpendWatch
from orchestrator.core.errors import BudgetExhausted
from orchestrator.money.spend import INDEX_KEY, Caps, SpendIndex, SpendIndexCorrupt, month_total_usd, parse_index
from orchestrator.records.ledger import Ledger
from tests.helpers.corrupt_index import CORRUPT

DEC = calendar.timegm((2026, 12, 15, 12, 0, 0))
GOOD = {"jobs": {"a": {"experiment": "x", "months": {"2026-12": 1.0}, "open": {}}}, "alerts": {}}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_every_read_of_a_corrupt_index_is_refused_naming_the_object_and_the_fix(name):
    with pytest.raises(SpendIndexCorrupt) as err:
        parse_index(CORRUPT[name], "s3://b/runs/_spend/index.json", "s3://b/runs")
    text = str(err.value)
    assert "the spend index s3://b/runs/_spend/index.json is unreadable" in text
    assert "orchestrator storage repair-spend s3://b/runs" in text
    assert err.value.exit_code == 3
    assert parse_index(json.dumps(GOOD).encode(), "w", "s") == GOOD


def _watch(store, *, monthly=None, run="a", spent=lambda: 0.0):
    index = SpendIndex(store, Caps(run, "x", monthly_max_usd=monthly), clock=lambda: DEC)
    return SpendWatch(index, usd_per_second=1.0, window_s=2.0, spent=spent)


def test_a_capped_job_under_a_nan_index_is_refused_and_one_without_a_cap_runs_saying_so_once(s3_store, caplog):
    s3_store.put_bytes(INDEX_KEY, CORRUPT["nan month"])
    capped = _watch(s3_store, monthly=0.05)
    refusal = capped.start_refusal()
    assert isinstance(refusal, SpendIndexCorrupt) and "jobs.a.months: '2026-12' is nan" in str(refusal)
    with pytest.raises(SpendIndexCorrupt):  # a capped attempt that got past the check still takes nothing
        capped.begin(1)
    assert "unreadable" in capped.stop_reason(5.0)  # and a running one stops at its next checkpoint (exit 3)

    free = _watch(s3_store)
    with caplog.at_level(logging.WARNING):
        assert free.start_refusal() is None
        free.begin(1)
        assert [free.stop_reason(spent) for spent in (1.0, 3.0, 9.0)] == [None, None, None]
        free.settle(9.0)
    said = [r for r in caplog.records if "is unreadable" in r.getMessage()]
    assert len(said) == 1 and "no spend cap, so it runs on" in said[0].getMessage()
    assert s3_store.get_bytes(INDEX_KEY) == CORRUPT["nan month"]  # nothing written over the evidence


def test_a_corrupt_index_found_mid_run_stops_a_capped_job(s3_store):
    spent = [0.0]
    watch = _watch(s3_store, monthly=10.0, spent=lambda: spent[0])
    watch.begin(1)
    s3_store.put_bytes(INDEX_KEY, CORRUPT["truncated"])
    reason = watch.stop_reason(1.5)  # half the window used: the extension reads the index
    assert reason and "is unreadable: it is not JSON" in reason


def test_status_spend_on_a_corrupt_index_prints_a_message_not_a_traceback(s3_server, s3_store, capsys):
    from orchestrator.cli import status
    s3_store.put_bytes(INDEX_KEY, CORRUPT["truncated"])
    for extra in ([], ["--json"]):
        assert status.main(["--spend", s3_store.uri, "--endpoint-url", s3_server.endpoint_url, *extra]) == 2  # a user error (docs/cli.md)
        captured = capsys.readouterr()
        assert "is unreadable: it is not JSON" in captured.err and "repair-spend" in captured.err
        assert "Traceback" not in captured.err and captured.out == ""


def _ledger_with(store, run, costs_and_classes, *, experiment="x"):
    """A real ledger: one attempt per (cost, exit class); the last may stay running."""
    ledger = Ledger(store, run)
    for cost, exit_class in costs_and_classes:
        ledger.begin_attempt(host="h", pid=1, instance_type=None, gpu_type="cpu", gpus=1, spot=True, checkpoint_step=0,
                             extra={"experiment": experiment})
        ledger.heartbeat(5, cost)
        if exit_class != "running":
            ledger.end_attempt(exit_class, 5, cost)
    return ledger


def test_repair_spend_rebuilds_the_index_from_the_ledgers(s3_server, s3_store, capsys):
    from orchestrator.cli.storage import main as storage_main

    _ledger_with(s3_store, "a", [(0.25, "preempted"), (0.5, "completed")])
    _ledger_with(s3_store, "b", [(0.125, "crashed"), (0.375, "running")], experiment="y")
    s3_store.put_bytes(INDEX_KEY, CORRUPT["nan month"])
    assert storage_main(["repair-spend", s3_store.uri, "--endpoint-url", s3_server.endpoint_url]) == 0
    out = capsys.readouterr().out
    assert "from 2 ledger(s): 2 job(s)" in out
    index = parse_index(s3_store.get_bytes(INDEX_KEY), "w", "s")
    import time

    from orchestrator.money.spend import month_of

    month = month_of(time.time())
    assert month_total_usd(index, month) == pytest.approx(1.25)
    assert index["jobs"]["a"] == {"experiment": "x", "months": {month: 0.75}, "open": {}}
    assert index["jobs"]["b"]["experiment"] == "y" and index["jobs"]["b"]["months"] == {month: 0.125}
    assert list(index["jobs"]["b"]["open"]) == ["2"]  # the running attempt goes on extending its own entry
    # the capped job that was refused now starts against the rebuilt index
    watch = SpendWatch(SpendIndex(s3_store, Caps("c", "x", monthly_max_usd=10.0)), usd_per_second=1.0,
                       window_s=2.0, spent=lambda: 0.0)
    assert watch.start_refusal() is None
    watch.begin(1)
    assert watch.through == pytest.approx(2.0)


def test_a_spent_cap_still_refuses_with_the_numbers(s3_store):
    s3_store.put_bytes(INDEX_KEY, json.dumps(GOOD).encode())
    refusal = _watch(s3_store, monthly=1.0, run="b").start_refusal()
    assert isinstance(refusal, BudgetExhausted) and not isinstance(refusal, SpendIndexCorrupt)
    assert "monthly spend cap reached" in str(refusal)


def _bill_eval(store, run, entry_ms, cost, status):
    """An ``orchestrator eval`` bill in the job's ledger, as ``evaluation.billing.EvalBill`` records it."""
    from orchestrator.records.ledger import LEDGER_FILENAME, add_evaluation, decode_ledger
    from orchestrator.storage.transact import transact

    entry = {"id": f"eval-{entry_ms}", "host": "h", "pid": 1, "started_at": entry_ms / 1000, "seconds": 1.0,
             "cost_usd": cost, "evaluated": 1, "status": status}
    transact(store, f"{run}/{LEDGER_FILENAME}", lambda led: (add_evaluation(led, entry), led)[1], decode=decode_ledger)


def test_repair_spend_counts_the_eval_bills_of_every_ledger(s3_server, s3_store, capsys):
    """Issue 42.2: the rebuilt index holds the ``orchestrator eval`` spend the ledgers hold (the caps count it),
    a finished evaluation settled under ``<run>:eval`` with the job's experiment, a running one open."""
    import time

    from orchestrator.cli.storage import main as storage_main
    from orchestrator.money.spend import experiment_total_usd, month_of

    _ledger_with(s3_store, "a", [(0.25, "completed")], experiment="exp-a")
    now_ms = int(time.time() * 1000)
    _bill_eval(s3_store, "a", now_ms - 5000, 0.0019, "completed")
    _bill_eval(s3_store, "a", now_ms, 0.001, "running")
    s3_store.put_bytes(INDEX_KEY, CORRUPT["truncated"])
    assert storage_main(["repair-spend", s3_store.uri, "--endpoint-url", s3_server.endpoint_url]) == 0
    index = parse_index(s3_store.get_bytes(INDEX_KEY), "w", "s")
    month = month_of(time.time())
    assert month_total_usd(index, month) == pytest.approx(0.25 + 0.0019 + 0.001)
    assert experiment_total_usd(index, "exp-a") == pytest.approx(0.2529)
    evals = index["jobs"]["a:eval"]
    assert evals["experiment"] == "exp-a" and evals["months"] == {month: pytest.approx(0.0019)}
    assert list(evals["open"]) == [str(now_ms)]  # the running evaluation goes on charging its own entry
    # that evaluation settles its entry into the rebuilt index when it ends
    from orchestrator.money.spend import Caps, SpendIndex

    SpendIndex(s3_store, Caps("a:eval", "exp-a")).settle(now_ms, 0.002)
    after = parse_index(s3_store.get_bytes(INDEX_KEY), "w", "s")
    assert after["jobs"]["a:eval"]["months"][month] == pytest.approx(0.0039) and not after["jobs"]["a:eval"]["open"]


def test_an_uncapped_eval_runs_on_a_corrupt_index_and_a_capped_one_is_refused(s3_store, caplog):
    """``orchestrator eval`` as a job: with no spend cap, a corrupt index is said once and the evaluation is billed
    to the job's ledger only (it was refused); with a cap it cannot check, it is refused (exit 3)."""
    import json

    from orchestrator.app.compose import compose_config
    from orchestrator.evaluation.billing import EvalBill
    from orchestrator.money.spend import SpendIndexCorrupt
    from orchestrator.records.ledger import Ledger

    s3_store.put_bytes(INDEX_KEY, CORRUPT["nan month"])
    Ledger(s3_store, "job").begin_attempt(host="h", pid=1, instance_type="cpu", gpu_type=None, gpus=0, spot=False,
                                          checkpoint_step=0)
    bill = EvalBill(compose_config(["run.name=job"]), s3_store, "job")
    with caplog.at_level("WARNING"):
        bill.open()
        bill.charge(1)
        spent = bill.close(1)
    assert caplog.text.count("This evaluation has no spend cap") == 1
    evaluations = json.loads(s3_store.get_bytes("job/ledger.json"))["evaluations"]
    assert [(e["evaluated"], e["status"], e["cost_usd"]) for e in evaluations] == [(1, "completed", spent)]
    assert s3_store.get_bytes(INDEX_KEY) == CORRUPT["nan month"]  # nothing written over the evidence
    capped = EvalBill(compose_config(["run.name=job", "budget.monthly_max_usd=5"]), s3_store, "job")
    with pytest.raises(SpendIndexCorrupt):
        capped.open()
