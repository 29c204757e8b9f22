"""Units of the multi-node runtime: the node environment, the watchdog on a real TCPStore, the world's one
outcome, the launch checks, the topology in the trajectory fingerprint, the ledger's nodes in status."""
from __future__ import annotations

import signal
import threading

import pytest

from orchestrator.app.compose import compose_config
from orchestrator.core.errors import ConfigError
from orchestrator.process.multinode import NodeEnv, node_env
from orchestrator.process.multinode.watchdog import Watchdog
from orchestrator.process.multinode.world import free_port, world_code

TWO = ["distributed=ddp", "distributed.processes_per_node=1", "distributed.nodes=2", "compute.nodes=2"]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def store_port():
    from orchestrator.process.multinode.store import serve

    port, ready, stop = free_port(), threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=("127.0.0.1", port, ready, stop), daemon=True)
    thread.start()
    assert ready.wait(30)
    yield port
    stop.set()
    thread.join(10)


def watchdogs(port, clock, timeout=5.0):
    from orchestrator.process.multinode.store import connect

    return [Watchdog(connect("127.0.0.1", port, 5), rank, 2, "rdzv-1", timeout, clock=clock) for rank in (0, 1)]


def test_a_silent_peer_is_lost_after_the_timeout_and_not_before(store_port):
    clock = Clock()
    zero, one = watchdogs(store_port, clock)
    for t in (1.0, 2.0, 3.0):
        clock.now = t
        assert one.tick().lost is None and zero.tick().lost is None
    for t in (6.0, 8.0):  # node 1 frozen from t=3: node 0 keeps beating
        clock.now = t
        assert zero.tick().lost is None
    clock.now = 8.5
    lost = zero.tick().lost
    assert lost is not None and "node 1 sent no heartbeat for 5.5s" in lost


def test_a_notice_reaches_every_other_node_once_and_a_done_peer_is_no_loss(store_port):
    clock = Clock()
    zero, one = watchdogs(store_port, clock)
    one.announce_notice(signal.SIGTERM)
    assert zero.tick().notice == signal.SIGTERM
    assert zero.tick().notice is None
    one.done(0)
    clock.now = 60.0
    verdict = zero.tick()
    assert verdict.lost is None and verdict.peers_done == {1: 0}


def test_an_abort_stops_every_node(store_port):
    zero, one = watchdogs(store_port, Clock())
    one.abort("its ranks exited with 1 without an outcome")
    assert "node 1: its ranks exited with 1" in zero.tick().lost


def test_an_unreachable_store_is_a_lost_world_after_the_timeout():
    clock = Clock()

    class Gone:
        def add(self, *_):
            raise RuntimeError("connection reset")

    dog = Watchdog(Gone(), 0, 2, "r", 5.0, clock=clock)
    clock.now = 1.0
    assert dog.tick().lost is None
    clock.now = 6.0
    assert "store has not answered" in dog.tick().lost


def test_the_world_has_one_outcome():
    assert world_code([0, 0]) == 0
    assert world_code([75, 75]) == 75
    assert world_code([137, -9]) == 137  # a node lost: vanished, requeued
    assert world_code([0, -signal.SIGKILL]) == 137
    assert world_code([4, 4]) == 4


def test_the_node_environment_is_read_and_checked():
    cfg = compose_config(TWO + ["run.name=mn"], launch_checks=False)
    env = NodeEnv(rank=1, nnodes=2, host="10.0.0.5", port=29400, rdzv_id="a1").as_env()
    assert node_env(cfg, env) == NodeEnv(rank=1, nnodes=2, host="10.0.0.5", port=29400, rdzv_id="a1")
    with pytest.raises(ConfigError, match="ORCH_NODE_RANK, ORCH_NNODES, ORCH_STORE, ORCH_RDZV_ID"):
        node_env(cfg, {})
    with pytest.raises(ConfigError, match="do not fit distributed.nodes=2"):
        node_env(cfg, dict(env, ORCH_NODE_RANK="2"))
    assert node_env(compose_config(["run.name=one"], launch_checks=False), env) is None


