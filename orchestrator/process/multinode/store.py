"""The attempt's rendezvous and heartbeat store: ``python -m orchestrator.process.multinode.store --host H --port P``.

A torch c10d ``TCPStore`` server in a process of its own. torchrun's c10d rendezvous on every node
joins it as a client (``is_host=false``), and the nodes' watchdogs keep their heartbeats, the world's
abort and the spot notice in it. It holds nothing that outlives the attempt: whoever starts the attempt
starts a fresh one (or reuses it with a fresh ``ORCH_RDZV_ID``) and stops it with SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from datetime import timedelta

log = logging.getLogger(__name__)


def serve(host: str, port: int, ready: threading.Event | None = None, stop: threading.Event | None = None) -> None:
    """Run the store until ``stop`` is set (or SIGTERM/SIGINT in the main thread)."""
    from torch.distributed import TCPStore

    store = TCPStore(
        host, port, is_master=True, wait_for_workers=False, multi_tenant=True, timeout=timedelta(seconds=30)
    )
    log.info("rendezvous store serving on %s:%d", host, store.port)
    stop = stop or threading.Event()
    if ready is not None:
        ready.set()
    stop.wait()
    del store


def connect(host: str, port: int, timeout_seconds: float):
    """A client of the store at ``host:port`` (each call waits at most ``timeout_seconds``)."""
    from torch.distributed import TCPStore

    return TCPStore(
        host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=max(1.0, timeout_seconds))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.process.multinode.store",
        description="the rendezvous and heartbeat store of one multi-node attempt",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(args.host, args.port, stop=stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
