"""The run ledger: fencing, the refuse hook, vanished attempts, once-only alerts.

Run against a local folder and a real S3 server (moto), whose conditional
writes are what make the ledger safe between machines.
"""
from __future__ import annotations

import threading

import pytest

from orchestrator.core.errors import CapsReached, Fenced
from orchestrator.core.exitcodes import ExitClass
from orchestrator.records.ledger import Ledger


def _begin(ledger: Ledger, host: str = "host-a", **kw):
    args = dict(host=host, pid=123, instance_type="g5.xlarge", gpu_type="a10g", gpus=1, spot=True, checkpoint_step=0)
    args.update(kw)
    return ledger.begin_attempt(**args)


def test_first_attempt_creates_the_ledger(store):
    ledger = Ledger(store, "exp1")
    assert ledger.load() == {}
    attempt = _begin(ledger, checkpoint_step=0, extra={"note": "first"})
    assert attempt["fence"] == 1 and ledger.fence == 1
    record = ledger.load()
    assert record["status"] == "running" and record["fence"] == 1 and record["run_name"] == "exp1"
    assert [a["exit_class"] for a in record["attempts"]] == ["running"]
    assert record["attempts"][0]["extra"] == {"note": "first"}
    assert store.list("exp1/") == ["exp1/ledger.json"]


