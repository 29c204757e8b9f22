"""Every outcome classified right, end to end: real jobs (``python -m orchestrator.launch``), real signals, a real
kernel OOM kill, the ledger and ``orchestrator status`` as a user reads them.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from orchestrator.core import exitcodes
from tests.helpers import jobs


def _local(tmp_path: Path, run: str) -> tuple[jobs.Storage, list[str]]:
    storage = jobs.Storage(str(tmp_path / "runs"))
    return storage, storage.overrides() + [f"run.name={run}"]


@pytest.mark.e2e
def test_lora_target_modules_the_model_lacks_exit_4_once(tmp_path):
    # only PEFT, inside the trainer, can see that the model has no such module
    storage, named = _local(tmp_path, "badtargets")
    cmd = jobs.with_overrides(jobs.FAST, "recipe.lora_target_modules=[c_attn,c_proj]", "requeue.max_failures=5") + named
    done = jobs.run_job(cmd, tmp_path)
    assert done.returncode == exitcodes.CONFIG_ERROR, done.stderr[-3000:]
    assert "error: recipe.lora_target_modules: the trainer refused it" in done.stderr, done.stderr[-3000:]
    assert "c_attn" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count("attempt exited with code") == 1, "a config error must not be retried"
    ledger = jobs.ledger(storage, "badtargets")
    assert [a["exit_class"] for a in ledger["attempts"]] == ["config_error"]
    assert ledger["status"] == "config_error"


@pytest.mark.e2e
def test_an_unknown_lr_scheduler_is_refused_at_launch(tmp_path):
    storage, named = _local(tmp_path, "badsched")
    done = jobs.run_job(jobs.with_overrides(jobs.FAST, "train.lr_scheduler=cosine_annealing") + named, tmp_path)
    assert done.returncode == exitcodes.CONFIG_ERROR, done.stderr[-3000:]
    assert "train.lr_scheduler='cosine_annealing' is not a transformers scheduler" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not storage.store().exists("badsched/ledger.json"), "no attempt may start"


def _kill_each_attempt_while_loading(proc, storage: jobs.Storage, run: str, kills: int) -> None:
    """SIGKILL the worker as soon as each new attempt has taken its fence, before its first step."""
    for fence in range(1, kills + 1):
        def begun():
            if proc.poll() is not None:
                raise RuntimeError(f"the job ended (rc={proc.returncode}) before attempt {fence} began")
            try:
                attempts = jobs.ledger(storage, run)["attempts"]
            except FileNotFoundError:
                return None
            return len(attempts) >= fence and attempts[fence - 1]["exit_class"] == "running"

        jobs.wait_for(begun, 300, f"attempt {fence} to begin")
        worker = jobs.worker_of(proc)
        assert worker is not None
        worker.send_signal(signal.SIGKILL)
        worker.wait(60)


@pytest.fixture(scope="module")
def lost_while_loading(tmp_path_factory):
    """A job whose machine vanishes three times while it loads, with requeue.max_preemptions=3."""
    tmp_path = tmp_path_factory.mktemp("lost")
    storage, named = _local(tmp_path, "volatile")
    cmd = jobs.with_overrides(jobs.FAST, "requeue.crash_loop_threshold=2", "requeue.max_preemptions=3") + named
    proc = jobs.start_job(cmd, tmp_path)
    try:
        _kill_each_attempt_while_loading(proc, storage, "volatile", kills=3)
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            jobs.kill_group(proc)
    return tmp_path, storage, named, rc, jobs.log_text(tmp_path)


@pytest.mark.e2e
def test_machines_lost_while_loading_are_preemptions_not_a_crash_loop(lost_while_loading):
    tmp_path, storage, _, rc, log = lost_while_loading
    # three attempts without progress, but none failed: the preemption cap stops it, not the breaker
    assert "crash loop" not in log, log[-4000:]
    assert "not requeued: 3 preemptions reached requeue.max_preemptions=3" in log, log[-4000:]
    assert rc == exitcodes.CAPS_REACHED, log[-4000:]
    # the last attempt's machine was lost too: the supervisor records it, so nothing is left "running"
    status = jobs.status_json(storage, "volatile", tmp_path)
    assert [a["exit_class"] for a in status["attempts"]] == ["vanished"] * 3
    assert status["status"] == "preempted"
    table = subprocess.run([jobs.PYTHON, "-m", "orchestrator", "status", f"{storage.uri}/volatile"], cwd=tmp_path,
                           env=jobs.job_env(tmp_path), capture_output=True, text=True, timeout=120).stdout
    assert table.count("vanished (lost)") == 3 and "running" not in table, table


@pytest.mark.e2e
def test_relaunching_a_completed_job_says_so_and_exits_0(lost_while_loading):
    tmp_path, storage, named, _, _ = lost_while_loading
    # the user raises the cap; the job goes on and completes
    cmd = jobs.with_overrides(jobs.FAST, "requeue.crash_loop_threshold=2", "requeue.max_preemptions=10") + named
    done = jobs.run_job(cmd, tmp_path, env=jobs.job_env(tmp_path, {"ORCH_STEP_DELAY_SECONDS": "0"}))  # uninterrupted
    assert done.returncode == 0, done.stderr[-3000:]
    assert jobs.attempt_classes(storage, "volatile") == ["vanished"] * 3 + ["completed"]
    final = storage.store().get_uri("volatile/final/")
    # the same command again: nothing to do, and that is a success
    again = jobs.run_job(cmd, tmp_path)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert f"job 'volatile' is already complete; its final weights are at {final}" in again.stdout, again.stdout
    assert "caps" not in (again.stdout + again.stderr).lower()
    assert "error:" not in again.stderr
    ledger = jobs.ledger(storage, "volatile")
    assert len(ledger["attempts"]) == 4 and ledger["status"] == "completed"


SHM_ROOT = "/dev/shm/orchestrator"


# ---- a real kernel OOM kill, inside a child memory cgroup (cgroup v1 here) ------------------------------

def _own_v1_memory_cgroup() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return folder if (folder / "memory.oom_control").is_file() else Path("/sys/fs/cgroup/memory")
    return None


@pytest.fixture
def job_cgroup():
    """A child memory cgroup of this process's own (no limit of its own), removed afterwards."""
    parent = _own_v1_memory_cgroup()
    if parent is None or not os.access(parent, os.W_OK):
        # fail, not skip: a skipped test would prove nothing (the machines this project is tested on have one)
        pytest.fail("needs a writable cgroup v1 memory hierarchy to make a real OOM kill in a child cgroup "
                    "(run the tests as root on a machine with /sys/fs/cgroup/memory)", pytrace=False)
    folder = parent / f"orch-oom-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    yield folder
    for child in sorted(folder.rglob("*"), reverse=True):
        if child.is_dir():
            _evacuate(child, parent)
            child.rmdir()
    _evacuate(folder, parent)
    folder.rmdir()