@pytest.mark.parametrize("extra, needle", [
    (["distributed.nodes=2", "distributed=ddp"], "compute.nodes=2"),
    (["distributed.nodes=2", "compute.nodes=2"], "distributed=none trains on one process"),
    (TWO + ["distributed.heartbeat_timeout=0s"], "distributed.heartbeat_timeout='0s' must be positive"),
    (TWO + ["distributed.heartbeat_timeout=soon"], "is not a duration"),
])
def test_a_bad_multi_node_config_is_refused_at_launch(extra, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        compose_config(extra + ["run.name=mn"])


def test_auto_heartbeat_timeout_follows_the_measured_steps_and_saves():
    from orchestrator.process.multinode.timeouts import DEFAULT_S, FLOOR_S, collective_timeout_s, heartbeat_timeout_s

    assert heartbeat_timeout_s("auto") == DEFAULT_S
    assert heartbeat_timeout_s("45s") == 45.0
    slow = [{"fence": 1, "exit_class": "vanished", "started_at": 0.0, "ended_at": 110.0, "step_start": 0,
             "step_end": 11, "extra": {"restart": {"total_s": 10.0},
                                       "checkpoint_interval": {"cost_source": "measured", "checkpoint_cost_s": 6.0}}}]
    assert heartbeat_timeout_s("auto", slow) == pytest.approx(3 * 10.0 + 6.0)
    fast = [dict(slow[0], ended_at=11.0, extra={"restart": {"total_s": 1.0}})]
    assert heartbeat_timeout_s("auto", fast) == FLOOR_S
    assert collective_timeout_s(30.0) == 120.0 and collective_timeout_s(60.0) == 240.0


def test_a_ledger_with_an_impossible_restart_figure_leaves_the_timeouts_at_their_defaults():
    """A multi-node ledger whose restart figure is 1e300 s (storage is untrusted) crashed every rank: twice it is
    a collective timeout no ``timedelta`` can hold. A restart longer than a week did not happen: it reads as not
    measured, and the world gets the timeouts a job with no history gets."""
    from datetime import timedelta

    from orchestrator.process.multinode.timeouts import COLLECTIVE_FLOOR_S, DEFAULT_S, collective_timeout_s, heartbeat_timeout_s

    forged = [{"fence": 1, "exit_class": "vanished", "started_at": 0.0, "ended_at": 1e300, "step_start": 0,
               "step_end": 11, "extra": {"restart": {"total_s": 1e300},
                                         "checkpoint_interval": {"cost_source": "measured", "checkpoint_cost_s": 1e300}}}]
    heartbeat = heartbeat_timeout_s("auto", forged)
    collective = collective_timeout_s(heartbeat, forged)
    assert heartbeat == DEFAULT_S and collective == max(COLLECTIVE_FLOOR_S, 4 * DEFAULT_S)
    assert timedelta(seconds=collective)  # what each rank's process group is given


def test_another_topology_of_the_same_world_size_is_refused_with_the_fix():
    from orchestrator.checkpoint.fingerprint import check_resumable, trajectory_config

    two_by_one = compose_config(TWO + ["run.name=mn"], launch_checks=False)
    one_by_two = compose_config(["distributed=ddp", "distributed.processes_per_node=2", "run.name=mn"],
                                launch_checks=False)
    manifest = {"step": 10, "fence": 1, "meta": {"trajectory": trajectory_config(two_by_one)}}
    check_resumable(manifest, trajectory_config(two_by_one), "", two_by_one)
    with pytest.raises(ConfigError, match=r"written by 2 node\(s\) x 1 process\(es\); this attempt has 1 x 2"):
        check_resumable(manifest, trajectory_config(one_by_two), "", one_by_two)


def test_a_manifest_from_before_the_topology_was_kept_still_resumes_on_one_node():
    from orchestrator.checkpoint.fingerprint import check_resumable, trajectory_config

    cfg = compose_config(["distributed=ddp", "distributed.processes_per_node=2", "run.name=mn"], launch_checks=False)
    old = {k: v for k, v in trajectory_config(cfg).items() if k not in ("distributed.nodes",
                                                                         "distributed.processes_per_node")}
    check_resumable({"step": 1, "fence": 1, "meta": {"trajectory": old}}, trajectory_config(cfg), "", cfg)


def test_status_shows_each_node_of_an_attempt():
    from orchestrator.cli.status import format_ledger
    from orchestrator.records.ledger_record import CorruptRecord, LedgerRecord

    ledger = {"run_name": "mn", "attempts": [{"fence": 1, "host": "h", "exit_class": "vanished", "started_at": 100.0,
                                              "nodes": [{"node": 0, "host": "10.0.0.1", "started_at": 100.0,
                                                         "ended_at": 160.0, "exit": 137},
                                                        {"node": 1, "host": "10.0.0.2\x1b[2J", "started_at": None,
                                                         "ended_at": None, "exit": -9}]}]}
    text = format_ledger(LedgerRecord.decode(ledger, "mn/ledger.json"), now=200.0)
    assert "nodes" in text and "10.0.0.1" in text and "10.0.0.2?[2J" in text and "137" in text and "-9" in text
    assert "\x1b" not in text  # a host from storage reaches the terminal without its escapes
    # a node time that is no number is a corrupt ledger, named, not a time shown as "-"
    ledger["attempts"][0]["nodes"][1]["started_at"] = "x"
    with pytest.raises(CorruptRecord, match=r"mn/ledger.json attempts\[0\] nodes\[1\] is corrupt: 'started_at' is 'x'"):
        LedgerRecord.decode(ledger, "mn/ledger.json")


def test_a_collective_error_from_a_lost_node_is_vanished_not_a_crash(monkeypatch):
    """A rank whose peer died sees gloo's transport error: in a multi-node world that is the node's loss
    (requeued, not counted as a crash, nothing recorded by this rank); on one node it stays a crash."""
    import torch.distributed  # noqa: F401 - the error family the classifier looks for

    from orchestrator.attempt.failure import classify_exception
    from orchestrator.core.exitcodes import ExitClass

    err = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                       "[127.0.0.1]:61118: Connection reset by peer.")
    monkeypatch.setenv("ORCH_NNODES", "2")
    lost = classify_exception(err)
    assert (lost.exit_class, lost.exit_code, lost.record) == (ExitClass.VANISHED, 137, False)
    monkeypatch.setenv("ORCH_NNODES", "1")
    assert classify_exception(err).exit_class == ExitClass.CRASHED


