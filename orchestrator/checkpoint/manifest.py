"""The manifest: written last, it is what makes a checkpoint exist.

It lists every file with its size and SHA-256, and carries the fingerprints of
the dataset and of the config fields that shape the training trajectory, so a
restore can refuse a checkpoint that belongs to another trajectory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any, cast

from orchestrator.core.signing import SIGNING_KEY_VARIABLE, signature_problem, signed
from orchestrator.records.fencing import upgraded

__all__ = ["SIGNING_KEY_VARIABLE", "signature_problem", "signed"]  # the manifest's signer, re-exported

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
_CHUNK_BYTES = 8 * 1024 * 1024


class CorruptCheckpoint(Exception):
    """A file is missing, truncated, does not match its hash, or the manifest itself is unsafe."""


_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# A Windows drive ("C:") would make the path absolute where the restore runs on Windows.
_DRIVE = re.compile(r"^[A-Za-z]:")


def check_path(path: object) -> str:
    """Return ``path`` if it is a safe relative path inside a checkpoint; raise CorruptCheckpoint otherwise.

    Safe means: a non-empty string of '/'-separated parts, none of them empty, '.' or '..',
    not absolute, no drive letter, no backslash, NUL or other control character. Whoever
    can write the bucket writes the manifest, so this runs before anything is downloaded.
    """
    if not isinstance(path, str) or not path:
        raise CorruptCheckpoint(f"the manifest lists an unsafe path {path!r} (not a non-empty string)")
    why = None
    if path.startswith("/") or _DRIVE.match(path):
        why = "absolute"
    elif any(ord(c) < 32 or ord(c) == 127 for c in path):
        why = "contains a control character"
    elif "\\" in path:
        why = "contains a backslash"
    else:
        parts = path.split("/")
        if ".." in parts:
            why = "climbs out with '..'"
        elif any(p in ("", ".") for p in parts):
            why = "an empty or '.' part"
    if why:
        raise CorruptCheckpoint(f"the manifest lists an unsafe path {path!r} ({why})")
    return path


def safe_join(folder: Path, path: str) -> Path:
    """``folder / path`` after :func:`check_path`, and only if it stays inside ``folder`` once resolved
    (a symbolic link already in ``folder`` cannot lead out). Raises CorruptCheckpoint."""
    check_path(path)
    joined = Path(folder).joinpath(*PurePosixPath(path).parts)
    root = Path(folder).resolve()
    if not joined.resolve().is_relative_to(root):
        raise CorruptCheckpoint(f"the manifest lists an unsafe path {path!r} (leads out of the checkpoint folder)")
    return joined


def listed_path(manifest: dict, path: object, *, named_by: str) -> str:
    """``path``, named by a file inside a checkpoint (``named_by``), if it is safe and a file the manifest lists:
    what a loader opens by a name it read from the checkpoint is then a file whose hash was checked.
    Raises CorruptCheckpoint."""
    try:
        check_path(path)
    except CorruptCheckpoint:
        raise CorruptCheckpoint(f"{named_by} names an unsafe path {path!r}") from None
    if path not in {entry["path"] for entry in manifest["files"]}:
        raise CorruptCheckpoint(f"{named_by} names {path!r}, a file the manifest does not list")
    return cast(str, path)  # check_path passed: a string


def check_entries(manifest: dict) -> None:
    """Check every file entry's shape and path (no duplicates, no manifest in the list). Raises CorruptCheckpoint."""
    files = manifest.get("files")
    if not isinstance(files, list):
        raise CorruptCheckpoint("the manifest's 'files' is not a list")
    seen = set()
    for entry in files:
        if not isinstance(entry, dict):
            raise CorruptCheckpoint(f"the manifest lists a file entry that is not an object: {entry!r}")
        path = check_path(entry.get("path"))
        if path in seen or path == MANIFEST_NAME:
            raise CorruptCheckpoint(f"the manifest lists the path {path!r} twice or lists itself")
        seen.add(path)
        size, digest = entry.get("size"), entry.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise CorruptCheckpoint(f"the manifest gives {path!r} an invalid size {size!r}")
        if not isinstance(digest, str) or not _SHA256_HEX.match(digest):
            raise CorruptCheckpoint(f"the manifest gives {path!r} an invalid SHA-256 {digest!r}")


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK_BYTES), b""):
            h.update(chunk)
    return h.hexdigest()


def list_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)


def build_manifest(folder: Path, *, run_name: str, step: int, fence: int, meta: dict) -> dict:
    files = [
        {"path": p.relative_to(folder).as_posix(), "size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in list_files(folder)
    ]
    import time

    return {
        "version": MANIFEST_VERSION,
        "run_name": run_name,
        "step": step,
        "fence": fence,
        "created_at": time.time(),
        "files": files,
        "total_bytes": sum(f["size"] for f in files),
        "meta": meta,
    }


def fetch_folder(store: Any, prefix: str, manifest: dict, local: Path) -> None:
    """Download every file ``manifest`` lists from ``<prefix><path>`` in ``store`` into ``local``, each path checked
    before its download, then check every size and hash before anything is deserialised.

    Raises CorruptCheckpoint (a path that would land outside ``local``, a size or hash that differs) or
    FileNotFoundError (a listed file missing from storage)."""
    for entry in manifest["files"]:
        store.download_file(f"{prefix}{entry['path']}", safe_join(local, entry["path"]))
    verify_folder(local, manifest)


def verify_folder(folder: Path, manifest: dict) -> None:
    """Check every listed file's size and hash before anything is deserialised. Raises CorruptCheckpoint."""
    for entry in manifest["files"]:
        path = safe_join(folder, entry["path"])
        if not path.is_file():
            raise CorruptCheckpoint(f"file {entry['path']} is missing")
        size = os.path.getsize(path)
        if size != entry["size"]:
            raise CorruptCheckpoint(
                f"file {entry['path']} has {size} bytes, the manifest says {entry['size']} (truncated?)"
            )
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            raise CorruptCheckpoint(f"file {entry['path']} does not match its SHA-256 (stored data changed)")


def check_signature(manifest: dict) -> None:
    """With ``ORCH_MANIFEST_HMAC_KEY`` set, the manifest must carry its HMAC-SHA256. Raises CorruptCheckpoint."""
    problem = signature_problem(manifest)
    if problem:
        raise CorruptCheckpoint(problem)


def dumps(manifest: dict) -> bytes:
    """The manifest as stored; signed when ``ORCH_MANIFEST_HMAC_KEY`` is set."""
    return json.dumps(signed(manifest), indent=1, sort_keys=True).encode()


def loads(data: bytes) -> dict:
    """Parse a manifest read from storage, check its signature (when a key is set) and every listed path.

    Raises CorruptCheckpoint for anything but a well-formed manifest of this version.
    """
    try:
        manifest = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptCheckpoint(f"the manifest is not valid JSON ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION or "files" not in manifest:
        raise CorruptCheckpoint("the manifest is not one this version writes")
    check_signature(manifest)  # over the manifest as stored, legacy key and all
    check_entries(manifest)
    manifest = upgraded(manifest)
    for key in ("step", "fence"):  # they name the checkpoint's folder and order the restore
        value = manifest.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CorruptCheckpoint(f"the manifest's {key} is {value!r}, not a count")
    return manifest
