"""A job's committed checkpoints, described and verified (``orchestrator checkpoints``: ``orchestrator.cli.checkpoints``).

``verify_one`` downloads a checkpoint into a clean temporary folder, checks every file's size and SHA-256
against the manifest, and only then deserialises the weights and training state (safetensors files with
``safetensors.torch.load_file``; ``.pt``, ``.pth`` and ``.bin`` files with ``torch.load(weights_only=True)``
and the restore's allow-list) to prove the checkpoint restores. A manifest listing an unsafe path (absolute,
``..``, empty parts) fails before anything is downloaded.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from orchestrator.checkpoint import manifest as mf
from orchestrator.checkpoint import safe_load
from orchestrator.checkpoint.store import CheckpointStore, CommittedCheckpoint


def load_files(folder: Path, manifest: dict) -> int:
    """Deserialise every weight and state file listed in ``manifest``; returns how many were loaded.

    Call only after :func:`manifest.verify_folder` passed: nothing unverified is unpickled, and
    pickles go through the restore's own allow-list (:mod:`orchestrator.checkpoint.safe_load`).
    Raises CorruptCheckpoint (with the file named) when one does not load.
    """
    from safetensors.torch import load_file

    safe_load.check_deepspeed_tag(folder, manifest)
    deepspeed = safe_load.uses_deepspeed(manifest)
    pickled = set(safe_load.pickled_files(manifest))
    loaded = 0
    for entry in manifest["files"]:
        rel = entry["path"]
        path = mf.safe_join(folder, rel)
        if rel in pickled:
            safe_load.load_torch_file(path, deepspeed=deepspeed, name=rel)
        elif path.suffix == ".safetensors":
            try:
                load_file(str(path))
            except Exception as err:  # noqa: BLE001 - reported per checkpoint, with the file named
                raise mf.CorruptCheckpoint(f"file {rel} does not load: {type(err).__name__}: {err}") from err
        else:
            continue
        loaded += 1
    return loaded


def verify_one(checkpoints: CheckpointStore, ckpt: CommittedCheckpoint, manifest: dict) -> str | None:
    """Download ``ckpt`` into a clean temporary folder, check hashes, load it. Returns the failure reason or None."""
    with tempfile.TemporaryDirectory(prefix=f"verify-{ckpt.name}-") as tmp:
        local = Path(tmp)
        try:
            checkpoints.fetch(ckpt, manifest, local)  # every path checked before its download, every hash after
            load_files(local, manifest)
        except FileNotFoundError as err:
            return f"a listed file is missing from storage ({err})"
        except mf.CorruptCheckpoint as err:
            return str(err)
    return None


def describe(ckpt: CommittedCheckpoint, manifest: dict | None, error: str | None) -> dict:
    """One checkpoint as a JSON-able row."""
    row = {
        "name": ckpt.name,
        "step": ckpt.step,
        "fence": ckpt.fence,
        "created_at": None,
        "bytes": None,
        "files": None,
        "manifest_error": error,
    }
    if manifest is not None:
        row.update(
            created_at=manifest.get("created_at"),
            bytes=manifest.get("total_bytes"),
            files=len(manifest.get("files", [])),
        )
    return row
