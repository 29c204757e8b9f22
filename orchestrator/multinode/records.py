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

