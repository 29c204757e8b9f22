"""Slurm, for real: a job requeued mid-run by ``scontrol requeue`` resumes and ends bit-identical.

The job is launched as a user launches it (``python -m orchestrator.launch
backend=slurm ...``) on the one-node cluster of ``tests/slurm_cluster.py``.
Once it has committed a checkpoint it is requeued with ``scontrol requeue``:
Slurm then sends SIGCONT and SIGTERM to every process of the batch step (the
batch shell and the worker; SIGKILL follows after the cluster's KillWait), so
the worker saves an emergency checkpoint and exits 75 when it can, and is
killed otherwise. Slurm holds a requeued job for about two minutes (its
BeginTime); the test releases it at once with ``scontrol update
StartTime=now+3``. The second run restores the newest checkpoint and completes;
its final weights must be byte-identical to those of an uninterrupted local run
of the same config, which runs meanwhile.
"""
from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.helpers import jobs
from tests.helpers.slurm_cluster import RELEASE, ensure_slurm
from tests.helpers.webhooks import WebhookReceiver

pytestmark = pytest.mark.xdist_group("slurm")  # one Slurm node: its tests run one at a time

# Long enough that the job is still training when the test requeues it (after
# its first committed checkpoint): about 20-40 s of training on an idle 2-core
# machine, with a checkpoint every second.
MAX_STEPS = 200
IMAGE = "registry.example/spot-orchestrator:test-1"
SLACK_PATH_SECRET = "XoxbSLACKPATH0123456789"
SCONTROL_TIMEOUT_SECONDS = 30
JOB_START_TIMEOUT_SECONDS = 600  # queueing, then the worker's start-up and first checkpoint
JOB_END_TIMEOUT_SECONDS = 1200  # the machine is shared: be generous
FINAL_JOB_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                    "DEADLINE", "PREEMPTED"}


def scontrol(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_SECONDS)
    if check and done.returncode != 0:
        raise AssertionError(f"scontrol {' '.join(args)} failed ({done.returncode}): {done.stderr or done.stdout}")
    return done


def job_info(job_id: str) -> dict[str, str]:
    """``scontrol show job`` as a dict; empty when Slurm no longer knows the job (past MinJobAge)."""
    done = scontrol("show", "job", "--oneliner", job_id, check=False)
    if done.returncode != 0:
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", done.stdout))


def job_state(job_id: str) -> str:
    return job_info(job_id).get("JobState", "GONE")


