"""Two nodes on this host (the local backend's world: a store process and one worker per node, each in its
own process group with its own loopback address), CPU, gloo, the tiny model: restart-the-world.

Every interrupted job is compared with one uninterrupted two-node run of the same trajectory (shared through
``references``): its final weights must be byte-identical.
"""
from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.helpers import jobs

HEARTBEAT_S = 5
TWO_NODES = [o for o in jobs.FAST if not o.startswith("train.max_steps")] + [
    "train.max_steps=30", "distributed=ddp", "distributed.processes_per_node=1", "distributed.nodes=2",
    "compute.nodes=2", f"distributed.heartbeat_timeout={HEARTBEAT_S}s"]


def nodes_of(proc) -> dict[int, psutil.Process]:
    """The current attempt's node launchers (the supervisor's worker children), by node rank."""
    out = {}
    try:
        kids = psutil.Process(proc.pid).children()
    except psutil.NoSuchProcess:
        return out
    for kid in kids:
        try:
            name = kid.name()  # distributed.name_process: a forked node has no ORCH_NODE_RANK in /proc's environ
            if name.startswith("orch-node"):
                out[int(name.removeprefix("orch-node"))] = kid
        except psutil.Error:
            continue
    return out


def node_holding_rank0(proc) -> int:
    def find():
        for number, node in nodes_of(proc).items():
            for p in node.children(recursive=True):
                try:
                    if p.name() == "orch-rank0":  # distributed.name_rank
                        return str(number)
                except psutil.Error:
                    continue
        return None

    return int(jobs.wait_for(find, 300, "the node holding rank 0"))


def whole_node(node: psutil.Process) -> list[psutil.Process]:
    """A node's launcher, its torchrun agent and its workers: what a machine's loss takes."""
    return [node, *node.children(recursive=True)]


def signal_node(node: psutil.Process, how) -> None:
    for p in whole_node(node):
        try:
            how(p)
        except psutil.Error:
            pass


def running_hosts(storage, run) -> list:
    attempts = jobs.ledger(storage, run).get("attempts") or [{}]
    nodes = attempts[-1].get("nodes") if attempts[-1].get("exit_class") == "running" else None
    return [n.get("host") for n in nodes or []]


def after_commit(proc, storage, run) -> int:
    seen = jobs.committed_steps(storage, run)
    return jobs.wait_for_new_checkpoint(storage, run, proc, seen[-1] if seen else 0)


MODES = {"ddp": TWO_NODES, "zero2": jobs.with_overrides(TWO_NODES, "distributed=zero2", "recipe.peft=full"),
         "fsdp": jobs.with_overrides(TWO_NODES, "distributed=fsdp")}


def own_disks(tmp_path, snapshots: str) -> list[str]:
    """Each node its own ``run.work_dir`` (no folder in common, as SkyPilot's VMs or the JobSet's pods)."""
    return [f"run.work_dir={tmp_path}/disk-${{oc.env:ORCH_NODE_RANK,launcher}}", f"checkpoint.snapshot_dir={snapshots}"]


def assert_own_disks(tmp_path, log: str, snapshots: str) -> None:
    assert (tmp_path / "disk-0").is_dir() and (tmp_path / "disk-1").is_dir()
    assert "downloaded and verified on this node" in log  # a node restored from its own download
    assert ("uploaded by this node" in log) is (snapshots == "work"), log[-3000:]


@pytest.mark.e2e
@pytest.mark.parametrize("mode,snapshots", [("ddp", "work"), ("zero2", "work"), ("fsdp", None)],
                         ids=["ddp", "zero2", "fsdp"])
def test_losing_either_node_restarts_the_world_bit_identical(mode, snapshots, tmp_path, references):
    """Node 1's agent and worker SIGKILLed mid-run, then (next attempt) the node of rank 0: the job completes
    with the uninterrupted two-node run's weights (SFT LoRA on DDP; full fine-tune on ZeRO-2; SFT LoRA on FSDP,
    gloo on CPU), and every node of each attempt is in the ledger. DDP and ZeRO-2 run with disks of their own
    and snapshots on each node's disk (``work``): node 1's files go into the one checkpoint by node 1's own upload
    and every node restores the checkpoint into its own folder; FSDP runs on one shared folder."""
    storage = jobs.Storage(str(tmp_path / "runs"))
    run = f"two-nodes-kill-{mode}"
    common = MODES[mode]
    disks = own_disks(tmp_path, snapshots) if snapshots else []
    proc = jobs.start_job(common + storage.overrides() + [f"run.name={run}", *disks], tmp_path)
    try:
        for victim in (lambda: 1, lambda: node_holding_rank0(proc)):
            after_commit(proc, storage, run)
            number = victim()
            node = nodes_of(proc)[number]
            signal_node(node, lambda p: p.kill())
            jobs.wait_for(lambda: node.pid not in {n.pid for n in nodes_of(proc).values()}, 120, "a new attempt")
        rc = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            jobs.kill_group(proc)
    log = jobs.log_text(tmp_path)
    assert rc == 0, log[-4000:]
    ledger = jobs.ledger(storage, run)
    assert [a["exit_class"] for a in ledger["attempts"]] == ["vanished", "vanished", "completed"], log[-3000:]
    for attempt in ledger["attempts"]:
        assert [n["host"] for n in attempt["nodes"]] == ["127.0.0.1", "127.0.0.2"]
        assert all(n["started_at"] <= n["ended_at"] for n in attempt["nodes"])
    if snapshots:
        assert_own_disks(tmp_path, log, snapshots)
    assert jobs.final_digest(storage, run) == references.digest(common)


