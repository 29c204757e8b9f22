"""Each node's watchdog on the attempt's store: its own heartbeat, its peers', the world's abort and notice.

The node's launcher (``orchestrator.process.multinode.node``) calls ``tick()`` a few times per heartbeat timeout.
A tick adds one to this node's beat counter and reads every peer's; a peer whose counter has not moved
for ``timeout_s`` (by this node's own clock: no clocks are compared) is lost, and so is the store itself
when it cannot be reached for as long. A node that ends writes its exit code (``done``); one that stops
the world on purpose writes ``abort``; one that got a preemption signal writes ``notice`` (its number),
which every other node passes to its own ranks, so all of them commit one emergency checkpoint together.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

log = logging.getLogger(__name__)


@dataclass
class Verdict:
    """What one tick found: ``lost`` (why the world is broken, or None), ``notice`` (a signal number to pass on),
    ``peers_done`` (node -> exit code)."""

    lost: Optional[str] = None
    notice: Optional[int] = None
    peers_done: dict = field(default_factory=dict)


class Watchdog:
    def __init__(
        self, store, rank: int, nnodes: int, rdzv_id: str, timeout_s: float, clock: Callable[[], float] = time.monotonic
    ):
        self.store, self.rank, self.nnodes, self.timeout_s, self.clock = store, rank, nnodes, timeout_s, clock
        self.prefix = f"orch/{rdzv_id}/"
        now = clock()
        self._seen = {peer: (-1, now) for peer in range(nnodes) if peer != rank}  # peer -> (counter, when it moved)
        self._store_ok_at = now
        self._notice_passed = False

    def _key(self, name: str) -> str:
        return self.prefix + name

    def _flag(self, name: str) -> Optional[str]:
        key = self._key(name)
        return self.store.get(key).decode() if self.store.check([key]) else None

    def tick(self) -> Verdict:
        now = self.clock()
        try:
            verdict = self._read(now)
        except Exception as err:  # noqa: BLE001 - the store is part of the world: unreachable for long is lost
            if now - self._store_ok_at > self.timeout_s:
                return Verdict(lost=f"the rendezvous store has not answered for {now - self._store_ok_at:.0f}s ({err})")
            return Verdict()
        self._store_ok_at = now
        return verdict

    def _read(self, now: float) -> Verdict:
        self.store.add(self._key(f"hb/{self.rank}"), 1)
        verdict = Verdict()
        abort = self._flag("abort")
        if abort is not None:
            verdict.lost = f"another node stopped the world: {abort}"
        for peer, (count, moved) in self._seen.items():
            done = self._flag(f"done/{peer}")
            if done is not None:
                verdict.peers_done[peer] = int(done)
                continue
            current = self.store.add(self._key(f"hb/{peer}"), 0)
            if current != count:
                self._seen[peer] = (current, now)
            elif now - moved > self.timeout_s and verdict.lost is None:
                verdict.lost = (
                    f"node {peer} sent no heartbeat for {now - moved:.1f}s "
                    f"(distributed.heartbeat_timeout={self.timeout_s:g}s)"
                )
        notice = self._flag("notice")
        if notice is not None and not self._notice_passed:
            self._notice_passed = True
            verdict.notice = int(notice)
        return verdict

    def announce_notice(self, signum: int) -> None:
        """This node got a preemption signal: every node passes it to its ranks (once)."""
        self._notice_passed = True
        self._try(lambda: self.store.set(self._key("notice"), str(int(signum))))

    def abort(self, why: str) -> None:
        self._try(lambda: self.store.set(self._key("abort"), f"node {self.rank}: {why}"))

    def done(self, code: int) -> None:
        self._try(lambda: self.store.set(self._key(f"done/{self.rank}"), str(int(code))))

    def _try(self, write: Callable[[], None]) -> None:
        try:
            write()
        except Exception as err:  # noqa: BLE001 - the store is gone: the peers find out by their own timeouts
            log.warning("could not write to the rendezvous store (%s)", err)
