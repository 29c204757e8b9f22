"""Each node of a multi-node attempt in the ledger: its host, start, end and exit (``attempt["nodes"]``)."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def record_nodes(ledger, launched_by: str, nodes: list[dict]) -> bool:
    """Write ``nodes`` into the attempt the supervisor launched as ``launched_by``; False if it has none."""
    from orchestrator.ledger import transact

    found: list[bool] = []

    def mutate(doc):
        found.clear()
        for attempt in reversed((doc or {}).get("attempts", [])):
            if attempt.get("launched_by") == launched_by:
                attempt["nodes"] = nodes
                found.append(True)
                return doc
        return None

    try:
        transact(ledger.store, ledger.key, mutate)
    except Exception as err:  # noqa: BLE001 - storage down: the attempt keeps its own record
        log.warning("could not record the attempt's nodes in the ledger (%s)", err)
        return False
    return bool(found)


def node_lines(attempt: dict) -> list[str]:
    """``orchestrator status``'s lines for an attempt's nodes (none for a one-node attempt)."""
    import time

    def when(value):
        return time.strftime("%H:%M:%S", time.gmtime(value)) if isinstance(value, (int, float)) else "-"

    lines = []
    for node in attempt.get("nodes") or []:
        if isinstance(node, dict):
            lines.append(f"    node {node.get('node')}: {node.get('host')} {when(node.get('started_at'))}-"
                         f"{when(node.get('ended_at'))} exit {node.get('exit')}")
    return lines
