"""Object storage for checkpoints and the run ledger.

``open_store`` picks the backend from the URI; callers only see the
``ObjectStore`` interface and its three error types.
"""

from __future__ import annotations

from typing import Any

from orchestrator.storage.base import (
    ObjectStore,
    PreconditionFailed,
    TransientStorageError,
)
from orchestrator.storage.local import LocalStore

__all__ = [
    "ObjectStore",
    "PreconditionFailed",
    "TransientStorageError",
    "LocalStore",
    "check_uri",
    "open_store",
    "store_from_config",
    "split_run_uri",
]

_ACCEPTED_FORMS = "a local folder (runs/ or /abs/path), file:///abs/path, or s3://bucket/prefix"


def check_uri(uri: str) -> None:
    """Raise ValueError (naming the URI and the accepted forms) for a URI ``open_store`` cannot open.

    Reads no credentials and imports no cloud SDK, so the launcher checks ``storage.uri`` with it.
    """
    uri = str(uri)
    if uri.startswith("s3://"):
        if not uri[len("s3://") :].partition("/")[0]:
            raise ValueError(f"S3 URI {uri!r} names no bucket; expected s3://bucket/prefix")
        return
    if uri.startswith("file://"):
        if not uri[len("file://") :]:
            raise ValueError(f"storage URI {uri!r} names no folder; use {_ACCEPTED_FORMS}")
        return
    if "://" in uri or not uri:
        raise ValueError(
            f"unsupported storage URI {uri!r}: use {_ACCEPTED_FORMS}. "
            "For MinIO, R2 or GCS use s3://bucket/prefix with storage.endpoint_url."
        )


def open_store(uri: str, **s3_options: Any) -> ObjectStore:
    """Open the store at ``uri``.

    A plain path or ``file://`` URI gives a LocalStore; ``s3://bucket/prefix``
    gives an S3Store, built with ``s3_options`` (S3Store's keyword arguments: ``endpoint_url``, ``region``,
    ``profile``, ``checksum_compat``, ``multipart_threshold_mb``; ignored for a local store). S3-compatible
    stores such as MinIO, R2 or GCS use s3:// with ``endpoint_url``.
    Raises ValueError for any other scheme.
    """
    uri = str(uri)
    check_uri(uri)
    if uri.startswith("s3://"):
        from orchestrator.storage.s3 import (
            S3Store,  # boto3 is slow to import; local runs skip it
        )

        return S3Store(uri, **s3_options)
    if uri.startswith("file://"):
        return LocalStore(uri[len("file://") :])
    return LocalStore(uri)


def store_from_config(storage_cfg: Any, *, retry: bool = True) -> ObjectStore:
    """Open the store a ``StorageConfig`` (or any object with its attributes) describes, every call
    retried through a short outage (``storage.retry_for``: ``orchestrator.storage.retry``); ``retry=False``
    for a reader whose answer is advice (the launch plan), which must not wait out an outage."""
    from orchestrator.core.durations import parse_duration
    from orchestrator.storage.retry import RetryingStore

    inner = open_store(
        storage_cfg.uri,
        endpoint_url=storage_cfg.endpoint_url,
        region=storage_cfg.region,
        profile=storage_cfg.profile,
        checksum_compat=bool(storage_cfg.checksum_compat),
        multipart_threshold_mb=int(storage_cfg.multipart_threshold_mb),
    )
    if not retry:
        return inner
    return RetryingStore(inner, retry_seconds=parse_duration(storage_cfg.retry_for, key="storage.retry_for"))


def split_run_uri(uri: str) -> tuple[str, str]:
    """Split ``<storage-uri>/<run-name>`` into (storage uri, run name) on the last path component.

    ``s3://b/runs/exp1`` -> ("s3://b/runs", "exp1"); ``.cache/runs/exp1`` ->
    (".cache/runs", "exp1"); a bare ``exp1`` -> (".", "exp1").
    Raises ValueError when there is no run name (``s3://bucket``).
    """
    text = str(uri)
    no_run = ValueError(
        f"{uri!r} names no run: give <storage-uri>/<run-name>, e.g. s3://bucket/runs/exp1 or .cache/runs/exp1"
    )
    if text.startswith("s3://"):
        from orchestrator.storage.s3 import parse_s3_uri

        bucket, prefix = parse_s3_uri(text)
        if not prefix:
            raise no_run
        head, _, run_name = prefix.rpartition("/")
        return (f"s3://{bucket}/{head}" if head else f"s3://{bucket}"), run_name
    scheme = "file://" if text.startswith("file://") else ""
    path = text[len(scheme) :]
    trimmed = path.rstrip("/")
    if not trimmed:
        raise no_run
    head, slash, run_name = trimmed.rpartition("/")
    if not slash:
        head = "."
    elif not head:
        head = "/"
    return scheme + head, run_name