def _begin(ledger, rdzv_id, monkeypatch):
    monkeypatch.setenv("ORCH_RDZV_ID", rdzv_id)  # rank 0 runs under its node's launcher, with the world's id
    attempt = ledger.begin_attempt(host="h", pid=1, instance_type=None, gpu_type=None, gpus=2, spot=True,
                                   checkpoint_step=0)
    monkeypatch.delenv("ORCH_RDZV_ID")
    return attempt


def test_each_nodes_launcher_records_its_node_in_the_attempt_of_its_rendezvous(store, monkeypatch):
    """What every backend's nodes run: each launcher writes its own host and start once rank 0 has begun the
    attempt, then its end and exit; an older attempt with the same id (SkyPilot keeps its task id across
    recoveries) begun before the node started is not taken for it, and status shows each node."""
    import time

    from orchestrator.cli.status import format_ledger
    from orchestrator.records.ledger_record import LedgerRecord
    from orchestrator.records.ledger import Ledger
    from orchestrator.process.multinode.records import CLOCK_SKEW_S, NodeRecorder

    ledger = Ledger(store, "mn")
    old = _begin(ledger, "task-7", monkeypatch)
    node_time = time.time() + CLOCK_SKEW_S + 5  # the nodes of the recovery start later than the old attempt
    monkeypatch.setattr(time, "time", lambda: node_time)
    recorders = [NodeRecorder(ledger, NodeEnv(rank=r, nnodes=2, host="s", port=1, rdzv_id="task-7"),
                              {"ORCH_NODE_HOST": f"n{r + 1}"}) for r in (1, 0)]
    for recorder in recorders:
        recorder.tick()
        recorder._thread.join()
    assert not any(r.started for r in recorders)  # the old attempt is not theirs; rank 0 has not begun yet
    monkeypatch.setattr(time, "time", lambda: node_time + 1)
    _begin(ledger, "task-7", monkeypatch)
    for recorder in recorders:
        recorder._next_try = 0.0
        recorder.tick()
        recorder._thread.join()
    assert all(r.started for r in recorders)
    running = ledger.load()["attempts"][-1]
    assert [(n["node"], n["host"], n["ended_at"]) for n in running["nodes"]] == [(0, "n1", None), (1, "n2", None)]
    monkeypatch.setattr(time, "time", lambda: node_time + 60)
    assert recorders[0].end(137) and recorders[1].end(75)
    first, second = ledger.load()["attempts"]
    assert "nodes" not in first and first["fence"] == old["fence"]
    assert [(n["node"], n["exit"], n["ended_at"]) for n in second["nodes"]] == [(0, 75, node_time + 60),
                                                                                 (1, 137, node_time + 60)]
    text = format_ledger(LedgerRecord.decode(ledger.load(), ledger.uri), now=node_time + 100)
    assert "n1" in text and "n2" in text and "137" in text