@pytest.mark.e2e
def test_a_frozen_node_ends_the_attempt_vanished_within_the_heartbeat_timeout(tmp_path, references):
    storage = jobs.Storage(str(tmp_path / "runs"))
    run = "two-nodes-stop"
    proc = jobs.start_job(TWO_NODES + storage.overrides() + [f"run.name={run}"], tmp_path)
    try:
        after_commit(proc, storage, run)
        node = nodes_of(proc)[1]
        signal_node(node, lambda p: p.suspend())  # SIGSTOP: the node is there and silent
        stopped = time.monotonic()
        jobs.wait_for(lambda: not node.is_running() or node.status() == psutil.STATUS_ZOMBIE, 120,
                      "the frozen node's attempt to end")
        took = time.monotonic() - stopped
        rc = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            jobs.kill_group(proc)
    log = jobs.log_text(tmp_path)
    assert rc == 0, log[-4000:]
    assert jobs.attempt_classes(storage, run) == ["vanished", "completed"]
    assert "node 1 sent no heartbeat for" in log
    # noticed at the timeout (plus a tick), the ranks killed, the frozen node killed after a short grace
    assert took < HEARTBEAT_S + 15, took
    assert jobs.final_digest(storage, run) == references.digest(TWO_NODES)


@pytest.mark.e2e
def test_a_notice_to_one_node_commits_one_emergency_checkpoint_of_both(tmp_path, references):
    storage = jobs.Storage(str(tmp_path / "runs"))
    run = "two-nodes-notice"
    proc = jobs.start_job(TWO_NODES + storage.overrides() + [f"run.name={run}"], tmp_path)
    try:
        after_commit(proc, storage, run)
        # each node's launcher records itself in the running attempt (what Slurm's, SkyPilot's and the JobSet's
        # nodes run too); the supervisor writes nothing before the world has ended
        jobs.wait_for(lambda: running_hosts(storage, run) == ["127.0.0.1", "127.0.0.2"], 60, "both nodes recorded")
        nodes_of(proc)[1].send_signal(signal.SIGTERM)  # node 1's launcher only: its spot notice
        jobs.wait_for(lambda: len(jobs.attempt_classes(storage, run)) == 2, 300, "the second attempt")
        rc = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            jobs.kill_group(proc)
    log = jobs.log_text(tmp_path)
    assert rc == 0, log[-4000:]
    ledger = jobs.ledger(storage, run)
    first, second = ledger["attempts"]
    assert [first["exit_class"], second["exit_class"]] == ["preempted", "completed"]
    assert [n["exit"] for n in first["nodes"]] == [75, 75]  # both nodes saved and stopped
    assert [n["exit"] for n in second["nodes"]] == [0, 0]
    assert first["checkpoint_step_end"] == first["step_end"] == second["step_start"]  # one emergency checkpoint
    assert "another node got SIGTERM" in log
    assert jobs.final_digest(storage, run) == references.digest(TWO_NODES)


@pytest.mark.e2e
def test_nodes_with_disks_of_their_own_and_snapshots_in_memory_restore_their_own_files_bit_identical(tmp_path,
                                                                                                    references):
    """Disks of their own with snapshots in memory (``auto``: ``/dev/shm``, which this host's two nodes share):
    rank 0 uploads every node's files. After node 1's SIGKILL every node restores the checkpoint into its own
    folder, and the job completes with the uninterrupted two-node run's weights (SFT LoRA on DDP). Snapshots on
    each node's own disk are proved by the restart-the-world test's DDP and ZeRO-2 cases."""
    storage = jobs.Storage(str(tmp_path / "runs"))
    run = "two-nodes-own-disks-auto"
    proc = jobs.start_job(TWO_NODES + storage.overrides() + [f"run.name={run}", *own_disks(tmp_path, "auto")],
                          tmp_path)
    try:
        after_commit(proc, storage, run)
        node = nodes_of(proc)[1]
        signal_node(node, lambda p: p.kill())
        jobs.wait_for(lambda: node.pid not in {n.pid for n in nodes_of(proc).values()}, 120, "a new attempt")
        rc = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            jobs.kill_group(proc)
    log = jobs.log_text(tmp_path)
    assert rc == 0, log[-4000:]
    assert jobs.attempt_classes(storage, run) == ["vanished", "completed"], log[-3000:]
    assert_own_disks(tmp_path, log, "auto")
    assert jobs.final_digest(storage, run) == references.digest(TWO_NODES)