def worker_environ(pid: int) -> dict[str, str]:
    """The environment of a process on this host (the one-node cluster runs its jobs here)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def output_text(path: Path | None) -> str:
    return path.read_text(errors="replace") if path and path.exists() else "(no Slurm output file)"


@pytest.mark.e2e
@pytest.mark.slurm
def test_slurm_requeue_mid_run_resumes_bit_identical(tmp_path, references):
    ensure_slurm()
    receiver = WebhookReceiver()
    hook = f"http://127.0.0.1:{receiver.port}/services/T0AAAA/B0BBBB/{SLACK_PATH_SECRET}"
    storage = jobs.Storage(str(tmp_path / "runs"))
    common = jobs.with_overrides(jobs.FAST, f"train.max_steps={MAX_STEPS}", "train.logging_steps=20")
    common += storage.overrides()
    run = f"slurm-e2e-{uuid.uuid4().hex[:8]}"
    env = jobs.job_env(tmp_path)  # sbatch exports it (--export=ALL is its default): ORCH_CACHE_DIR, PATH, ...

    job_id = None
    out_file = None
    try:
        # a secret (a Slack-style webhook path) and an image: the script must name neither secret nor lose
        # the image; the worker gets the webhook through the environment sbatch exports
        slurm_only = ["backend=slurm", f"run.name={run}", f"backend.image={IMAGE}", f"budget.webhook_url={hook}",
                      "budget.max_usd=1000", "compute.price_per_hour=1", "budget.alert_thresholds=[0.000001]"]
        submitted = jobs.run_job(common + slurm_only, tmp_path, env=env, timeout=300)
        assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
        found = re.search(r"submitted .* to slurm: job (\d+)", submitted.stdout)
        assert found, f"the launcher printed no Slurm job id:\n{submitted.stdout[-2000:]}"
        job_id = found.group(1)
        out_file = tmp_path / ".cache" / "work" / "slurm" / f"{run}-{job_id}.out"
        script = (tmp_path / ".cache" / "work" / "slurm" / f"{run}.sbatch").read_text()
        assert "--requeue" in script and f"cd {tmp_path}" in script, script
        assert SLACK_PATH_SECRET not in script and f"export ORCH_CONTAINER_IMAGE={IMAGE}" in script, script

        # 1. the job runs and commits a checkpoint
        def trained_a_while():
            state = job_state(job_id)
            if state in FINAL_JOB_STATES or state == "GONE":
                raise AssertionError(f"job {job_id} ended ({state}) before a checkpoint:\n{output_text(out_file)}")
            return state == "RUNNING" and jobs.committed_steps(storage, run)

        try:
            jobs.wait_for(trained_a_while, JOB_START_TIMEOUT_SECONDS, f"Slurm job {job_id} to commit a checkpoint", 0.2)
        except TimeoutError as err:
            raise AssertionError(f"{err}; job {job_info(job_id)}\n{output_text(out_file)[-6000:]}") from None
        assert jobs.ledger(storage, run)["status"] == "running", "the job completed before the requeue: raise MAX_STEPS"
        requeued_after = jobs.committed_steps(storage, run)[-1]
        # the worker runs with the submitter's environment (the tiny model's cache, not a rebuild elsewhere)
        worker_env = worker_environ(jobs.ledger(storage, run)["attempts"][-1]["pid"])
        assert worker_env.get("ORCH_CACHE_DIR") == env["ORCH_CACHE_DIR"], sorted(worker_env)

        # 2. requeue it mid-run; release it from Slurm's two-minute hold once it is pending again
        scontrol("requeue", job_id)
        jobs.wait_for(lambda: job_state(job_id) == "PENDING", 120, f"job {job_id} to be pending after the requeue", 0.5)
        scontrol("update", f"JobId={job_id}", RELEASE)

        # 3. the second run resumes and completes
        try:
            jobs.wait_for(lambda: job_state(job_id) in FINAL_JOB_STATES | {"GONE"}, JOB_END_TIMEOUT_SECONDS,
                          f"Slurm job {job_id} to finish", 1.0)
        except TimeoutError as err:
            raise AssertionError(f"{err}; job {job_info(job_id)}\n{output_text(out_file)[-6000:]}") from None
        info = job_info(job_id)
        log = output_text(out_file)
        assert info.get("JobState", "COMPLETED") == "COMPLETED", (info, log[-6000:])
        assert int(info.get("Restarts", "1")) >= 1, info
    finally:
        receiver.close()
        if job_id and job_state(job_id) not in FINAL_JOB_STATES | {"GONE"}:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=SCONTROL_TIMEOUT_SECONDS)

    # what Slurm did on the requeue, as the batch shell and the worker logged it
    print(f"\n--- Slurm job {job_id} output ({out_file}):\n" + "\n".join(
        line for line in log.splitlines()
        if re.search(r"slurm job|slurmstepd|emergency checkpoint|restoring checkpoint|scontrol|error", line)
    ))
    assert "DUE TO JOB REQUEUE" in log, log[-6000:]
    assert "restoring checkpoint" in log, log[-6000:]

    ledger = jobs.ledger(storage, run)
    classes = [a["exit_class"] for a in ledger["attempts"]]
    assert len(classes) >= 2, classes
    assert classes[0] in ("preempted", "vanished"), classes
    assert classes[-1] == "completed", classes
    assert ledger["status"] == "completed", ledger["status"]
    assert ledger["attempts"][-1]["checkpoint_step_at_start"] >= requeued_after, (ledger["attempts"], requeued_after)
    assert jobs.final_digest(storage, run) == references.digest(common), (
        f"the requeued Slurm job's final weights differ from the uninterrupted local run (requeued after step "
        f"{requeued_after}; attempts {classes})"
    )
    # every attempt recorded the code and the image it ran (the ledger's reproducibility record)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=jobs.REPO, capture_output=True, text=True).stdout.strip()
    records = [a["extra"]["repro"] for a in ledger["attempts"] if "repro" in a["extra"]]
    assert len(records) >= 2, ledger["attempts"]
    for record in records:
        assert (record["image"], record["git_commit"]) == (IMAGE, head or None), record
    # the webhook secret reached the worker (by the environment sbatch exported), not the script
    assert receiver.paths and receiver.paths[0] == f"/services/T0AAAA/B0BBBB/{SLACK_PATH_SECRET}", receiver.paths
    assert SLACK_PATH_SECRET not in log


@pytest.mark.e2e
@pytest.mark.mlflow
@pytest.mark.slurm
def test_slurm_deadline_moves_the_job_to_the_on_demand_partition(tmp_path, mlflow_server, references):
    """A spot job whose deadline only on-demand can meet (20 minutes, two restarts of 15 minutes each: the time
    left is less than the work left plus two restarts from its first heartbeat on) is moved from partition
    ``spot`` to ``ondemand``, finishes there with the weights of an uninterrupted run (jobs.FAST's reference,
    shared with other tests), and its ledger, MLflow run and the budget webhook say why."""
    from mlflow.tracking import MlflowClient

    ensure_slurm()
    receiver = WebhookReceiver()
    storage = jobs.Storage(str(tmp_path / "runs"))
    run = f"slurm-deadline-{uuid.uuid4().hex[:8]}"
    experiment = f"deadline-{uuid.uuid4().hex[:6]}"
    overrides = [o for o in jobs.FAST if not o.startswith("tracking.")] + storage.overrides() + [
        "backend=slurm", "backend.partition=spot", "backend.on_demand_partition=ondemand", f"run.name={run}",
        "compute.spot=true", "run.deadline=20m", "compute.restart_seconds=900", "checkpoint.every=auto",
        "checkpoint.min_every=1s", "tracking.enabled=true", f"tracking.uri={mlflow_server.uri}",
        f"tracking.experiment={experiment}", "budget.webhook_url_env=DEADLINE_TEST_HOOK"]
    env = jobs.job_env(tmp_path, {"DEADLINE_TEST_HOOK": receiver.url})  # sbatch exports it to the job
    env.pop("MLFLOW_TRACKING_URI", None)
    slurm_dir = tmp_path / ".cache" / "work" / "slurm"
    jobs_seen: list[str] = []
    try:
        submitted = jobs.run_job(overrides, tmp_path, env=env, timeout=300)
        assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
        first = re.search(r"submitted .* to slurm: job (\d+)", submitted.stdout).group(1)
        jobs_seen.append(first)
        assert job_info(first).get("Partition") == "spot", job_info(first)

        def moved():  # the spot job's batch script submits the job again, to the on-demand partition
            log = output_text(slurm_dir / f"{run}-{first}.out")
            found = re.search(r"moved from partition spot to ondemand as job (\d+)", log)
            if not found and job_state(first) in FINAL_JOB_STATES | {"GONE"}:
                raise AssertionError(f"job {first} ended without moving:\n{log[-6000:]}")
            return found and found.group(1)

        second = jobs.wait_for(moved, JOB_START_TIMEOUT_SECONDS, f"Slurm job {first} to move", 0.5)
        jobs_seen.append(second)
        assert job_info(second).get("Partition") == "ondemand", job_info(second)
        jobs.wait_for(lambda: job_state(second) in FINAL_JOB_STATES | {"GONE"}, JOB_END_TIMEOUT_SECONDS,
                      f"Slurm job {second} to finish", 1.0)
        log = output_text(slurm_dir / f"{run}-{second}.out")
        assert job_info(second).get("JobState", "COMPLETED") == "COMPLETED", log[-6000:]
    finally:
        receiver.close()
        for job_id in jobs_seen:
            if job_state(job_id) not in FINAL_JOB_STATES | {"GONE"}:
                subprocess.run(["scancel", job_id], capture_output=True, timeout=SCONTROL_TIMEOUT_SECONDS)

    for job_id in jobs_seen:  # what the batch shells and the workers said about the move
        print(f"\n--- Slurm job {job_id}:\n" + "\n".join(
            line for line in output_text(slurm_dir / f"{run}-{job_id}.out").splitlines()
            if re.search(r"slurm job|capacity|checkpoint_interval|emergency|restoring|start to first", line)))
    ledger = jobs.ledger(storage, run)
    assert ledger["status"] == "completed", ledger["status"]
    spot, on_demand = ledger["attempts"][0], ledger["attempts"][-1]
    assert (spot["spot"], spot["exit_class"], spot["extra"]["capacity_switch"]) == (True, "preempted", "on_demand")
    assert (on_demand["spot"], on_demand["exit_class"]) == (False, "completed"), ledger["attempts"]
    assert on_demand["checkpoint_step_at_start"] > 0, "the on-demand attempt did not resume the spot one's checkpoint"
    [decision] = ledger["capacity"]
    assert (decision["previous"], decision["capacity"], decision["locked"]) == ("spot", "on_demand", True), decision
    assert "less than the work left plus two restarts" in decision["reason"], decision
    assert decision["restart_source"] == "compute.restart_seconds" and "moving the job" in decision["action"]
    assert spot["extra"]["restart"]["total_s"] > 0, spot["extra"]
    # checkpoint.every=auto: re-derived from the emergency checkpoint's measured cost; on-demand expects no preemption
    assert spot["extra"]["checkpoint_interval"]["cost_source"] == "measured", spot["extra"]
    assert on_demand["extra"]["checkpoint_interval"]["bound"] == "max_every", on_demand["extra"]

    mlrun = MlflowClient(tracking_uri=mlflow_server.uri).search_runs(
        [MlflowClient(tracking_uri=mlflow_server.uri).get_experiment_by_name(experiment).experiment_id],
        filter_string=f"tags.job = '{run}'")
    assert len(mlrun) == 1, mlrun
    tags = mlrun[0].data.tags
    assert tags["capacity"] == "on_demand" and tags["capacity.reason"] == decision["reason"], tags
    assert "capacity [spot -> on-demand]" in tags["capacity.decision.1"], tags
    assert "ops/checkpoint_interval_s" in mlrun[0].data.metrics, mlrun[0].data.metrics
    texts = [b["text"] for b in receiver.bodies]
    assert any("capacity [spot -> on-demand]" in t and "two restarts" in t for t in texts), texts
    assert jobs.final_digest(storage, run) == references.digest(jobs.FAST), "the moved job's weights differ"
