"""``orchestrator status`` and ``orchestrator storage init``, run as a user runs them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.exitcodes import ExitClass
from orchestrator.records.ledger import Ledger
from orchestrator.storage import LocalStore
from orchestrator.storage.lifecycle import apply_lifecycle
from tests.helpers.paths import REPO

REPO_ROOT = REPO


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )


def _write_history(store) -> None:
    """Two attempts: a preempted one on spot-a, then a completed one on spot-b."""
    first = Ledger(store, "exp1")
    first.begin_attempt(host="spot-a", pid=11, instance_type="g5.xlarge", gpu_type="a10g", gpus=1, spot=True, checkpoint_step=0)
    first.set_mlflow_run_id("run-abc")
    first.record_checkpoint(step=20, key="exp1/checkpoints/20-1", size=3 * 1024 * 1024)
    first.end_attempt(ExitClass.PREEMPTED, step=25, cost_usd=0.25, status="preempted")
    second = Ledger(store, "exp1")
    second.begin_attempt(host="spot-b", pid=22, instance_type="g5.xlarge", gpu_type="a10g", gpus=1, spot=True, checkpoint_step=20)
    second.end_attempt(ExitClass.COMPLETED, step=40, cost_usd=0.5, status="completed")


@pytest.fixture(params=["local", "s3"])
def run_uri(request, tmp_path):
    """(``<storage-uri>/exp1``, extra CLI args) for a job with a written history."""
    if request.param == "local":
        _write_history(LocalStore(tmp_path / "runs"))
        return f"{tmp_path / 'runs'}/exp1", []
    store = request.getfixturevalue("s3_store")
    _write_history(store)
    return f"{store.uri}/exp1", ["--endpoint-url", request.getfixturevalue("s3_server").endpoint_url]


@pytest.mark.e2e
def test_status_json(run_uri):
    uri, extra = run_uri
    proc = _cli("status", uri, "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["status"] == "completed"
    assert record["step"] == 40
    assert record["cost_usd"] == pytest.approx(0.75)
    assert record["mlflow_run_id"] == "run-abc"
    assert [a["exit_class"] for a in record["attempts"]] == ["preempted", "completed"]
    assert [(a["fence"], a["host"]) for a in record["attempts"]] == [(1, "spot-a"), (2, "spot-b")]
    assert [c["step"] for c in record["checkpoints"]] == [20]


@pytest.mark.e2e
def test_status_table(run_uri):
    uri, extra = run_uri
    proc = _cli("status", uri, *extra)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "status    completed" in out and "run-abc" in out and "$0.7500" in out
    rows = [line.split() for line in out.splitlines()]
    assert any(r[:2] == ["1", "spot-a"] and "preempted" in r and "0->25" in r for r in rows), out
    assert any(r[:2] == ["2", "spot-b"] and "completed" in r and "20->40" in r for r in rows), out
    assert "exp1/checkpoints/20-1" in out and "3.1 MB" in out


@pytest.mark.e2e
def test_status_reads_endpoint_from_environment(s3_server, s3_store):
    _write_history(s3_store)
    proc = _cli("status", f"{s3_store.uri}/exp1", "--json", env={"AWS_ENDPOINT_URL": s3_server.endpoint_url})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "completed"


@pytest.mark.e2e
def test_status_missing_ledger_names_the_uri(tmp_path):
    proc = _cli("status", f"{tmp_path}/runs/nojob")
    assert proc.returncode == 2 and proc.stderr.startswith("error: no ledger at")
    assert f"no ledger at {tmp_path}/runs/nojob/ledger.json" in proc.stderr
    assert "Traceback" not in proc.stderr


def _bucket_rules(s3_server, uri: str) -> list[dict]:
    """The bucket's lifecycle rules, as S3 itself returns them."""
    bucket = uri[len("s3://"):].split("/", 1)[0]
    return s3_server.client().get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]