def test_a_node_that_never_recorded_its_end_is_ended_with_its_attempt(store, monkeypatch):
    """A node killed outright (its launcher too) cannot write its end: the local supervisor fills it in from the
    process it started without overwriting what a node wrote itself, and elsewhere the next attempt's begin ends
    it at the attempt's last heartbeat, its exit unknown."""
    from orchestrator.records.ledger import Ledger
    from orchestrator.process.multinode.records import NodeRecorder, record_nodes

    ledger = Ledger(store, "mn2")
    attempt = _begin(ledger, "job-1-0", monkeypatch)
    survivor, lost = (NodeRecorder(ledger, NodeEnv(rank=r, nnodes=2, host="s", port=1, rdzv_id="job-1-0"), {})
                      for r in (0, 1))
    lost._write_start()
    assert lost.started and survivor.end(137)
    seen = [{"node": r, "host": "127.0.0.9", "pid": 9, "started_at": attempt["started_at"], "ended_at": 999.0,
             "exit": -9 if r else 137} for r in (0, 1)]
    assert record_nodes(ledger, "job-1-0", seen, fill_only=True)
    nodes = ledger.load()["attempts"][0]["nodes"]
    assert [(n["exit"], n["ended_at"] == 999.0, n["host"] == "127.0.0.9") for n in nodes] == [
        (137, False, False), (-9, True, False)]  # the nodes' own records kept; the lost one's end filled

    other = Ledger(store, "mn3")
    first = _begin(other, "job-2-0", monkeypatch)
    NodeRecorder(other, NodeEnv(rank=1, nnodes=2, host="s", port=1, rdzv_id="job-2-0"), {})._write_start()
    _begin(other, "job-2-1", monkeypatch)  # the requeued job's attempt: the first one vanished
    vanished = other.load()["attempts"][0]
    assert vanished["exit_class"] == "vanished" and vanished["nodes"][0]["ended_at"] == first["last_seen"]
    assert vanished["nodes"][0]["exit"] is None


def _sees_rank0s_folder(rank: int, port: int, cases: list, out) -> None:
    """One rank of a real two-process gloo world: for each case (shared, folders), does every rank see rank 0's
    folder (``folders[rank]`` is the path as this rank's disk has it: the same folder on a shared disk, another one
    on a disk of its own)?"""
    import os
    from datetime import timedelta
    from pathlib import Path

    import torch.distributed as dist

    from orchestrator.attempt.checkpoints import every_rank_sees, shared_snapshot_root

    os.environ.update(RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        for shared, folders in cases:
            seen = every_rank_sees(Path(folders[rank]), main=rank == 0)
            # the snapshot root in memory (rank 0's chosen path, on this rank's own disk), the work folder shared
            root = shared_snapshot_root(Path(folders[rank]) / "shm", Path(folders[0]), main=rank == 0)
            out.put((shared, rank, seen, root == Path(folders[rank]) / "shm"))
    finally:
        dist.destroy_process_group()


def test_every_rank_is_asked_whether_it_sees_rank_zeros_folder(tmp_path):
    """Nodes with disks of their own (rank 1 does not find rank 0's nonce) get False on every rank, so each node
    uploads and restores its own checkpoint files (orchestrator.checkpoint.pernode) instead of rank 0 committing
    checkpoints without the other nodes' files, and a snapshot root in one node's memory gives way to the work
    folder. One two-process world asks both: a shared disk, then disks of their own."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    cases = [(shared, [str(tmp_path / f"{shared}-work"), str(tmp_path / f"{shared}-{'work' if shared else 'node1'}")])
             for shared in (True, False)]
    port = free_port()
    procs = [ctx.Process(target=_sees_rank0s_folder, args=(r, port, cases, out)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0, 0]
    # not shared: snapshots go to the work folder (which is), and rank 0's unused root in memory is removed
    assert sorted(out.get(timeout=5) for _ in range(4)) == [(False, 0, False, False), (False, 1, False, False),
                                                          (True, 0, True, True), (True, 1, True, True)]
    for shared in (True, False):
        assert (tmp_path / f"{shared}-work" / "shm").exists() is shared