def _evacuate(folder: Path, to: Path) -> None:
    for pid in (folder / "cgroup.procs").read_text().split():
        try:
            (to / "cgroup.procs").write_text(pid)
        except OSError:
            pass  # already gone


@pytest.mark.e2e
def test_a_kernel_oom_kill_is_out_of_memory_not_a_preemption(tmp_path, job_cgroup):
    run = f"oomkill-{uuid.uuid4().hex[:6]}"  # /dev/shm is shared by every test run on the machine
    storage, named = _local(tmp_path, run)
    cmd = jobs.with_overrides(jobs.FAST, "train.max_steps=400", "requeue.max_failures=5",
                              f"checkpoint.snapshot_dir={SHM_ROOT}") + named
    # the whole job (launcher = supervisor, and its worker) runs in job_cgroup
    launcher = ["sh", "-c", f'echo $$ > {job_cgroup}/cgroup.procs && exec "$@"', "sh", *jobs.launch_cmd(cmd)]
    log = open(tmp_path / "job.log", "ab")
    proc = subprocess.Popen(launcher, cwd=tmp_path, env=jobs.job_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        jobs.wait_for(lambda: jobs.committed_steps(storage, run), 300, "a first checkpoint")
        worker = jobs.worker_of(proc)
        assert worker is not None
        # the worker alone goes into a grandchild cgroup with 64 KB to grow in (its memory so far stays charged
        # where it was): its next checkpoint snapshot, 0.3 MB of /dev/shm that no reclaim can free, hits the
        # limit and the kernel's OOM killer SIGKILLs it, while the supervisor lives on in job_cgroup
        tight = job_cgroup / "worker"
        tight.mkdir()
        (tight / "memory.limit_in_bytes").write_text(str(64 * 1024))
        (tight / "cgroup.procs").write_text(str(worker.pid))
        try:
            rc = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            pytest.fail("the job did not stop after its worker was OOM-killed")
    finally:
        if proc.poll() is None:
            jobs.kill_group(proc)
        shutil.rmtree(Path(SHM_ROOT) / run, ignore_errors=True)  # the killed worker could not remove its snapshots
    text = jobs.log_text(tmp_path)
    assert "oom_kill 1" in (tight / "memory.oom_control").read_text(), "the kernel did not OOM-kill the worker"
    assert "attempt exited with code -9 (out_of_memory)" in text, text[-4000:]
    assert "the kernel's OOM killer ended the attempt" in text and "train.per_device_batch_size" in text
    assert "not requeued: out of memory in 1 attempt(s)" in text, text[-4000:]
    assert rc == exitcodes.OUT_OF_MEMORY, text[-4000:]
    ledger = jobs.ledger(storage, run)
    assert [a["exit_class"] for a in ledger["attempts"]] == ["out_of_memory"]
    assert ledger["status"] == "failed"
