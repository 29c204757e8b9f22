"""``compute.zones`` on a real job through the local backend, its storage on moto's S3 server: the first attempt
runs in the cheapest zone, a preemption there sends the next attempt to another zone (the cooldown), and the
ledger, ``orchestrator status``, the cost report and the MLflow run show both zones with their prices and reasons;
each attempt's meter billed its zone's fetched price."""
from __future__ import annotations

import random
import signal
import subprocess
import time

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.money.prices import FetchedPrice, write_cache
from orchestrator.records.ledger_record import LedgerRecord
from tests.helpers import jobs

PRICES = {"us-east-1a": 0.15, "us-east-1b": 0.18}  # g4dn.xlarge spot, the whole machine (1 x T4), per hour


@pytest.mark.e2e
def test_a_job_preempted_in_its_zone_moves_to_the_next_and_records_both(tmp_path, s3_server, s3_bucket,
                                                                        mlflow_server):
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    now = time.time()
    write_cache(storage.store(), [FetchedPrice("t4", "aws", "spot", "us-east-1", zone, "g4dn.xlarge", 1, usd, now - 60,
                                               "aws ec2 spot price history") for zone, usd in PRICES.items()])
    overrides = jobs.with_overrides(
        jobs.FAST + storage.overrides(), "run.name=zones", "tracking.enabled=true", f"tracking.uri={mlflow_server.uri}",
        "tracking.experiment=zones", "compute=t4-spot", "compute.cloud=aws",
        "train.mixed_precision=no", "train.max_steps=60", "compute.zones=[us-east-1a,us-east-1b]",
        "compute.zone_cooldown=10m", f"storage.region={s3_server.region}")
    env = jobs.job_env(tmp_path)
    env.pop("MLFLOW_TRACKING_URI", None)  # tracking.uri must be the one used
    rc, log, _ = jobs.interrupt_then_finish(overrides, tmp_path, storage, "zones", random.Random(7), [signal.SIGTERM],
                                            env=env)
    assert rc == 0, log[-4000:]

    raw = jobs.ledger(storage, "zones")
    record = LedgerRecord.decode(raw, "ledger.json")
    first, last = record.attempts[0], record.attempts[-1]
    assert (first.zone, first.exit_class, first.zone_usd_per_hour) == ("us-east-1a", "preempted", 0.15), raw
    assert (last.zone, last.exit_class, last.zone_usd_per_hour) == ("us-east-1b", "completed", 0.18), raw
    assert first.zone_region == last.zone_region == "us-east-1"
    assert first.zone_reason.startswith("us-east-1a: $") and "$0.150/h spot (fetched" in first.zone_reason
    assert "$0.180/h spot (fetched" in last.zone_reason and "1 of the job's own" not in last.zone_reason
    for a in (first, last):  # each meter billed its zone's price (the catalog's t4 spot is $0.21/h)
        billed_seconds = a.cost_usd / (a.zone_usd_per_hour / 3600.0)
        held = a.end - a.started_at
        assert held - 1.0 <= billed_seconds <= held + 10.0, (a.fence, billed_seconds, held)

    status = subprocess.run([jobs.PYTHON, "-m", "orchestrator", "status", f"{storage.uri}/zones", "--endpoint-url",
                             storage.endpoint_url], cwd=tmp_path, env=jobs.job_env(tmp_path), capture_output=True,
                            text=True, timeout=120)
    assert status.returncode == 0, status.stderr[-2000:]
    for needle in ("attempt 1  us-east-1a (us-east-1)  $0.1500/h: us-east-1a: $",
                   f"attempt {last.fence}  us-east-1b (us-east-1)  $0.1800/h: us-east-1b: $"):
        assert needle in status.stdout, status.stdout

    # the cost report the job printed at its end (money/report.py): cost per zone
    rows = {line.split()[0]: line.split() for line in log.splitlines() if line.startswith("us-east-1")}
    assert rows["us-east-1a"][1:3] == ["1", "1"] and rows["us-east-1a"][-1] == "0.1500", log[-3000:]
    assert rows["us-east-1b"][2] == "0" and rows["us-east-1b"][-1] == "0.1800", log[-3000:]

    tags = MlflowClient(tracking_uri=mlflow_server.uri).get_run(record.mlflow_run_id).data.tags
    assert tags["zone"] == "us-east-1b" and tags["zone_usd_per_hour"] == "0.1800", tags
    assert tags["zones"] == f"1:us-east-1a {last.fence}:us-east-1b", tags
    assert tags["zone_reason"] == last.zone_reason
