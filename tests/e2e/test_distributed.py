"""Two-process CPU training (gloo): DDP and DeepSpeed ZeRO-2 resume exactly after a SIGKILL.

The ranks are started by torchrun under ``python -m orchestrator.worker`` (forked from torchrun's agent,
``orchestrator.process.forked_ranks``; the torchrun command with ``requeue.fork_attempts=false``); a
SIGKILL of the worker takes torchrun and the ranks along (as a vanished machine
would), the supervisor requeues, and the final weights must match an
uninterrupted two-process run byte for byte.
"""
from __future__ import annotations

import random
import signal

import pytest

from tests.helpers import jobs

# evaluations during training too: every rank evaluates and generates, rank 0's metric is broadcast
DIST_FAST = [o for o in jobs.FAST if not o.startswith("train.max_steps")] + ["train.max_steps=30", "train.eval_steps=10"]


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["ddp", "zero2"])
def test_two_process_run_resumes_bit_identical(mode, tmp_path, references):
    storage = jobs.Storage(str(tmp_path / "runs"))
    common = DIST_FAST + [f"distributed={mode}", "distributed.processes_per_node=2"] + storage.overrides()
    run = f"chaos-{mode}"
    rc, log, killed_at = jobs.interrupt_then_finish(common + [f"run.name={run}"], tmp_path, storage, run,
                                                    random.Random(mode), [signal.SIGKILL], timeout=900)
    assert rc == 0, log[-4000:]
    ledger = jobs.ledger(storage, run)
    assert [a["exit_class"] for a in ledger["attempts"]] == ["vanished", "completed"], killed_at
    # each attempt's ranks forked from torchrun's agent in a launcher that imported the stack once
    assert log.count("its ranks are forked from torchrun's agent") == 2, log[-4000:]
    assert [a["extra"]["restart"]["forked"] for a in ledger["attempts"]] == [1.0, 1.0]
    if mode == "zero2":  # on a CPU machine DeepSpeed builds and loads no C++ op that ZeRO never calls
        assert "deepspeed_shm_comm" not in log, log[-4000:]
    assert jobs.final_digest(storage, run) == references.digest(common)


@pytest.mark.e2e
def test_a_different_world_size_is_refused_with_the_fix(tmp_path):
    storage = jobs.Storage(str(tmp_path / "runs"))
    common = DIST_FAST + storage.overrides() + ["run.name=ws"]
    # ranks as fresh interpreters under the torchrun command (requeue.fork_attempts=false): that path runs here
    proc = jobs.start_job(common + ["distributed=ddp", "distributed.processes_per_node=2", "requeue.max_preemptions=0",
                                    "requeue.fork_attempts=false"], tmp_path)
    try:
        jobs.interrupt_worker(proc, storage, "ws", random.Random(0))
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    again = jobs.run_job(common + ["distributed=none"], tmp_path, timeout=600)
    assert again.returncode == 4, again.stderr[-3000:]
    assert "written by 2 training processes; this attempt has 1" in again.stderr
    assert "checkpoint.allow_config_change=true" in again.stderr
    assert "ranks start a fresh interpreter each under torchrun: requeue.fork_attempts=false" in jobs.log_text(tmp_path)
