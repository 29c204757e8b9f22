"""A job's inputs in object storage: training data, chat templates and model weights at ``s3://`` URIs.

``data.path``, ``data.mix[i].path``, ``data.chat_template`` and ``model.name_or_path`` may name objects in
S3 (or an S3-compatible store): one object (``s3://b/data/train.jsonl``), a folder (``s3://b/data/shards/``)
or a glob (``s3://b/data/part-*.parquet``). Each attempt downloads them once into its own work folder
(``<run.work_dir>/<run>/<attempt>/inputs/``; the ranks of an attempt share it under a file lock) through the
job's storage settings (``storage.endpoint_url``, ``storage.region``, ``storage.profile``; credentials from the
AWS chain, never from the config), then reads them as local files. Storage is untrusted: a key that would land
outside the download folder is refused, and every file is checked against what the bucket listed (its size,
and its MD5 against the ETag when the ETag is one, as for a single-part upload). Data read this way is
fingerprinted by its rows like local data, so a changed object is a changed trajectory.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import logging
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, Optional, cast

from orchestrator.core.errors import DataError

log = logging.getLogger(__name__)

SCHEME = "s3://"
GLOB_CHARS = "*?["
MIB = 1024 * 1024
# part sizes a multipart ETag ("<md5 of the part md5s>-<parts>") is checked against: the AWS CLI's and boto3's
# default (8 MiB), this project's own threshold (64 MiB) and other common ones
PART_SIZES_MIB = (8, 16, 5, 64, 32, 100, 128, 256, 512)


def is_remote(value: Any) -> bool:
    """Whether a path-valued setting names object storage (``s3://...``)."""
    return isinstance(value, str) and value.startswith(SCHEME)


def split(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ("bucket", "a/b"). Raises DataError for a URI without a bucket."""
    bucket, _, key = uri[len(SCHEME) :].partition("/")
    if not bucket:
        raise DataError(f"{uri!r} names no bucket; write s3://bucket/path/to/file.jsonl.")
    return bucket, key


def _md5_etag(path: Path, part_size: Optional[int] = None) -> str:
    """The ETag S3 gives ``path``: its MD5 (one part), or the MD5 of the parts' MD5s and their count."""
    whole, digests, in_part = hashlib.md5(), [], 0
    with path.open("rb") as fh:
        while chunk := fh.read(MIB if part_size is None else min(MIB, part_size - in_part)):
            if part_size is None:
                whole.update(chunk)
                continue
            if in_part == 0:
                digests.append(hashlib.md5())
            digests[-1].update(chunk)
            in_part = (in_part + len(chunk)) % part_size
    if part_size is None:
        return whole.hexdigest()
    return f"{hashlib.md5(b''.join(d.digest() for d in digests)).hexdigest()}-{len(digests)}"


def verify(path: Path, size: int, etag: str, uri: str) -> None:
    """``path`` is the object the bucket listed: its size, and its ETag where one can be recomputed.

    Raises DataError naming the object and the mismatch.
    """
    got = path.stat().st_size
    if got != size:
        raise DataError(
            f"{uri}: downloaded {got} bytes, the bucket listed {size}. The object changed during the "
            "download or the transfer was cut; run the job again."
        )
    etag = etag.strip('"')
    if "-" not in etag:
        if len(etag) == 32 and _md5_etag(path) != etag:
            raise DataError(
                f"{uri}: the downloaded bytes do not match the object's ETag {etag}; run the job again "
                "(and check the object was not replaced while it was read)."
            )
        return
    parts = int(etag.rsplit("-", 1)[1]) if etag.rsplit("-", 1)[1].isdigit() else 0
    candidates = [p * MIB for p in PART_SIZES_MIB if parts and -(-size // (p * MIB)) == parts]
    if not candidates:
        log.warning("%s: a multipart ETag (%s) from an unknown part size; checked by size only", uri, etag)
        return
    if all(_md5_etag(path, p) != etag for p in candidates):
        raise DataError(f"{uri}: the downloaded bytes do not match the object's ETag {etag}; run the job again.")


def _refuse_file_and_folder(uri: str, listed: list[tuple[str, str, int, str]]) -> None:
    """S3 keys are names, not paths: ``a/b`` and ``a/b/c`` can both be objects, but no folder can hold both a file
    ``b`` and a folder ``b``. Such a listing is refused naming the two keys, before anything is downloaded."""
    files = {relative: key for key, relative, _, _ in listed}
    for key, relative, _, _ in listed:
        parts = relative.split("/")
        for n in range(1, len(parts)):
            parent = "/".join(parts[:n])
            if parent in files:
                raise DataError(
                    f"{uri}: {files[parent]} is an object and also a folder of {key}: the two cannot "
                    "both be downloaded. Rename or delete one of them in the bucket."
                )


def listing_digest(listed: list[tuple[str, str, int, str]]) -> str:
    """SHA-256 of what a listing names (each object's path under the URI, size and ETag): another upload under the
    same key, a file added or removed, gives another digest."""
    rows = sorted((relative, size, etag.strip('"')) for _, relative, size, etag in listed)
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _safe_join(folder: Path, relative: str, uri: str) -> Path:
    parts = PurePosixPath(relative).parts
    if not parts or relative.startswith("/") or any(p in ("..", ".") for p in parts) or "\\" in relative:
        raise DataError(
            f"{uri}: the bucket lists the key {relative!r}, which would be written outside the download "
            "folder; remove or rename that object."
        )
    return folder.joinpath(*parts)


class InputFiles:
    """Downloads of ``s3://`` inputs into ``folder``, once per folder (per attempt)."""

    def __init__(self, storage_cfg: Any, folder: Path, on_listed: Optional[Callable[[str, str], None]] = None):
        self.storage_cfg = storage_cfg
        self.folder = Path(folder)
        self._stores: dict[str, Any] = {}
        # told (uri, digest of its listing) before anything is downloaded: the attempt holds an input to what the
        # job's first attempt trained on (a model swapped under the same key is refused, not resumed on)
        self.on_listed = on_listed

    def _store(self, bucket: str):
        if bucket not in self._stores:
            from orchestrator.storage.s3 import S3Store

            s = self.storage_cfg
            self._stores[bucket] = S3Store(
                f"{SCHEME}{bucket}",
                endpoint_url=s.endpoint_url,
                region=s.region,
                profile=s.profile,
                checksum_compat=bool(s.checksum_compat),
            )
        return self._stores[bucket]

    def listing(self, uri: str) -> list[tuple[str, str, int, str]]:
        """(key, path relative to the URI's folder, size, ETag) of each object ``uri`` names, in key order.

        One object, every object under a folder (a URI ending in ``/``, or a name that is no object), or the
        objects matching a glob. Raises DataError when it names none.
        """
        bucket, key = split(uri)
        store = self._store(bucket)
        glob = next((i for i, c in enumerate(key) if c in GLOB_CHARS), None)
        prefix = (
            key[:glob].rsplit("/", 1)[0] + "/"
            if glob is not None and "/" in key[:glob]
            else ("" if glob is not None else key)
        )
        out = []
        with store.translate_errors(prefix):
            pages = store.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            objects = [o for page in pages for o in page.get("Contents", [])]
        exact = [o for o in objects if o["Key"] == key and not key.endswith("/")]
        if glob is not None:
            chosen = [o for o in objects if fnmatch.fnmatchcase(o["Key"], key)]
            base = prefix
        elif exact:
            chosen, base = exact, key.rsplit("/", 1)[0] + "/" if "/" in key else ""
        else:
            base = key if key.endswith("/") or not key else key + "/"
            chosen = [o for o in objects if o["Key"].startswith(base) and not o["Key"].endswith("/")]
        for o in sorted(chosen, key=lambda o: o["Key"]):
            out.append((o["Key"], o["Key"][len(base) :], int(o["Size"]), str(o.get("ETag", ""))))
        if not out:
            raise DataError(
                f"{uri}: no such object in the bucket (nor objects under it). Upload it (aws s3 cp FILE "
                f"{uri}), or fix the path; storage.endpoint_url says which store is read."
            )
        _refuse_file_and_folder(uri, out)
        return out

    def _target(self, uri: str) -> Path:
        return self.folder / hashlib.sha256(uri.encode()).hexdigest()[:16]

    def fetch(self, uri: str) -> list[Path]:
        """The local copies of the objects ``uri`` names (see ``listing``), downloaded and verified once."""
        target = self._target(uri)
        target.mkdir(parents=True, exist_ok=True)
        with _locked(target / ".lock"):
            listed = self.listing(uri)
            if self.on_listed is not None:
                self.on_listed(uri, listing_digest(listed))
            bucket = split(uri)[0]
            paths = []
            for key, relative, size, etag in listed:
                dest = _safe_join(target, relative, uri)
                stamp = dest.with_name(f".{dest.name}.verified")
                seen = {"etag": etag, "size": size}
                if not (dest.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == seen):
                    self._store(bucket).download_file(key, dest)
                    verify(dest, size, etag, f"{SCHEME}{bucket}/{key}")
                    stamp.write_text(json.dumps(seen))
                paths.append(dest)
        log.info("%s: %d file(s), %d bytes, in %s", uri, len(paths), sum(x[2] for x in listed), target)
        return paths

    def folder_of(self, uri: str) -> Path:
        """``uri`` as a local folder (a model's weights): every object under it, downloaded."""
        folder_uri = uri.rstrip("/") + "/"
        self.fetch(folder_uri)
        return self._target(folder_uri)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_ACTIVE: dict[str, Optional[InputFiles]] = {"files": None}


def use(storage_cfg: Any, folder: Path, on_listed: Optional[Callable[[str, str], None]] = None) -> InputFiles:
    """Make ``folder`` this process's download folder for ``s3://`` inputs (the attempt's builder calls it);
    ``on_listed``: see ``InputFiles``."""
    _ACTIVE["files"] = InputFiles(storage_cfg, folder, on_listed)
    return cast(InputFiles, _ACTIVE["files"])


def active() -> InputFiles:
    """The download folder set by ``use``; outside an attempt, a temporary one with the default AWS settings."""
    if _ACTIVE["files"] is None:
        from types import SimpleNamespace

        _ACTIVE["files"] = InputFiles(SimpleNamespace(), Path(tempfile.mkdtemp(prefix="orch-inputs-")))
    return cast(InputFiles, _ACTIVE["files"])


def local_files(value: str) -> list[Path]:
    """The local files a path setting names: its downloads when it is ``s3://``, else the path itself."""
    return active().fetch(value) if is_remote(value) else [Path(value).expanduser()]


def local_folder(value: str) -> Path:
    """The local folder a path setting names (a model): its download when it is ``s3://``."""
    return active().folder_of(value) if is_remote(value) else Path(value).expanduser()
