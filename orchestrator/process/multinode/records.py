"""Each node of a multi-node attempt in the ledger: its host, start, end and exit (``attempt["nodes"]``).

One code path on every backend: each node's launcher (``orchestrator.process.multinode.node``, which Slurm's ``srun``,
SkyPilot's nodes, the Kubernetes JobSet's pods and the local world all run) records its own node with
``NodeRecorder``: its start once rank 0 has begun the attempt, its end and exit code when its ranks are done.
The attempt is the one rank 0 began with the same rendezvous id (``ORCH_RDZV_ID``, kept as the attempt's
``rdzv_id``) and no earlier than this node started (SkyPilot reuses its task id across recoveries). A node
killed outright cannot record its end: the local supervisor fills it in from the process it started
(``fill_only``), and on the other backends the next attempt's begin marks it ended at the attempt's last
heartbeat, its exit unknown (``ledger._mark_vanished``).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Mapping, Optional

from orchestrator.process.multinode import NODE_HOST_ENV, NodeEnv
from orchestrator.storage.base import finite_number

log = logging.getLogger(__name__)

# how much earlier than this node's start rank 0 may have begun the attempt by another host's clock
CLOCK_SKEW_S = 60.0
START_RETRY_S = 1.0  # until rank 0 has begun the attempt, the start is retried this often (one ledger read)
FIELDS = ("node", "host", "pid", "started_at", "ended_at", "exit")


def node_host(node: NodeEnv, environ: Mapping[str, str] = os.environ) -> str:
    """The name the ledger keeps for this node: the backend's (``ORCH_NODE_HOST``: Slurm's node name, the
    Kubernetes node), else the address its agent advertises (``ORCH_NODE_ADDR``), else the hostname."""
    return environ.get(NODE_HOST_ENV) or node.addr or socket.gethostname()


def _attempt_of(doc: Optional[dict], rdzv_id: str, not_before: float) -> Optional[dict]:
    """The newest attempt begun for ``rdzv_id`` at ``not_before`` or later (the ledger is untrusted: skip the odd)."""
    attempts = (doc or {}).get("attempts") if isinstance(doc, dict) else None
    for attempt in reversed(attempts if isinstance(attempts, list) else []):
        if (isinstance(attempt, dict) and attempt.get("rdzv_id") == rdzv_id and finite_number(attempt.get("started_at"))
                and attempt["started_at"] >= not_before):
            return attempt
    return None


def _merge(attempt: dict, record: dict, fill_only: bool) -> None:
    nodes = [n for n in attempt.get("nodes") or [] if isinstance(n, dict) and isinstance(n.get("node"), int)]
    mine = next((n for n in nodes if n["node"] == record["node"]), None)
    if mine is None:
        nodes.append({k: record.get(k) for k in FIELDS})
    else:
        mine.update({k: record.get(k) for k in FIELDS if not fill_only or mine.get(k) is None})
    attempt["nodes"] = sorted(nodes, key=lambda n: n["node"])


def record_nodes(ledger, rdzv_id: str, records: list[dict], *, fill_only: bool = False) -> bool:
    """Write ``records`` (one per node) into the attempt of ``rdzv_id``; with ``fill_only`` only what is missing
    there (a node's own record wins). False when no such attempt exists (yet) or storage is down."""
    from orchestrator.records.ledger import decode_ledger
    from orchestrator.storage.transact import transact

    found: list[bool] = []
    not_before = min(r["started_at"] for r in records) - CLOCK_SKEW_S

    def mutate(doc):
        found.clear()
        attempt = _attempt_of(doc, rdzv_id, not_before)
        if attempt is None:
            return None
        for record in records:
            _merge(attempt, record, fill_only)
        found.append(True)
        return doc

    try:
        transact(ledger.store, ledger.key, mutate, decode=decode_ledger)
    except Exception as err:  # noqa: BLE001 - storage down: training goes on, the record is best effort
        log.warning("could not record the attempt's nodes in the ledger (%s)", err)
        return False
    return bool(found)


class NodeRecorder:
    """This node's entry in its attempt: the start written in the background (never stalling the heartbeats),
    retried until rank 0 has begun the attempt; the end written when the node's ranks are done."""

    def __init__(self, ledger, node: NodeEnv, environ: Mapping[str, str] = os.environ):
        self.ledger, self.rdzv_id = ledger, node.rdzv_id
        self.record = {"node": node.rank, "host": node_host(node, environ), "pid": os.getpid(),
                       "started_at": time.time(), "ended_at": None, "exit": None}
        self.started = False
        self._thread: Optional[threading.Thread] = None
        self._next_try = 0.0

    @classmethod
    def for_config(cls, cfg, node: NodeEnv) -> "NodeRecorder":
        from orchestrator.records.ledger import Ledger
        from orchestrator.storage import store_from_config

        return cls(Ledger(store_from_config(cfg.storage), cfg.run.name), node)

    def tick(self) -> None:
        """From the node's watch loop: start a try at the start record when one is due."""
        if self.started or (self._thread is not None and self._thread.is_alive()) or time.monotonic() < self._next_try:
            return
        self._next_try = time.monotonic() + START_RETRY_S
        self._thread = threading.Thread(target=self._write_start, name="node-record", daemon=True)
        self._thread.start()

    def _write_start(self) -> None:
        self.started = record_nodes(self.ledger, self.rdzv_id, [dict(self.record)])

    def end(self, code: int) -> bool:
        """Record this node's end and exit code (and its start, if that never got in)."""
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.record.update(ended_at=time.time(), exit=int(code))
        written = record_nodes(self.ledger, self.rdzv_id, [dict(self.record)])
        if not written:
            log.warning("node %d: no attempt for rendezvous %s in the ledger to record this node in (rank 0 never "
                        "began one)", self.record["node"], self.rdzv_id)
        return written
