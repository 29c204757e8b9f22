"""Preemption and requeue, end to end: real jobs, real signals, a real S3 server, a fake EC2 metadata service.

Every job runs as a user runs it (``python -m orchestrator.launch``, in its own
process group) and is interrupted from outside: signals to the worker, SIGKILL
of the whole group, a spot notice, injected crashes, a second launch of the same
job. What is asserted is what a user sees: the exit code and its one-line
reason, the ledger's attempts and their classes, and final weights
byte-identical to an uninterrupted run.
"""
from __future__ import annotations

import datetime as dt
import random
import signal
import time
import uuid

import pytest

from orchestrator.core import exitcodes
from tests.helpers import jobs
from tests.helpers.fixtures_s3 import empty_bucket
from tests.helpers.fake_metadata import FakeMetadata

# Long enough for ten interruptions (each attempt trains a few steps past its restore point) and a finish.
COMMON = jobs.with_overrides(jobs.FAST, "train.max_steps=240")  # room for ten interruptions after fresh commits, however fast attempts start
INTERRUPTIONS = 10
AWS_NOTICE_SECONDS = 120  # EC2 gives a spot instance two minutes between the notice and the stop


@pytest.fixture(scope="module")
def s3_storage(s3_server):
    """One bucket on the S3 server for this module's jobs (each test uses its own run.name)."""
    client = s3_server.client()
    bucket = f"orch-e2e-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    yield jobs.Storage(f"s3://{bucket}/runs", s3_server.endpoint_url)
    empty_bucket(client, bucket)
    client.delete_bucket(Bucket=bucket)


@pytest.fixture(scope="module")
def reference(references) -> str:
    """Final weights of an uninterrupted run of COMMON (shared with every test of this trajectory)."""
    return references.digest(COMMON)


def _local(tmp_path, run: str) -> tuple[jobs.Storage, list[str]]:
    storage = jobs.Storage(str(tmp_path / "runs"))
    return storage, storage.overrides() + [f"run.name={run}"]


@pytest.mark.e2e
def test_ten_random_interruptions_end_with_the_uninterrupted_weights(s3_storage, reference, tmp_path):
    storage, run = s3_storage, "chaos"
    cmd = COMMON + storage.overrides() + [f"run.name={run}"]
    rng = random.Random("preemption-e2e-chaos")
    group_kill_at = rng.randrange(INTERRUPTIONS)
    plan = ["killpg" if i == group_kill_at else rng.choice(["SIGTERM", "SIGKILL"]) for i in range(INTERRUPTIONS)]
    assert {"SIGTERM", "SIGKILL", "killpg"} <= set(plan), plan  # the seed gives a mix
    # SIGTERM: the worker saves and exits 75; SIGKILL (worker or whole group): nothing recorded, so vanished
    expected = ["preempted" if kind == "SIGTERM" else "vanished" for kind in plan] + ["completed"]

    proc = jobs.start_job(cmd, tmp_path)
    done = []
    try:
        for kind in plan:
            # each interruption lands after fresh progress: a new committed checkpoint, then a random pause
            seen = jobs.committed_steps(storage, run)
            step = jobs.wait_for_new_checkpoint(storage, run, proc, seen[-1] if seen else 0, timeout=600)
            time.sleep(rng.uniform(0.1, 0.6))
            if kind == "killpg":
                jobs.kill_group(proc)
                proc = jobs.start_job(cmd, tmp_path)  # a person re-runs the same command
            else:
                worker = jobs.worker_of(proc)
                assert worker is not None, f"no worker to interrupt after {done}"
                worker.send_signal(getattr(signal, kind))
                worker.wait(120)
            done.append((kind, step))
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            jobs.kill_group(proc)
    log = jobs.log_text(tmp_path)
    assert rc == 0, log[-4000:]

    classes = jobs.attempt_classes(storage, run)
    assert classes == expected, f"interruptions (kind, after checkpoint step): {done}"
    status = jobs.status_json(storage, run, tmp_path)
    assert status["status"] == "completed"
    assert [a["exit_class"] for a in status["attempts"]] == expected
    assert jobs.final_digest(storage, run) == reference, f"weights differ after {done}"


