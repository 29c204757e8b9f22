"""Bucket lifecycle rules for a job store (``orchestrator storage init <s3-uri>``: ``orchestrator.cli.storage``).

A worker killed mid-upload (the normal end of a spot instance) leaves the
parts of its multipart upload in the bucket, billed but invisible to a plain
listing. A lifecycle rule aborting incomplete uploads after N days cleans them
up without any process having to survive. Optionally a second rule expires
every object under the prefix after M days.

Rules are identified by id, derived from the prefix, so several stores in one
bucket and rules set by others are kept; only this tool's rules for this
prefix are replaced.
"""

from __future__ import annotations

import re

import botocore.exceptions

from orchestrator.core.errors import UserError
from orchestrator.storage.s3 import S3Store

DEFAULT_ABORT_INCOMPLETE_DAYS = 7
RULE_ID_PREFIX = "orchestrator-"


def _rule_ids(prefix: str) -> tuple[str, str]:
    # Lifecycle rule ids allow up to 255 characters; keep the prefix readable.
    tag = re.sub(r"[^A-Za-z0-9._-]", "-", prefix)[:200] or "bucket-root"
    return f"{RULE_ID_PREFIX}abort-incomplete-{tag}", f"{RULE_ID_PREFIX}expire-{tag}"


def _store(uri: str, endpoint_url: str | None, region: str | None, profile: str | None) -> S3Store:
    if not str(uri).startswith("s3://"):
        raise UserError(
            f"storage init applies to S3 URIs (s3://bucket/prefix), not {uri!r}; a local folder needs no lifecycle rules"
        )
    return S3Store(uri, endpoint_url=endpoint_url, region=region, profile=profile)


def _get_rules(store: S3Store) -> list[dict]:
    with store.translate_errors():
        try:
            return list(store.client.get_bucket_lifecycle_configuration(Bucket=store.bucket).get("Rules", []))
        except botocore.exceptions.ClientError as err:
            if err.response.get("Error", {}).get("Code") == "NoSuchLifecycleConfiguration":
                return []
            raise


def apply_lifecycle(
    uri: str,
    *,
    abort_incomplete_days: int = DEFAULT_ABORT_INCOMPLETE_DAYS,
    expire_days: int | None = None,
    endpoint_url: str | None = None,
    region: str | None = None,
    profile: str | None = None,
) -> dict:
    """Set this tool's lifecycle rules for ``uri``'s prefix, keeping every other rule.

    Returns {"applied": [rules set], "removed": [ids of this tool's rules dropped],
    "kept": [ids of other rules]}. An expire rule set earlier for this prefix is
    removed when ``expire_days`` is None. Raises ValueError for days < 1,
    UserError for a non-S3 URI, a missing bucket or refused credentials.
    """
    if abort_incomplete_days < 1:
        raise ValueError(f"--abort-incomplete-days must be at least 1, got {abort_incomplete_days}")
    if expire_days is not None and expire_days < 1:
        raise ValueError(f"--expire-days must be at least 1, got {expire_days}")
    store = _store(uri, endpoint_url, region, profile)
    filter_prefix = f"{store.prefix}/" if store.prefix else ""
    abort_id, expire_id = _rule_ids(store.prefix)
    applied = [
        {
            "ID": abort_id,
            "Status": "Enabled",
            "Filter": {"Prefix": filter_prefix},
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": abort_incomplete_days},
        }
    ]
    if expire_days is not None:
        applied.append(
            {
                "ID": expire_id,
                "Status": "Enabled",
                "Filter": {"Prefix": filter_prefix},
                "Expiration": {"Days": expire_days},
                "NoncurrentVersionExpiration": {"NoncurrentDays": expire_days},
            }
        )
    existing = _get_rules(store)
    ours = {abort_id, expire_id}
    kept = [r for r in existing if r.get("ID") not in ours]
    removed = [r["ID"] for r in existing if r.get("ID") in ours and r["ID"] not in {a["ID"] for a in applied}]
    with store.translate_errors():
        store.client.put_bucket_lifecycle_configuration(
            Bucket=store.bucket, LifecycleConfiguration={"Rules": kept + applied}
        )
    return {"applied": applied, "removed": removed, "kept": [r.get("ID", "?") for r in kept]}
