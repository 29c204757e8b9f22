"""The local backend's multi-node attempt: the store and N node processes on this host, one outcome.

Each node is ``python -m orchestrator.worker <overrides>`` in a process group of its own (as a machine
of its own would be) with the node environment of the contract (``orchestrator.process.multinode``) and its own
loopback address (127.0.0.<node+1>), and the store is a process of its own. ``LocalWorld`` looks like a
child process to the supervisor (``poll``, ``wait``, ``send_signal``): its return code is the world's.
Once any node has ended, the others get the heartbeat timeout and a margin to stop (their watchdogs see
the loss); a node still there after that (a frozen one) is killed.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, cast

from orchestrator.process.distributed import die_with_parent
from orchestrator.process.multinode import NodeEnv

log = logging.getLogger(__name__)

STOP_MARGIN_S = 30.0
BROKEN_GRACE_S = 5.0  # a node lost (killed, or it found the world broken): the rest have nothing to save


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_listening(host: str, port: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the rendezvous store exited with {proc.returncode} before it listened")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the rendezvous store did not listen on {host}:{port} within {timeout_s:.0f}s")


@dataclass
class NodeProcess:
    rank: int
    host: str
    proc: Any  # subprocess.Popen, or warm_start.ForkedAttempt
    started_at: float = field(default_factory=time.time)
    ended_at: Optional[float] = None

    def record(self) -> dict:
        """What the ledger keeps of this node in its attempt."""
        return {
            "node": self.rank,
            "host": self.host,
            "pid": self.proc.pid,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit": self.proc.returncode,
        }


class LocalWorld:
    """One attempt's store and nodes on this host."""

    def __init__(
        self,
        command: Sequence[str],
        env: dict,
        nnodes: int,
        stop_after_s: float,
        start: Optional[Callable[[list[str], dict], Any]] = None,
    ):
        """``start(command, env)``: how each process of the world starts (forked from the supervisor,
        ``warm_start.start``), each in a session of its own that ends with the supervisor; else a fresh
        interpreter."""
        self.stop_after_s = stop_after_s
        start = start or _fresh
        host = "127.0.0.1"
        port = free_port(host)
        self.rdzv_id = f"attempt-{uuid.uuid4().hex[:12]}"
        self.store = start(
            [sys.executable, "-m", "orchestrator.process.multinode.store", "--host", host, "--port", str(port)], env
        )
        wait_listening(host, port, self.store)
        self.nodes: list[NodeProcess] = []
        for rank in range(nnodes):
            node = NodeEnv(
                rank=rank, nnodes=nnodes, host=host, port=port, rdzv_id=self.rdzv_id, addr=f"127.0.0.{rank + 1}"
            )
            proc = start(list(command), dict(env, **node.as_env()))
            self.nodes.append(NodeProcess(rank, cast(str, node.addr), proc))
        self.pid = self.nodes[0].proc.pid
        self.returncode: Optional[int] = None

    def send_signal(self, signum: int) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signum)

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self) -> int:
        first_end = None
        while True:
            for node in self.nodes:
                if node.ended_at is None and node.proc.poll() is not None:
                    node.ended_at = time.time()
                    log.info("node %d exited with %s", node.rank, node.proc.returncode)
            running = [n for n in self.nodes if n.ended_at is None]
            if not running:
                break
            ended = [n.proc.returncode for n in self.nodes if n.ended_at is not None]
            if first_end is None and ended:
                first_end = time.monotonic()
            broken = world_code(ended) == 128 + signal.SIGKILL if ended else False
            limit = BROKEN_GRACE_S if broken else self.stop_after_s
            if first_end is not None and time.monotonic() - first_end > limit:
                for node in running:
                    log.error("node %d did not stop %.0fs after another node ended: killing it", node.rank, limit)
                    _kill_group(node.proc)
            time.sleep(0.2)
        _stop(self.store)
        self.returncode = world_code([n.proc.returncode for n in self.nodes])
        return self.returncode

    def node_records(self) -> list[dict]:
        return [n.record() for n in self.nodes]


def _fresh(command: list[str], env: dict) -> subprocess.Popen:
    # in a session of its own, as a machine of its own; a supervisor killed takes its world along
    return subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=die_with_parent)


def world_code(codes: Sequence[int]) -> int:
    """One outcome for the world: a node killed (by a signal, or lost: 137/143) makes it vanished, else node 0's."""
    from orchestrator.core.exitcodes import ExitClass, classify_exit

    if any(classify_exit(code) == ExitClass.VANISHED for code in codes):
        return 128 + signal.SIGKILL
    return codes[0]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
