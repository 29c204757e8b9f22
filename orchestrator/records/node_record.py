"""Each node of a multi-node attempt as its writers see it: one decode into types, one encode.

A multi-node attempt in the ledger carries ``rdzv_id`` (its rendezvous id) and ``nodes`` (one entry per node, which
each node's launcher writes: ``orchestrator.process.multinode.records``). The ledger is read from storage, so every
node entry is untrusted: ``NodeRecord.decode`` checks its fields (a node number or a pid that is negative or past
any machine, a time outside 1970-2100, an exit code outside [-255, 255], a host with terminal escapes shown as
``?``) and raises ``CorruptRecord`` naming the attempt's node. A node entry that does not decode degrades only
itself (its writer drops it, with a warning, and the node's own record takes its place); an attempt whose
rendezvous fields do not decode is not taken for any node's; the other nodes and attempts go on.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional, Union

from orchestrator.records.fields import CorruptRecord, Fields
from orchestrator.records.ledger_record import MAX_GPUS, MAX_PID

FIELDS = ("node", "host", "pid", "started_at", "ended_at", "exit")  # the stored keys, in their order


def each_object(f: Fields, key: str) -> list[Union[Fields, CorruptRecord]]:
    """The objects of list ``key`` one by one (absent: none), each to read field by field, or the CorruptRecord that
    names it when it is no object: one odd item degrades only itself. A ``key`` that is no list: one CorruptRecord."""
    try:
        return list(f.objects(key))
    except CorruptRecord as err:
        value = f.doc.get(key)
        if not isinstance(value, list):
            return [err]
    out: list[Union[Fields, CorruptRecord]] = []
    for n, item in enumerate(value):
        try:
            out.append(Fields(item, f"{f.where} {key}[{n}]"))
        except CorruptRecord as odd:
            out.append(odd)
    return out


@dataclass(frozen=True)
class NodeRecord:
    """One node of an attempt: its number, host, launcher's pid, start, end and exit code (None: not yet)."""

    node: int
    host: str
    pid: Optional[int]
    started_at: Optional[float]
    ended_at: Optional[float]
    exit: Optional[int]

    @classmethod
    def decode(cls, f: Fields) -> "NodeRecord":
        return cls(
            node=f.whole("node", high=MAX_GPUS),
            host=f.text("host", "-"),
            pid=f.whole("pid", high=MAX_PID, default=None),
            started_at=f.time("started_at"),
            ended_at=f.time("ended_at"),
            exit=f.whole("exit", low=-255, high=255, default=None),
        )

    def encode(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "host": self.host,
            "pid": self.pid,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit": self.exit,
        }

    def merged(self, newer: "NodeRecord", *, fill_only: bool) -> "NodeRecord":
        """This entry with ``newer``'s fields (``fill_only``: only those this one lacks, so a node's own record wins)."""
        values = {
            f.name: getattr(self, f.name) if fill_only and getattr(self, f.name) is not None else getattr(newer, f.name)
            for f in fields(self)
        }
        return NodeRecord(**values)


@dataclass(frozen=True)
class RendezvousAttempt:
    """What a node's writer reads of an attempt: its rendezvous id and start, to find the attempt it belongs to."""

    rdzv_id: Optional[str]
    started_at: Optional[float]

    @classmethod
    def decode(cls, f: Fields) -> "RendezvousAttempt":
        return cls(rdzv_id=f.text("rdzv_id", None), started_at=f.time("started_at"))

    def is_of(self, rdzv_id: str, not_before: float) -> bool:
        """Whether it is the attempt of ``rdzv_id`` begun at ``not_before`` or later."""
        return self.rdzv_id == rdzv_id and self.started_at is not None and self.started_at >= not_before
