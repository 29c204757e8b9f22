"""The object-store interface every backend implements.

Keys are '/'-separated paths relative to the store's root (the job's
``storage.uri``). A backend turns vendor errors into ``FileNotFoundError``
(missing key), ``PreconditionFailed`` (a conditional write lost) or
``TransientStorageError`` (worth retrying), so callers never see boto3 types.
"""

from __future__ import annotations

import abc
import math
from pathlib import Path


class PreconditionFailed(Exception):
    """A conditional write found the key in another state than expected."""


class TransientStorageError(Exception):
    """A failure that may go away when retried (throttling, a dropped connection)."""


class ObjectStore(abc.ABC):
    """Small object-store interface (after Composer's ObjectStore)."""

    uri: str

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Write ``data`` at ``key``, replacing what is there."""

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Return the object's bytes. Raises FileNotFoundError."""

    @abc.abstractmethod
    def upload_file(self, local_path: str | Path, key: str) -> None:
        """Upload a local file (multipart for large files)."""

    @abc.abstractmethod
    def download_file(self, key: str, local_path: str | Path) -> None:
        """Download into a temporary name beside ``local_path``, then rename. Raises FileNotFoundError."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """All keys under ``prefix``, sorted."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def size(self, key: str) -> int:
        """Size in bytes. Raises FileNotFoundError."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete one key; a missing key is not an error."""

    def delete_prefix(self, prefix: str) -> None:
        for key in self.list(prefix):
            self.delete(key)

    @abc.abstractmethod
    def get_versioned(self, key: str) -> tuple[bytes, str]:
        """Return (bytes, version token) for a conditional update. Raises FileNotFoundError."""

    @abc.abstractmethod
    def put_if(self, key: str, data: bytes, *, if_version: str | None) -> str:
        """Conditional write; returns the new version token.

        ``if_version=None``: create only if the key is absent. Otherwise replace
        only if the current version equals ``if_version``. Raises PreconditionFailed.
        """

    def abort_incomplete_uploads(self, prefix: str = "") -> int:
        """Abort multipart uploads left by killed processes; returns how many."""
        return 0

    def get_uri(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{key}"


def finite_number(value) -> bool:
    """Whether a value read from storage is a usable number: an int or float, finite, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def checked_json(raw: bytes, problem_of) -> tuple[object, str | None]:
    """A stored JSON document and what is wrong with it (``problem_of(doc)``, or that it is not JSON): every
    object the project keeps in storage is untrusted input, read through this before anything uses it."""
    import json

    try:
        doc = json.loads(raw)
        return doc, problem_of(doc)
    except (ValueError, UnicodeDecodeError) as err:
        return None, f"it is not JSON ({str(err)[:120]})"
