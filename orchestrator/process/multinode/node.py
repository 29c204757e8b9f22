"""One node of a multi-node attempt: torchrun for this node's ranks, watched on the attempt's store.

``python -m orchestrator.worker`` becomes this launcher when the backend gave it a node environment
(``orchestrator.process.multinode.node_env``). It starts torchrun with a c10d rendezvous on the external store
(``is_host=false``: the store is never inside a training node's agent), a fresh rendezvous id per attempt
and no restarts of its own (``--max-restarts=0``: the world restarts as one, from the last checkpoint).
Its watchdog beats and watches the peers; when the world breaks it kills its own ranks (torchrun and
the workers, which would otherwise wait in a collective) and exits 137, which every engine reads as a
vanished attempt and requeues. It records its node's host, start, end and exit in the attempt
(``orchestrator.process.multinode.records``), on every backend.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from orchestrator.core import exitcodes
from orchestrator.process import forked_ranks
from orchestrator.process.distributed import FORWARDED_SIGNALS, name_process
from orchestrator.process.multinode import COLLECTIVE_TIMEOUT_ENV, NodeEnv
from orchestrator.process.multinode.watchdog import Watchdog

log = logging.getLogger(__name__)

LOST = exitcodes.LOST_NODE  # classified as vanished by every engine and the supervisor
# codes a rank leaves after closing its attempt itself: a peer that ends so is no loss
CLEAN = frozenset({exitcodes.COMPLETED, exitcodes.PREEMPTED, *exitcodes.final_codes()})


def torchrun_flags(cfg, node: NodeEnv, join_timeout_s: float) -> list[str]:
    conf = f"is_host=false,join_timeout={int(join_timeout_s)}"
    # no --node_rank: c10d ranks the agents by their address (ORCH_NODE_ADDR), so node 0 holds rank 0 where the
    # addresses sort as the nodes do (the local world's 127.0.0.<node+1>)
    flags = [
        f"--nnodes={node.nnodes}",
        f"--nproc_per_node={int(cfg.distributed.processes_per_node)}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={node.endpoint}",
        f"--rdzv_id={node.rdzv_id}",
        f"--rdzv_conf={conf}",
        "--max-restarts=0",
    ]
    if node.addr:
        flags.append(f"--local_addr={node.addr}")
    return flags


def interval_s(timeout_s: float) -> float:
    return min(2.0, max(0.2, timeout_s / 5))


def run_node(cfg, overrides: list[str], work_root: Path, node: NodeEnv, main: Callable[[list[str]], int]) -> int:
    """Run this node's ranks until they end or the world breaks; returns the node's exit code. ``main``: the
    worker's, which a rank forked from torchrun's agent runs (``orchestrator.process.forked_ranks``)."""
    from orchestrator.process.multinode.records import NodeRecorder
    from orchestrator.process.multinode.store import connect
    from orchestrator.process.multinode.timeouts import collective_timeout_s, heartbeat_timeout_s, job_attempts

    name_process(f"orch-node{node.rank}")
    attempts = job_attempts(cfg)
    timeout = heartbeat_timeout_s(cfg.distributed.heartbeat_timeout, attempts)
    work_root.mkdir(parents=True, exist_ok=True)
    exit_file = work_root / f"exit-{node.rdzv_id}-node{node.rank}"
    env = dict(
        os.environ,
        ORCH_ATTEMPT_TOKEN=node.rdzv_id,
        ORCH_EXIT_FILE=str(exit_file),
        **{COLLECTIVE_TIMEOUT_ENV: str(collective_timeout_s(timeout, attempts))},
    )
    watchdog = Watchdog(connect(node.host, node.port, timeout), node.rank, node.nnodes, node.rdzv_id, timeout)
    recorder = NodeRecorder.for_config(cfg, node)
    log.info(
        "node %d of %d: rendezvous %s on %s; heartbeat timeout %.1fs",
        node.rank,
        node.nnodes,
        node.rdzv_id,
        node.endpoint,
        timeout,
    )
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _f: pending.append(signum)) for s in FORWARDED_SIGNALS}
    # torchrun in its own session: a signal to this node's process group reaches the ranks through us only
    child = forked_ranks.start(
        cfg, torchrun_flags(cfg, node, join_timeout_s=max(60.0, 4 * timeout)), overrides, env, main
    )
    try:
        code = _watch(child, watchdog, pending, timeout, recorder)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if code == LOST:
        recorder.end(code)
        return code
    if exit_file.exists():
        code = int(exit_file.read_text().strip() or code)
        exit_file.unlink()
    else:
        log.error("node %d: the ranks exited (torchrun rc=%s) without reporting an exit code", node.rank, code)
        watchdog.abort(f"its ranks exited with {code} without an outcome")
        code = code or exitcodes.CRASHED
    watchdog.done(code)
    recorder.end(code)
    return code


def _watch(child: subprocess.Popen, watchdog: Watchdog, pending: list[int], timeout: float, recorder) -> int:
    """torchrun's return code, or LOST once the world broke (the ranks killed)."""
    peer_failed_at = None
    while (rc := child.poll()) is None:
        recorder.tick()
        while pending:
            signum = pending.pop(0)
            log.warning(
                "node %d got %s: passing it to its ranks and to every node", watchdog.rank, signal.Signals(signum).name
            )
            forward(child, signum)
            watchdog.announce_notice(signum)
        verdict = watchdog.tick()
        if verdict.notice is not None:
            log.warning(
                "node %d: another node got %s; passing it to this node's ranks",
                watchdog.rank,
                signal.Signals(verdict.notice).name,
            )
            forward(child, verdict.notice)
        failed = {p: c for p, c in verdict.peers_done.items() if c not in CLEAN}
        if failed and peer_failed_at is None:
            peer_failed_at = time.monotonic()
        if verdict.lost is None and peer_failed_at is not None and time.monotonic() - peer_failed_at > timeout:
            verdict.lost = f"node(s) {sorted(failed)} ended with {failed} and this node's ranks did not stop"
        if verdict.lost is not None:
            log.error(
                "node %d: %s; stopping this node's ranks (the attempt restarts the world)", watchdog.rank, verdict.lost
            )
            if not verdict.lost.startswith("another node"):
                watchdog.abort(verdict.lost)
            kill_tree(child)
            return LOST
        time.sleep(interval_s(timeout))
    return rc


def _tree(child: subprocess.Popen) -> list:
    import psutil

    try:
        root = psutil.Process(child.pid)
        return [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return []


def forward(child: subprocess.Popen, signum: int) -> None:
    """``signum`` to this node's ranks (the workers under torchrun, not torchrun, which would kill them)."""
    import psutil

    for proc in _tree(child)[:-1]:
        try:
            if "orchestrator.worker" in " ".join(proc.cmdline()):
                proc.send_signal(signum)
        except psutil.Error:
            pass


def kill_tree(child: subprocess.Popen) -> None:
    """SIGKILL torchrun and every rank under it (killing torchrun's group alone leaves workers training)."""
    import psutil

    for proc in _tree(child):
        try:
            proc.kill()
        except psutil.Error:
            pass
    try:
        child.wait(30)
    except subprocess.TimeoutExpired:
        log.error("torchrun (pid %d) did not end after SIGKILL", child.pid)
