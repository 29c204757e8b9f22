"""A corrupt or NaN-poisoned spend index, end to end: real jobs on a real S3 server (moto).

A capped job never spends past its cap because of it (refused before its first step, exit 3, the
object and the fix named); a job with no cap completes and says once that the index is unreadable;
``orchestrator storage repair-spend`` rebuilds the index from the ledgers, and the capped job then runs
and is stopped at its cap.
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from orchestrator.money.spend import INDEX_KEY, month_of, month_total_usd
from tests.helpers import jobs
from tests.helpers.corrupt_index import CORRUPT

PRICE = ["compute.price_per_hour=36"]  # $0.01 per second of an attempt
CAP_USD = 0.05
RUN_USD = 0.3  # the room the rebuilt index leaves the capped job: 30 s, past its start-up
FINAL_SLACK_USD = 0.1


def _cli(args: list[str], tmp_path, storage: jobs.Storage) -> subprocess.CompletedProcess:
    return subprocess.run([jobs.PYTHON, "-m", "orchestrator", *args, storage.uri, "--endpoint-url", storage.endpoint_url],
                          cwd=tmp_path, env=jobs.job_env(tmp_path), capture_output=True, text=True, timeout=120)


@pytest.mark.e2e
def test_a_corrupt_index_never_lets_a_capped_job_spend_and_never_stops_an_uncapped_one(tmp_path, s3_server, s3_bucket):
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    store = storage.store()
    common = jobs.FAST + PRICE + storage.overrides() + ["train.eval_at_end=false"]
    capped = jobs.with_overrides(common, "run.name=capped", f"budget.monthly_max_usd={CAP_USD}",
                                 "budget.reserve_ahead=1s", "train.max_steps=5000",
                                 "compute.restart_seconds=15")  # its start-up hold: 15 s of the 30 s room, not 45 s
    where = store.get_uri(INDEX_KEY)
    for name in ("truncated", "nan month"):
        store.put_bytes(INDEX_KEY, CORRUPT[name])
        done = jobs.run_job(capped, tmp_path, timeout=300)
        assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-3000:]
        assert f"the spend index {where} is unreadable" in done.stderr
        assert f"orchestrator storage repair-spend {storage.uri}" in done.stderr
        assert "Traceback" not in done.stderr
        assert not store.exists("capped/ledger.json")  # refused before it took an attempt: it spent nothing

    free = jobs.run_job(jobs.with_overrides(common, "run.name=free"), tmp_path, timeout=300)
    log = free.stdout + free.stderr
    assert free.returncode == 0, log[-3000:]
    assert log.count("is unreadable") == 1 and "no spend cap, so it runs on" in log
    assert jobs.ledger(storage, "free")["status"] == "completed"
    assert store.get_bytes(INDEX_KEY) == CORRUPT["nan month"]

    shown = _cli(["status", "--spend"], tmp_path, storage)
    assert shown.returncode == 2 and shown.stderr.startswith("error: ") and "is unreadable" in shown.stderr
    assert "Traceback" not in shown.stderr
    repaired = _cli(["storage", "repair-spend"], tmp_path, storage)
    assert repaired.returncode == 0, repaired.stderr[-2000:]
    month = month_of(time.time())
    free_cost = jobs.ledger(storage, "free")["cost_usd"]
    assert month_total_usd(json.loads(store.get_bytes(INDEX_KEY)), month) == pytest.approx(free_cost)
    assert _cli(["status", "--spend"], tmp_path, storage).returncode == 0

    # with the index rebuilt, the capped job runs, and is stopped at the month's cap (what it spends past its
    # last grant is its final checkpoint and its close: FINAL_SLACK_USD, ten seconds at this price)
    cap = free_cost + RUN_USD
    done = jobs.run_job(jobs.with_overrides(capped, f"budget.monthly_max_usd={cap}"), tmp_path, timeout=300)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-3000:]
    ledger = jobs.ledger(storage, "capped")
    assert ledger["step"] > 0 and ledger["status"] == "budget_exhausted"
    index = json.loads(store.get_bytes(INDEX_KEY))
    assert month_total_usd(index, month) == pytest.approx(free_cost + ledger["cost_usd"])
    assert cap - RUN_USD / 2 <= month_total_usd(index, month) <= cap + FINAL_SLACK_USD


@pytest.mark.e2e
def test_a_sigkilled_attempt_is_settled_at_its_last_heartbeat_cost_not_its_reservation(tmp_path, s3_server, s3_bucket):
    import random
    import signal

    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    # a 60 s reservation at $0.01/s: $0.60 held, far more than the attempt spends before its SIGKILL
    overrides = jobs.FAST + PRICE + storage.overrides() + ["run.name=killed", "budget.reserve_ahead=60s",
                                                           "train.max_steps=80", "train.eval_at_end=false"]
    rc, log, _ = jobs.interrupt_then_finish(overrides, tmp_path, storage, "killed", random.Random(7), [signal.SIGKILL])
    assert rc == 0, log[-3000:]
    ledger = jobs.ledger(storage, "killed")
    assert [a["exit_class"] for a in ledger["attempts"]] == ["vanished", "completed"]
    index = json.loads(storage.store().get_bytes(INDEX_KEY))
    total = month_total_usd(index, month_of(time.time()))
    assert index["jobs"]["killed"]["open"] == {}
    assert abs(total - ledger["cost_usd"]) <= 0.01, (total, ledger["cost_usd"])  # within one heartbeat (1 s)
