"""Riding out a storage outage: every call retried with backoff while the store reports a transient error.

A job's store (``store_from_config``) is wrapped in ``RetryingStore``: a connection refused, a
timeout or a 5xx (``TransientStorageError``, which the backends raise for them) is retried with
jittered exponential backoff for up to ``storage.retry_for`` per call, so a
short outage during a heartbeat, a reservation extension or a checkpoint upload only pauses the
attempt. When one call has failed for the whole window the store is taken to be down: that call
raises ``StorageUnavailable``, and every later call is tried once (no waiting) until one succeeds,
so the attempt ends quickly as a preemption-like outcome (``orchestrator.attempt.failure.classify_exception``: exit 75,
requeued without counting toward the crash-loop breaker) and the next attempt settles its ledger.

Writes are retried as they are: ``put_if`` keeps its condition, so a write that did reach the
store before the connection dropped comes back as PreconditionFailed and the ledger's transaction
re-reads and re-applies its change (the changes are idempotent or re-derived from what is read).
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from orchestrator.storage.base import ObjectStore, TransientStorageError

log = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 10.0


class StorageUnavailable(TransientStorageError):
    """The store failed every try for the whole retry window (``storage.retry_for``)."""


class RetryingStore(ObjectStore):
    """``inner`` with every call retried on TransientStorageError for up to ``retry_seconds``.

    Args:
        inner: the backend store.
        retry_seconds: how long one call may keep retrying (0: try once): ``storage.retry_for``.
        sleep, clock: for tests.
    """

    def __init__(
        self,
        inner: ObjectStore,
        *,
        retry_seconds: float,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.inner = inner
        self.uri = inner.uri
        self.retry_seconds = max(0.0, float(retry_seconds))
        self.down = False  # a call failed for the whole window: try once until the store answers again
        self._sleep = sleep
        self._clock = clock

    def __repr__(self) -> str:
        return f"RetryingStore({self.inner!r})"

    def __getattr__(self, name: str) -> Any:  # the backend's own attributes (an S3Store's client, bucket)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        started = self._clock()
        delay = FIRST_DELAY_S
        tries = 0
        while True:
            tries += 1
            try:
                result = fn()
            except TransientStorageError as err:
                waited = self._clock() - started
                if self.down or waited + delay > self.retry_seconds:
                    if not self.down:
                        log.error(
                            "storage %s unreachable for %.0fs (%d tries, storage.retry_for=%gs): %s",
                            self.uri,
                            waited,
                            tries,
                            self.retry_seconds,
                            err,
                        )
                    self.down = True
                    raise StorageUnavailable(
                        f"{what}: storage {self.uri} unreachable for {waited:.0f}s "
                        f"(storage.retry_for={self.retry_seconds:g}s): {err}"
                    ) from err
                if tries == 1:
                    log.warning(
                        "storage %s: %s failed (%s); retrying for up to %gs", self.uri, what, err, self.retry_seconds
                    )
                self._sleep(random.uniform(delay / 2, delay))
                delay = min(MAX_DELAY_S, delay * 2)
                continue
            if self.down or tries > 1:
                log.warning("storage %s answers again (%s, after %d tries)", self.uri, what, tries)
            self.down = False
            return result

    # -- ObjectStore -------------------------------------------------------
    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(f"writing {key}", lambda: self.inner.put_bytes(key, data))

    def get_bytes(self, key: str) -> bytes:
        return self._call(f"reading {key}", lambda: self.inner.get_bytes(key))

    def upload_file(self, local_path: str | Path, key: str) -> None:
        self._call(f"uploading {key}", lambda: self.inner.upload_file(local_path, key))

    def download_file(self, key: str, local_path: str | Path) -> None:
        self._call(f"downloading {key}", lambda: self.inner.download_file(key, local_path))

    def list(self, prefix: str = "") -> list[str]:
        return self._call(f"listing {prefix or '/'}", lambda: self.inner.list(prefix))

    def exists(self, key: str) -> bool:
        return self._call(f"looking up {key}", lambda: self.inner.exists(key))

    def size(self, key: str) -> int:
        return self._call(f"looking up {key}", lambda: self.inner.size(key))

    def delete(self, key: str) -> None:
        self._call(f"deleting {key}", lambda: self.inner.delete(key))

    def delete_prefix(self, prefix: str) -> None:
        self._call(f"deleting {prefix}", lambda: self.inner.delete_prefix(prefix))

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        return self._call(f"reading {key}", lambda: self.inner.get_versioned(key))

    def put_if(self, key: str, data: bytes, *, if_version: str | None) -> str:
        return self._call(f"writing {key}", lambda: self.inner.put_if(key, data, if_version=if_version))

    def abort_incomplete_uploads(self, prefix: str = "") -> int:
        return self._call("aborting incomplete uploads", lambda: self.inner.abort_incomplete_uploads(prefix))

    def get_uri(self, key: str) -> str:
        return self.inner.get_uri(key)
