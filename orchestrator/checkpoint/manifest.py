"""The manifest: written last, it is what makes a checkpoint exist.

It lists every file with its size and SHA-256, and carries the fingerprints of
the dataset and of the config fields that shape the training trajectory, so a
restore can refuse a checkpoint that belongs to another trajectory.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
_CHUNK_BYTES = 8 * 1024 * 1024


class CorruptCheckpoint(Exception):
    """A file is missing, truncated or does not match its hash."""


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK_BYTES), b""):
            h.update(chunk)
    return h.hexdigest()


def list_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_NAME)


def build_manifest(folder: Path, *, run_name: str, step: int, epoch: int, meta: dict) -> dict:
    files = [
        {"path": p.relative_to(folder).as_posix(), "size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in list_files(folder)
    ]
    import time

    return {
        "version": MANIFEST_VERSION,
        "run_name": run_name,
        "step": step,
        "epoch": epoch,
        "created_at": time.time(),
        "files": files,
        "total_bytes": sum(f["size"] for f in files),
        "meta": meta,
    }


def verify_folder(folder: Path, manifest: dict) -> None:
    """Check every listed file's size and hash before anything is deserialised. Raises CorruptCheckpoint."""
    for entry in manifest["files"]:
        path = folder / entry["path"]
        if not path.is_file():
            raise CorruptCheckpoint(f"file {entry['path']} is missing")
        size = os.path.getsize(path)
        if size != entry["size"]:
            raise CorruptCheckpoint(f"file {entry['path']} has {size} bytes, the manifest says {entry['size']} (truncated?)")
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            raise CorruptCheckpoint(f"file {entry['path']} does not match its SHA-256 (stored data changed)")


def dumps(manifest: dict) -> bytes:
    return json.dumps(manifest, indent=1, sort_keys=True).encode()


def loads(data: bytes) -> dict:
    manifest = json.loads(data)
    if manifest.get("version") != MANIFEST_VERSION or "files" not in manifest:
        raise CorruptCheckpoint("the manifest is not one this version writes")
    return manifest
