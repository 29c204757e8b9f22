"""Each node of a multi-node attempt in the ledger: its host, start, end and exit (``attempt["nodes"]``).

One code path on every backend: each node's launcher (``orchestrator.process.multinode.node``, which Slurm's ``srun``,
SkyPilot's nodes, the Kubernetes JobSet's pods and the local world all run) records its own node with
``NodeRecorder``: its start once rank 0 has begun the attempt, its end and exit code when its ranks are done.
The attempt is the one rank 0 began with the same rendezvous id (``ORCH_RDZV_ID``, kept as the attempt's
``rdzv_id``) and no earlier than this node started (SkyPilot reuses its task id across recoveries). A node
killed outright cannot record its end: the local supervisor fills it in from the process it started
(``fill_only``), and on the other backends the next attempt's begin marks it ended at the attempt's last
heartbeat, its exit unknown (``ledger._mark_vanished``).

The ledger is untrusted: each attempt's rendezvous fields and each node entry decode into
``orchestrator.records.node_record``'s types. An attempt that does not decode is not taken for this node's; a node
entry that does not decode is dropped with a warning naming it (this node's record takes its place), and the other
nodes are kept.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import replace
from typing import Any, Mapping, Optional, Union, cast

from orchestrator.process.multinode import NODE_HOST_ENV, NodeEnv
from orchestrator.records.fields import CorruptRecord, Fields
from orchestrator.records.node_record import FIELDS, NodeRecord, RendezvousAttempt, each_object

log = logging.getLogger(__name__)

# how much earlier than this node's start rank 0 may have begun the attempt by another host's clock
CLOCK_SKEW_S = 60.0
START_RETRY_S = 1.0  # until rank 0 has begun the attempt, the start is retried this often (one ledger read)
__all__ = ["FIELDS", "NodeRecorder", "node_host", "record_nodes"]


def node_host(node: NodeEnv, environ: Mapping[str, str] = os.environ) -> str:
    """The name the ledger keeps for this node: the backend's (``ORCH_NODE_HOST``: Slurm's node name, the
    Kubernetes node), else the address its agent advertises (``ORCH_NODE_ADDR``), else the hostname."""
    return environ.get(NODE_HOST_ENV) or node.addr or socket.gethostname()


def _attempt_of(doc: Any, rdzv_id: str, not_before: float, where: str) -> Optional[Fields]:
    """The newest attempt begun for ``rdzv_id`` at ``not_before`` or later (its ``doc`` is the ledger's own object);
    the ledger is untrusted: an attempt whose rendezvous fields do not decode is skipped."""
    if not isinstance(doc, dict):
        return None
    for entry in reversed(each_object(Fields(doc, where), "attempts")):
        try:
            if isinstance(entry, Fields) and RendezvousAttempt.decode(entry).is_of(rdzv_id, not_before):
                return entry
        except CorruptRecord:
            continue
    return None


def _nodes(attempt: Fields) -> list[NodeRecord]:
    """The attempt's node entries, decoded; one that does not decode is dropped, saying which and why."""
    out = []
    for entry in each_object(attempt, "nodes"):
        try:
            if isinstance(entry, CorruptRecord):
                raise entry
            out.append(NodeRecord.decode(entry))
        except CorruptRecord as err:
            log.warning("%s: %s; dropped, the node's own record takes its place", err.where, err.problem)
    return out


def _merge(nodes: list[NodeRecord], record: NodeRecord, fill_only: bool) -> list[NodeRecord]:
    mine = next((n for n in nodes if n.node == record.node), None)
    if mine is None:
        return sorted([*nodes, record], key=lambda n: n.node)
    return [n.merged(record, fill_only=fill_only) if n is mine else n for n in nodes]


def _decoded(record: Union[NodeRecord, Mapping[str, Any]]) -> NodeRecord:
    return record if isinstance(record, NodeRecord) else NodeRecord.decode(Fields(record, "a node's record"))


def record_nodes(ledger, rdzv_id: str, records: list, *, fill_only: bool = False) -> bool:
    """Write ``records`` (one per node: ``NodeRecord``, or its stored shape) into the attempt of ``rdzv_id``; with
    ``fill_only`` only what is missing there (a node's own record wins). False when no such attempt exists (yet)
    or storage is down."""
    from orchestrator.records.ledger import decode_ledger
    from orchestrator.storage.transact import transact

    found: list[bool] = []
    mine = [_decoded(r) for r in records]
    not_before = min((r.started_at or 0.0) for r in mine) - CLOCK_SKEW_S

    def mutate(doc):
        found.clear()
        attempt = _attempt_of(doc, rdzv_id, not_before, ledger.uri)
        if attempt is None:
            return None
        nodes = sorted(_nodes(attempt), key=lambda n: n.node)
        for record in mine:
            nodes = _merge(nodes, record, fill_only)
        cast(dict, attempt.doc).update(nodes=[n.encode() for n in nodes])  # the ledger's own attempt, in place
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
        self.record = NodeRecord(
            node=node.rank,
            host=node_host(node, environ),
            pid=os.getpid(),
            started_at=time.time(),
            ended_at=None,
            exit=None,
        )
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
        self.started = record_nodes(self.ledger, self.rdzv_id, [self.record])

    def end(self, code: int) -> bool:
        """Record this node's end and exit code (and its start, if that never got in)."""
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.record = replace(self.record, ended_at=time.time(), exit=int(code))
        written = record_nodes(self.ledger, self.rdzv_id, [self.record])
        if not written:
            log.warning(
                "node %d: no attempt for rendezvous %s in the ledger to record this node in (rank 0 never began one)",
                self.record.node,
                self.rdzv_id,
            )
        return written