@pytest.mark.e2e
def test_storage_init_applies_and_merges_lifecycle(s3_server, s3_bucket):
    bucket = s3_bucket.split("/")[2]
    client = s3_server.client()
    # A rule someone else set must survive.
    client.put_bucket_lifecycle_configuration(
        Bucket=bucket,
        LifecycleConfiguration={"Rules": [
            {"ID": "team-logs", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 30}}
        ]},
    )
    proc = _cli("storage", "init", s3_bucket, "--abort-incomplete-days", "3", "--expire-days", "90",
                "--endpoint-url", s3_server.endpoint_url)
    assert proc.returncode == 0, proc.stderr
    assert "abort incomplete multipart uploads under runs/ after 3 days" in proc.stdout
    assert "expire objects under runs/ after 90 days" in proc.stdout
    rules = {r["ID"]: r for r in _bucket_rules(s3_server, s3_bucket)}
    assert set(rules) == {"team-logs", "orchestrator-abort-incomplete-runs", "orchestrator-expire-runs"}
    assert rules["orchestrator-abort-incomplete-runs"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 3}
    assert rules["orchestrator-abort-incomplete-runs"]["Filter"] == {"Prefix": "runs/"}
    assert rules["orchestrator-expire-runs"]["Expiration"] == {"Days": 90}

    # Re-applying without --expire-days replaces this tool's rules and keeps the others.
    result = apply_lifecycle(s3_bucket, abort_incomplete_days=7, endpoint_url=s3_server.endpoint_url)
    assert result["removed"] == ["orchestrator-expire-runs"] and result["kept"] == ["team-logs"]
    rules = {r["ID"]: r for r in _bucket_rules(s3_server, s3_bucket)}
    assert set(rules) == {"team-logs", "orchestrator-abort-incomplete-runs"}
    assert rules["orchestrator-abort-incomplete-runs"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}


@pytest.mark.e2e
def test_storage_init_refuses_local_uri_and_bad_days(tmp_path, s3_server, s3_bucket):
    proc = _cli("storage", "init", str(tmp_path))
    assert proc.returncode != 0 and "applies to S3 URIs" in proc.stderr and "Traceback" not in proc.stderr
    with pytest.raises(ValueError, match="at least 1"):
        apply_lifecycle(s3_bucket, abort_incomplete_days=0, endpoint_url=s3_server.endpoint_url)


@pytest.mark.e2e
def test_an_attempt_taken_over_shows_as_lost_not_running(tmp_path):
    # a ledger written before begin_attempt marked lost attempts (or by a writer that lost its race):
    # attempt 1 still says "running" although attempt 2 has taken the job over
    store = LocalStore(tmp_path / "runs")
    _write_history(store)
    record = json.loads(store.get_bytes("exp1/ledger.json"))
    record["attempts"][0]["exit_class"] = "running"
    record["attempts"][0]["ended_at"] = None
    store.put_bytes("exp1/ledger.json", json.dumps(record).encode())

    table = _cli("status", f"{tmp_path / 'runs'}/exp1")
    assert table.returncode == 0, table.stderr
    row = next(line.split() for line in table.stdout.splitlines() if line.split()[:2] == ["1", "spot-a"])
    assert "vanished" in row and "(lost)" in row and "running" not in row, table.stdout
    as_json = json.loads(_cli("status", f"{tmp_path / 'runs'}/exp1", "--json").stdout)
    assert [a["exit_class"] for a in as_json["attempts"]] == ["vanished", "completed"]


@pytest.mark.e2e
def test_status_says_how_many_checkpoints_were_committed_beyond_those_kept(tmp_path):
    store = LocalStore(tmp_path / "runs")
    ledger = Ledger(store, "long", keep_checkpoints=2)
    ledger.begin_attempt(host="h", pid=1, instance_type="cpu", gpu_type="none", gpus=0, spot=False, checkpoint_step=0)
    for step in (10, 20, 30, 40, 50):
        ledger.record_checkpoint(step=step, key=f"long/checkpoints/{step:09d}-1", size=10)
    out = _cli("status", f"{tmp_path / 'runs'}/long").stdout
    assert "checkpoints (newest 2 of 5 committed)" in out, out
    assert "long/checkpoints/000000050-1" in out and "long/checkpoints/000000030-1" not in out