@pytest.mark.e2e
def test_aws_spot_notice_commits_a_checkpoint_before_the_deadline(tmp_path):
    storage, named = _local(tmp_path, "notice")
    with FakeMetadata("aws") as imds:
        cmd = jobs.FAST + named + ["preemption.provider=aws", f"preemption.metadata_url={imds.url}",
                                   "preemption.poll_seconds=0.2", "requeue.max_preemptions=0"]
        proc = jobs.start_job(cmd, tmp_path)
        try:
            jobs.wait_for_new_checkpoint(storage, "notice", proc, 0)
            before = jobs.committed_steps(storage, "notice")[-1]
            when = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=AWS_NOTICE_SECONDS)
            imds.notice = {"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
            noticed_at = time.time()
            rc = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                jobs.kill_group(proc)
    log = jobs.log_text(tmp_path)
    # preempted, and requeue.max_preemptions=0 spent: the supervisor stops with the caps-reached code and says why
    assert rc == exitcodes.CAPS_REACHED, log[-4000:]
    assert "not requeued: 1 preemptions reached requeue.max_preemptions=0" in log
    polls = [ok for method, path, ok in imds.requests if method == "GET"]
    assert polls and all(polls), "the watcher must send its IMDSv2 token with every poll"

    ledger = jobs.ledger(storage, "notice")
    assert [a["exit_class"] for a in ledger["attempts"]] == ["preempted"]
    emergency = max(ledger["checkpoints"], key=lambda c: c["step"])
    assert emergency["step"] > before and emergency["step"] == ledger["attempts"][0]["step_end"]
    assert f"emergency checkpoint at step {emergency['step']} committed" in log
    assert emergency["step"] == jobs.committed_steps(storage, "notice")[-1]
    delay = emergency["time"] - noticed_at
    print(f"\nspot notice to committed checkpoint: {delay:.2f}s (step {emergency['step']}; "
          f"the notice gave {AWS_NOTICE_SECONDS}s, preemption.grace 30s)")
    assert 0 < delay < AWS_NOTICE_SECONDS


@pytest.mark.e2e
def test_a_job_that_always_crashes_stops_at_max_failures_and_stays_stopped(tmp_path):
    storage, named = _local(tmp_path, "crashy")
    cmd = jobs.with_overrides(jobs.FAST, "checkpoint.every_steps=1", "requeue.max_failures=3",
                              "requeue.crash_loop_threshold=100", "requeue.backoff_base_seconds=0.1") + named
    env = jobs.job_env(tmp_path, {"ORCH_FAULT_AFTER_STEPS": "3"})

    first = jobs.run_job(cmd, tmp_path, env=env)
    assert first.returncode not in (0, exitcodes.PREEMPTED), first.stderr[-3000:]
    assert "not requeued: 3 failures reached requeue.max_failures=3" in first.stderr
    ledger = jobs.ledger(storage, "crashy")
    assert [a["exit_class"] for a in ledger["attempts"]] == ["crashed"] * 3
    starts = [a["checkpoint_step_at_start"] for a in ledger["attempts"]]
    assert starts == sorted(set(starts)), f"each attempt resumes further on: {starts}"

    # a person retries: the caps are in the ledger, so no new attempt starts, and the reason is printed
    again = jobs.run_job(cmd, tmp_path, env=env)
    assert again.returncode == exitcodes.CAPS_REACHED, again.stderr[-3000:]
    assert "3 failed attempts already reached requeue.max_failures=3" in again.stderr
    ledger = jobs.ledger(storage, "crashy")
    assert len(ledger["attempts"]) == 3
    assert ledger["status"] == "caps_reached"


@pytest.mark.e2e
def test_crashing_before_any_checkpoint_trips_the_crash_loop_breaker(tmp_path):
    storage, named = _local(tmp_path, "loop")
    cmd = jobs.with_overrides(jobs.FAST, "checkpoint.every=1h", "requeue.max_failures=10",
                              "requeue.crash_loop_threshold=2", "requeue.backoff_base_seconds=0.1") + named
    done = jobs.run_job(cmd, tmp_path, env=jobs.job_env(tmp_path, {"ORCH_FAULT_AFTER_STEPS": "1"}))
    assert done.returncode not in (0, exitcodes.PREEMPTED), done.stderr[-3000:]
    assert "not requeued: crash loop: the last 2 attempts made no progress" in done.stderr, done.stderr[-3000:]
    assert jobs.attempt_classes(storage, "loop") == ["crashed", "crashed"]
    assert jobs.committed_steps(storage, "loop") == []


@pytest.mark.e2e
def test_two_launches_of_one_job_one_trains_the_other_steps_aside(s3_storage, reference, tmp_path):
    storage, run = s3_storage, "twice"
    cmd = COMMON + storage.overrides() + [f"run.name={run}"]
    procs = [jobs.start_job(cmd, tmp_path, log_name=f"launch{i}.log") for i in range(2)]
    newest = []
    try:
        deadline = time.monotonic() + 600
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            steps = jobs.committed_steps(storage, run)
            if steps:
                newest.append(steps[-1])
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                jobs.kill_group(p)
    rcs = [p.returncode for p in procs]
    logs = [jobs.log_text(tmp_path, f"launch{i}.log") for i in range(2)]
    assert sorted(rcs) == [0, exitcodes.FENCED], (rcs, [log[-3000:] for log in logs])
    loser = logs[rcs.index(exitcodes.FENCED)]
    assert "took over this job" in loser, loser[-3000:]
    assert loser.count("attempt exited with code") == 1, "the fenced attempt must not be requeued"

    assert newest == sorted(newest), f"the newest committed checkpoint went backwards: {newest}"
    ledger = jobs.ledger(storage, run)
    assert ledger["status"] == "completed" and ledger["attempts"][-1]["exit_class"] == "completed"
    assert jobs.final_digest(storage, run) == reference
