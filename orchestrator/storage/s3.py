"""S3 and S3-compatible stores (MinIO, Cloudflare R2, GCS's XML API) through boto3.

Credentials come only from the standard AWS chain (environment, shared
profile, instance or pod role), never from the job's config. Large files go
through boto3's transfer manager, which uploads in parts above
``multipart_threshold_mb``; a process killed mid-upload leaves parts behind
that ``abort_incomplete_uploads`` (or a bucket lifecycle rule, see
``orchestrator storage init``) cleans up.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

import boto3
import boto3.exceptions
import botocore.exceptions
import botocore.session
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from orchestrator.core.errors import UserError
from orchestrator.storage.base import (
    ObjectStore,
    PreconditionFailed,
    TransientStorageError,
)

MIB = 1024 * 1024
# S3 refuses parts under 5 MiB (except the last), whatever the threshold.
MIN_PART_SIZE_BYTES = 5 * MIB

_NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound"}
_PRECONDITION_CODES = {"412", "PreconditionFailed", "409", "ConditionalRequestConflict"}
_TRANSIENT_CODES = {
    "Throttling",
    "ThrottlingException",
    "SlowDown",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
    "RequestLimitExceeded",
    "TooManyRequestsException",
}
_ACCESS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "403"}


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """Split ``s3://bucket/some/prefix`` into ("bucket", "some/prefix"). Raises ValueError."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an S3 URI: {uri!r}; expected s3://bucket/prefix")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"S3 URI {uri!r} names no bucket; expected s3://bucket/prefix")
    return bucket, prefix.strip("/")


_shared_loader = None


def _session(profile: str | None, region: str | None) -> boto3.Session:
    """A new session (its own credential chain, read as a fresh ``boto3.Session`` reads it) whose service models
    come from one loader per process: each new session's own loader read botocore's JSON models again, about
    0.1 CPU-s per store, and an attempt opens several. Attempts forked from a supervisor inherit its loader."""
    global _shared_loader
    core = botocore.session.get_session()
    if _shared_loader is None:
        _shared_loader = core.get_component("data_loader")
    else:
        core.register_component("data_loader", _shared_loader)
    return boto3.Session(botocore_session=core, profile_name=profile, region_name=region)


