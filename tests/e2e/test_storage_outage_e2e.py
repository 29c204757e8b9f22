"""A 30-second S3 outage in the middle of a capped job, end to end: a real job on moto behind a TCP proxy
the test switches off and on again.

Ridden out (the default ``storage.retry_for``): the attempt waits, then goes on, and completes. Outlasting
the window (``storage.retry_for=3s``): the attempt ends as a preemption, not a crash, the job is requeued
(attempts that start while storage is still down end the same way), and an attempt after the outage settles
the ledger and completes. Either way the ledger is closed and the month's total in the spend index equals
the sum of the ledgers' costs within one heartbeat.
"""
from __future__ import annotations

import json
import time

import pytest

from orchestrator.money.spend import INDEX_KEY, month_of, month_total_usd
from tests.helpers import jobs
from tests.helpers.tcp_proxy import TcpProxy

OUTAGE_S = 30.0
USD_PER_S = 0.01  # compute.price_per_hour=36
HEARTBEAT_USD = 1.0 * USD_PER_S  # ORCH_HEARTBEAT_SECONDS=1 (tests/jobs.py)
CAPPED = ["compute.price_per_hour=36", "budget.monthly_max_usd=100", "budget.reserve_ahead=5s", "train.max_steps=300",
          "train.eval_at_end=false"]


def _run_through_outage(tmp_path, s3_server, s3_bucket, run: str, *extra: str):
    proxy = TcpProxy(s3_server.endpoint_url)
    direct = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    overrides = jobs.FAST + CAPPED + jobs.Storage(s3_bucket, proxy.url).overrides() + [f"run.name={run}", *extra]
    proc = jobs.start_job(overrides, tmp_path)
    try:
        jobs.wait_for_new_checkpoint(direct, run, proc, 0, timeout=300)  # mid-run: it extends its reservation
        proxy.off()
        time.sleep(OUTAGE_S)
        proxy.on()
        rc = proc.wait(timeout=600)
    finally:
        proxy.off()
        if proc.poll() is None:
            jobs.kill_group(proc)
    return rc, jobs.log_text(tmp_path), direct


def _assert_settled(direct: jobs.Storage, run: str) -> dict:
    ledger = jobs.ledger(direct, run)
    assert ledger["status"] == "completed" and all(a["exit_class"] != "running" for a in ledger["attempts"]), ledger
    assert not any(a["exit_class"] == "crashed" for a in ledger["attempts"])
    index = json.loads(direct.store().get_bytes(INDEX_KEY))
    assert index["jobs"][run]["open"] == {}
    total = month_total_usd(index, month_of(time.time()))
    assert abs(total - ledger["cost_usd"]) <= HEARTBEAT_USD, (total, ledger["cost_usd"])
    return ledger


@pytest.mark.e2e
def test_a_30_second_outage_is_ridden_out_and_the_job_completes(tmp_path, s3_server, s3_bucket):
    rc, log, direct = _run_through_outage(tmp_path, s3_server, s3_bucket, "ride")
    assert rc == 0, log[-4000:]
    assert "retrying for up to 120s" in log and "answers again" in log and "Traceback" not in log
    ledger = _assert_settled(direct, "ride")
    assert [a["exit_class"] for a in ledger["attempts"]] == ["completed"]


@pytest.mark.e2e
def test_an_outage_longer_than_storage_retry_for_ends_as_a_preemption_and_the_next_attempt_settles(
        tmp_path, s3_server, s3_bucket):
    rc, log, direct = _run_through_outage(tmp_path, s3_server, s3_bucket, "requeued", "storage.retry_for=3s")
    assert rc == 0, log[-4000:]
    assert "storage outage" in log and "crash" not in log.lower().replace("crash-loop", ""), log[-4000:]
    ledger = _assert_settled(direct, "requeued")
    classes = [a["exit_class"] for a in ledger["attempts"]]
    assert classes[-1] == "completed" and len(classes) >= 2
    assert set(classes[:-1]) <= {"preempted", "vanished"}, classes