def test_racing_begins_get_distinct_fences_and_the_older_is_fenced(store):
    ledgers = [Ledger(store, "race"), Ledger(store, "race")]
    barrier = threading.Barrier(len(ledgers))
    errors: list[BaseException] = []

    def start(i: int) -> None:
        try:
            barrier.wait()
            _begin(ledgers[i], host=f"host-{i}")
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(len(ledgers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(led.fence for led in ledgers) == [1, 2]
    older, newer = sorted(ledgers, key=lambda led: led.fence)
    record = older.load()
    assert record["fence"] == 2 and len(record["attempts"]) == 2

    before = store.get_bytes("race/ledger.json")
    with pytest.raises(Fenced, match=r"another attempt \(fence 2, host host-\d\) took over this job; this attempt \(fence 1\) stops"):
        older.update(lambda led: led.update(status="completed"))
    assert store.get_bytes("race/ledger.json") == before  # the fenced attempt wrote nothing
    with pytest.raises(Fenced):
        older.heartbeat(step=5, cost_usd=0.1)
    with pytest.raises(Fenced):
        older.check_fence()
    newer.heartbeat(step=7, cost_usd=0.2)
    newer.check_fence()
    assert newer.load()["step"] == 7


def test_refuse_hook_raises_caps_reached_and_adds_no_attempt(store):
    ledger = Ledger(store, "capped")
    _begin(ledger)
    ledger.end_attempt(ExitClass.PREEMPTED, step=10, cost_usd=0.5, status="preempted")

    def refuse(record):  # the ledger decoded (a LedgerRecord), with the vanished marks
        preemptions = sum(a.exit_class in ("preempted", "vanished") for a in record.attempts)
        return f"requeue caps spent: {preemptions}/1 preemptions" if preemptions >= 1 else None

    second = Ledger(store, "capped")
    with pytest.raises(CapsReached, match=r"1/1 preemptions"):
        _begin(second, refuse=refuse)
    record = second.load()
    assert record["fence"] == 1 and len(record["attempts"]) == 1
    assert record["status"] == "caps_reached"
    assert second.fence is None


def test_refuse_on_a_new_job_writes_nothing(store):
    with pytest.raises(CapsReached):
        _begin(Ledger(store, "never"), refuse=lambda record: "no")
    assert not store.exists("never/ledger.json")


def test_running_attempt_is_marked_vanished_by_the_next_begin(store):
    first = Ledger(store, "exp")
    _begin(first, host="spot-1")
    first.heartbeat(step=40, cost_usd=1.25)
    last_seen = first.load()["attempts"][0]["last_seen"]
    # spot-1 is SIGKILLed: it never records its end. The requeued attempt:
    second = Ledger(store, "exp")
    attempt = _begin(second, host="spot-2", checkpoint_step=30)
    record = second.load()
    gone = record["attempts"][0]
    assert gone["exit_class"] == ExitClass.VANISHED.value and gone["ended_at"] == last_seen
    assert attempt["fence"] == 2 and attempt["checkpoint_step_at_start"] == 30 and attempt["step_start"] == 30
    assert record["cost_usd"] == pytest.approx(1.25)  # the vanished attempt's cost is still counted
    second.heartbeat(step=50, cost_usd=0.5)
    second.record_checkpoint(step=50, key="exp/checkpoints/50-2", size=1234)
    record = second.end_attempt(ExitClass.COMPLETED, step=60, cost_usd=0.75, status="completed")
    assert record["status"] == "completed" and record["step"] == 60
    assert record["cost_usd"] == pytest.approx(2.0)
    assert record["checkpoints"] == [
        {"step": 50, "key": "exp/checkpoints/50-2", "size": 1234, "time": record["checkpoints"][0]["time"], "fence": 2}
    ]
    assert [a["exit_class"] for a in record["attempts"]] == ["vanished", "completed"]


def test_a_checkpoint_record_with_a_cost_is_the_attempts_heartbeat(store):
    ledger = Ledger(store, "beat")
    _begin(ledger)
    ledger.heartbeat(step=10, cost_usd=0.1)
    before = ledger.load()["attempts"][0]["last_seen"]
    record = ledger.record_checkpoint(step=25, key="beat/checkpoints/25-1", size=10, cost_usd=0.3)
    attempt = record["attempts"][0]
    assert attempt["step_end"] == 25 and attempt["checkpoint_step_end"] == 25
    assert attempt["cost_usd"] == pytest.approx(0.3) and record["cost_usd"] == pytest.approx(0.3)
    assert attempt["last_seen"] >= before
    # a vanished attempt is billed up to its last checkpoint record, as up to its last heartbeat
    second = Ledger(store, "beat")
    _begin(second, host="host-b")
    assert second.load()["attempts"][0]["exit_class"] == "vanished"
    assert second.load()["cost_usd"] == pytest.approx(0.3)


def test_record_alert_is_true_exactly_once_across_attempts_and_threads(store):
    first = Ledger(store, "alerts")
    _begin(first)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(first.record_alert("budget-50%"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]
    first.end_attempt(ExitClass.PREEMPTED, step=3, cost_usd=0.1, status="preempted")
    second = Ledger(store, "alerts")
    _begin(second)
    assert second.record_alert("budget-50%") is False  # sent by an earlier attempt
    assert second.record_alert("budget-80%") is True
    assert set(second.load()["alerts"]) == {"budget-50%", "budget-80%"}


def test_mlflow_run_id_survives_attempts(store):
    first = Ledger(store, "ml")
    _begin(first)
    first.set_mlflow_run_id("abc123")
    second = Ledger(store, "ml")
    _begin(second)
    assert second.load()["mlflow_run_id"] == "abc123"


def test_end_attempt_rejects_unknown_status(store):
    ledger = Ledger(store, "bad")
    _begin(ledger)
    with pytest.raises(ValueError, match="not one of"):
        ledger.end_attempt(ExitClass.CRASHED, step=0, cost_usd=0.0, status="exploded")


def test_checkpoint_records_are_pruned_to_keep_last(store):
    # a week-long job at a 2-minute interval commits ~5000 checkpoints; retention keeps keep_last in
    # storage, and the ledger, rewritten at every heartbeat, lists only those
    ledger = Ledger(store, "long", keep_checkpoints=3)
    _begin(ledger)
    sizes = []
    for step in range(10, 610, 10):
        record = ledger.record_checkpoint(step=step, key=f"long/checkpoints/{step:09d}-1", size=100, cost_usd=step / 1e3)
        ledger.heartbeat(step=step + 5, cost_usd=step / 1e3)
        sizes.append(len(store.get_bytes("long/ledger.json")))
    record = ledger.load()
    assert [c["step"] for c in record["checkpoints"]] == [580, 590, 600]
    assert record["checkpoints_committed"] == 60
    assert record["attempts"][0]["checkpoint_step_end"] == 600
    assert sizes[-1] <= sizes[4] + 64, f"the ledger grew from {sizes[4]} to {sizes[-1]} bytes"
    # a later attempt with another keep_last keeps counting and pruning
    second = Ledger(store, "long", keep_checkpoints=2)
    _begin(second, host="host-b", checkpoint_step=600)
    record = second.record_checkpoint(step=610, key="long/checkpoints/000000610-2", size=100)
    assert [(c["step"], c["fence"]) for c in record["checkpoints"]] == [(600, 1), (610, 2)]
    assert record["checkpoints_committed"] == 61


def test_checkpoint_records_are_kept_in_step_order_after_a_resume_from_an_older_one(store):
    ledger = Ledger(store, "back", keep_checkpoints=2)
    _begin(ledger)
    for step in (10, 20, 30):
        ledger.record_checkpoint(step=step, key=f"back/checkpoints/{step}-1", size=1)
    # step 30 turned out corrupt; the next attempt restored 20 and commits 25: retention in storage
    # keeps the newest by step (30 and 25), and so does the ledger
    second = Ledger(store, "back", keep_checkpoints=2)
    _begin(second, host="host-b", checkpoint_step=20)
    record = second.record_checkpoint(step=25, key="back/checkpoints/25-2", size=1)
    assert [c["step"] for c in record["checkpoints"]] == [25, 30]


def test_a_supervisor_records_its_killed_childs_attempt(store):
    child = Ledger(store, "killed")
    _begin(child, host="node-1")
    child.heartbeat(step=12, cost_usd=0.4)
    last_seen = child.load()["attempts"][0]["last_seen"]
    # the child was SIGKILLed (by the kernel's OOM killer); its supervisor closes the attempt for it
    assert Ledger(store, "killed", fence=child.fence).close_lost_attempt(ExitClass.OUT_OF_MEMORY)
    record = child.load()
    gone = record["attempts"][0]
    assert gone["exit_class"] == "out_of_memory" and gone["ended_at"] == last_seen
    assert gone["step_end"] == 12 and gone["cost_usd"] == pytest.approx(0.4)
    assert record["status"] == "failed"
    # nothing is written for an attempt already closed, or once another attempt took over
    assert not Ledger(store, "killed", fence=child.fence).close_lost_attempt(ExitClass.VANISHED)
    newer = Ledger(store, "killed")
    _begin(newer, host="node-2")
    before = store.get_bytes("killed/ledger.json")
    assert not Ledger(store, "killed", fence=child.fence).close_lost_attempt(ExitClass.VANISHED)
    assert store.get_bytes("killed/ledger.json") == before


def test_a_typed_refusal_is_raised_and_sets_its_own_status(store):
    from orchestrator.core.errors import AlreadyCompleted, BudgetExhausted

    ledger = Ledger(store, "typed")
    _begin(ledger)
    ledger.end_attempt(ExitClass.PREEMPTED, step=10, cost_usd=2.0)  # status from the outcome table
    assert ledger.load()["status"] == "preempted"
    with pytest.raises(BudgetExhausted, match="spent"):
        _begin(Ledger(store, "typed"), refuse=lambda record: BudgetExhausted("budget spent"))
    assert Ledger(store, "typed").load()["status"] == "budget_exhausted"

    done = Ledger(store, "done")
    _begin(done)
    done.end_attempt(ExitClass.COMPLETED, step=40, cost_usd=1.0)
    with pytest.raises(AlreadyCompleted):
        _begin(Ledger(store, "done"), refuse=lambda record: AlreadyCompleted("complete"))
    record = Ledger(store, "done").load()
    assert record["status"] == "completed" and len(record["attempts"]) == 1
