"""Read-modify-write of one JSON object in storage with conditional writes: the ledger, the spend index
and the sweep's state are all written this way, so two writers never lose each other's update."""

from __future__ import annotations

import json
import random
import time
from typing import Callable, Optional

from orchestrator.storage.base import ObjectStore, PreconditionFailed, TransientStorageError

# Conditional writes that lose a race are retried; contention between the few
# writers of one job clears in well under this many rounds.
MAX_WRITE_ATTEMPTS = 50
RETRY_BASE_SECONDS = 0.02
RETRY_MAX_SECONDS = 1.0


def transact(
    store: ObjectStore,
    key: str,
    mutate: Callable[[dict | None], dict | None],
    *,
    decode: Callable[[bytes], dict] = json.loads,
) -> dict:
    """Read the JSON at ``key``, apply ``mutate``, conditionally write; retry when another writer won.

    ``mutate`` gets a fresh copy (None when absent) each round and returns
    the document to write, or None to write nothing. Exceptions it raises
    (and ``decode``'s, which parses and checks what was read) propagate with nothing written.
    """
    for round_ in range(MAX_WRITE_ATTEMPTS):
        try:
            raw, version = store.get_versioned(key)
            doc: dict | None = decode(raw)
        except FileNotFoundError:
            doc, version = None, None
        result = mutate(doc)
        if result is None:
            return doc or {}
        data = json.dumps(result, indent=2, sort_keys=False).encode()
        try:
            store.put_if(key, data, if_version=version)
            return result
        except PreconditionFailed:
            # Jittered backoff so racing writers do not collide again in lockstep.
            delay = min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2**round_)
            time.sleep(random.uniform(0, delay))
    raise TransientStorageError(
        f"could not update {store.get_uri(key)}: {MAX_WRITE_ATTEMPTS} conditional writes in a row lost to other writers"
    )


def record_once(run: Callable, opened: Callable[[Optional[dict]], dict], name: str, now: Callable[[], float]) -> bool:
    """Mark ``name`` in the stored document's ``alerts`` (``run(mutate)``: one conditional write loop; ``opened``:
    the document as read, checked or created). True only for the caller whose write marked it first."""
    first: list[bool] = []

    def mutate(doc: Optional[dict]) -> Optional[dict]:
        doc = opened(doc)
        first.clear()
        if name in doc["alerts"]:
            return None
        doc["alerts"][name] = now()
        first.append(True)
        return doc

    run(mutate)
    return bool(first)