class S3Store(ObjectStore):
    """An object store at ``s3://bucket/prefix``.

    Args:
        uri: ``s3://bucket`` or ``s3://bucket/prefix``; keys live under the prefix.
        endpoint_url: an S3-compatible endpoint; None lets boto3 decide
            (it reads ``AWS_ENDPOINT_URL`` itself).
        region, profile: passed to ``boto3.Session``.
        checksum_compat: send and check checksums only where the API requires them,
            for stores that reject boto3's default CRC headers.
        multipart_threshold_mb: files at least this large are uploaded in parts.

    Raises ValueError for a malformed URI or threshold. Methods raise
    FileNotFoundError, PreconditionFailed, TransientStorageError, or UserError
    (missing bucket, missing or refused credentials).
    """

    def __init__(
        self,
        uri: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        checksum_compat: bool = False,
        multipart_threshold_mb: int = 64,
    ):
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        if multipart_threshold_mb < 1:
            raise ValueError(f"storage.multipart_threshold_mb must be at least 1, got {multipart_threshold_mb}")
        config_kwargs: dict = {"retries": {"mode": "standard", "max_attempts": 5}}
        if checksum_compat:
            config_kwargs.update(
                request_checksum_calculation="when_required", response_checksum_validation="when_required"
            )
        try:
            session = _session(profile, region)
        except botocore.exceptions.ProfileNotFound:
            raise UserError(
                f"AWS profile {profile!r} (storage.profile) is not in ~/.aws/config or ~/.aws/credentials; "
                "fix the name or leave storage.profile unset to use the default credential chain"
            ) from None
        self.client = session.client("s3", endpoint_url=endpoint_url, config=Config(**config_kwargs))
        threshold = multipart_threshold_mb * MIB
        self.transfer_config = TransferConfig(
            multipart_threshold=threshold, multipart_chunksize=max(threshold, MIN_PART_SIZE_BYTES)
        )

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r})"

    def _key(self, key: str) -> str:
        if not key or key.startswith("/"):
            raise ValueError(f"invalid storage key {key!r}: use a relative path like 'run/ledger.json'")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full_key: str) -> str:
        return full_key[len(self.prefix) + 1 :] if self.prefix else full_key

    @contextlib.contextmanager
    def translate_errors(self, key: str = "", *, missing_means_precondition: bool = False) -> Iterator[None]:
        """Turn boto3's errors into the interface's (see base.py)."""
        where = self.get_uri(key) if key else self.uri
        try:
            yield
        except boto3.exceptions.S3UploadFailedError as err:
            # The transfer manager re-raises a ClientError as this inside its
            # except block (so it is the context, not always the cause): translate that.
            cause = err.__cause__ or err.__context__
            if isinstance(cause, botocore.exceptions.ClientError):
                with self.translate_errors(key, missing_means_precondition=missing_means_precondition):
                    raise cause from None
            if isinstance(cause, (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError)):
                raise TransientStorageError(f"{where}: connection failed: {cause}") from err
            raise
        except botocore.exceptions.ClientError as err:
            code = str(err.response.get("Error", {}).get("Code", ""))
            http = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code == "NoSuchBucket":
                raise UserError(
                    f"bucket {self.bucket!r} does not exist (storage URI {self.uri}); "
                    "create it, or fix storage.uri / storage.endpoint_url"
                ) from None
            if code in _PRECONDITION_CODES or http in (409, 412):
                raise PreconditionFailed(f"{where}: {code or http}: the object changed since it was read") from None
            if code in _NOT_FOUND_CODES or http == 404:
                if missing_means_precondition:
                    raise PreconditionFailed(f"{where} no longer exists") from None
                raise FileNotFoundError(f"no object at {where}") from None
            if code in _ACCESS_CODES:
                raise UserError(
                    f"access to {where} was refused ({code}): the AWS credentials in use lack permission "
                    "or are invalid; check AWS_PROFILE / AWS_ACCESS_KEY_ID or the instance role"
                ) from None
            if code in _TRANSIENT_CODES or http >= 500 or http == 429:
                raise TransientStorageError(f"{where}: {code or http}: {err}") from err
            raise
        except botocore.exceptions.NoCredentialsError:
            raise UserError(
                f"no AWS credentials found for {self.uri}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "or AWS_PROFILE / storage.profile, or run with an instance role (credentials never go in config)"
            ) from None
        except (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError) as err:
            raise TransientStorageError(f"{where}: connection failed: {err}") from err

    # -- ObjectStore -------------------------------------------------------
    def put_bytes(self, key: str, data: bytes) -> None:
        with self.translate_errors(key):
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def get_bytes(self, key: str) -> bytes:
        return self.get_versioned(key)[0]

    def upload_file(self, local_path: str | Path, key: str) -> None:
        with self.translate_errors(key):
            self.client.upload_file(str(local_path), self.bucket, self._key(key), Config=self.transfer_config)

    def download_file(self, key: str, local_path: str | Path) -> None:
        dest = Path(local_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.part-")
        os.close(fd)
        try:
            with self.translate_errors(key):
                self.client.download_file(self.bucket, self._key(key), tmp, Config=self.transfer_config)
            os.replace(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def list(self, prefix: str = "") -> list[str]:
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        keys: list[str] = []
        with self.translate_errors(prefix):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full_prefix):
                keys.extend(self._rel(obj["Key"]) for obj in page.get("Contents", []))
        return sorted(keys)

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except FileNotFoundError:
            return False
        return True

    def size(self, key: str) -> int:
        with self.translate_errors(key):
            return int(self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])

    def delete(self, key: str) -> None:
        with self.translate_errors(key):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def delete_prefix(self, prefix: str) -> None:
        keys = self.list(prefix)
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = [{"Key": self._key(k)} for k in keys[start : start + 1000]]
            with self.translate_errors(prefix):
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        with self.translate_errors(key):
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return resp["Body"].read(), resp["ETag"]

    def put_if(self, key: str, data: bytes, *, if_version: str | None) -> str:
        # S3 evaluates If-None-Match / If-Match atomically on the server;
        # the version token is the object's ETag.
        condition = {"IfNoneMatch": "*"} if if_version is None else {"IfMatch": if_version}
        with self.translate_errors(key, missing_means_precondition=if_version is not None):
            resp = self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **condition)
        return resp["ETag"]

    def abort_incomplete_uploads(self, prefix: str = "") -> int:
        """Abort every unfinished multipart upload under the store's prefix + ``prefix``; returns how many."""
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        aborted = 0
        with self.translate_errors(prefix):
            pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=full_prefix)
            for page in pages:
                for upload in page.get("Uploads", []):
                    try:
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                    except botocore.exceptions.ClientError as err:
                        # Another cleaner, or the upload's own completion, got there first.
                        if err.response.get("Error", {}).get("Code") != "NoSuchUpload":
                            raise
                        continue
                    aborted += 1
        return aborted
