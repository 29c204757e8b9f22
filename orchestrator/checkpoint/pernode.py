"""Checkpoints of nodes with disks of their own: each node uploads and restores its own files.

Used when not every rank sees rank 0's work folder (``every_rank_sees`` in ``orchestrator.attempt.checkpoints``).
At a commit, after the barrier, every node's local rank 0 hashes its node's files of the step (RNG states,
ZeRO/FSDP shards) that no lower rank's node holds, uploads them under the checkpoint's prefix and reports
``[{path, size, sha256}]`` through the attempt's gloo group (all-gather); rank 0 adds those entries to the
one manifest its uploader writes last, so the checkpoint exists only once every node's files are stored.
At a restore, rank 0's verified checkpoint decides the step; every node that does not see rank 0's folder
downloads that checkpoint into its own work folder, each path checked, each size and hash verified and each
pickle checked before any rank loads.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Optional

from orchestrator.checkpoint import manifest as mf
from orchestrator.checkpoint.store import CheckpointStore, retry_transient
from orchestrator.core import ranks as dist

log = logging.getLogger(__name__)


def local_main() -> bool:
    """This rank is its node's first (the one that uploads and downloads the node's files)."""
    return int(os.environ.get("LOCAL_RANK", dist.rank())) == 0


def _entries(folder: Path, skip: set) -> list[dict]:
    return [
        {"path": p.relative_to(folder).as_posix(), "size": p.stat().st_size, "sha256": mf.sha256_file(p)}
        for p in mf.list_files(folder)
        if p.relative_to(folder).as_posix() not in skip
    ]


def _upload_node(checkpoints: CheckpointStore, folder: Path, name: str, skip: set) -> dict:
    """This node's files of ``folder`` not in ``skip``, hashed and uploaded: ``{"files": [...]}`` or
    ``{"error": text}`` (reported, never raised: every rank must reach the next collective)."""
    try:
        entries = _entries(folder, skip)
        prefix = f"{checkpoints.prefix}{name}/"
        for entry in entries:
            retry_transient(lambda e=entry: checkpoints.store.upload_file(folder / e["path"], prefix + e["path"]))
        return {"files": entries}
    except Exception as err:  # noqa: BLE001 - reported to rank 0, which then does not commit
        return {"error": f"{type(err).__name__}: {err}"}


def share_node_files(
    checkpoints: CheckpointStore, folder: Path, name: Optional[str], main: bool, sees: bool
) -> list[dict]:
    """A collective at a commit: the files of every node that does not see rank 0's ``folder`` (``sees``)
    uploaded by its local rank 0; rank 0 gets the entries to add to the manifest (others: []). Raises
    RuntimeError on rank 0 when a node's upload failed (no commit of that step)."""
    name = dist.broadcast(name)
    uploads = local_main() and not main and not sees and folder.is_dir()
    paths = [p.relative_to(folder).as_posix() for p in mf.list_files(folder)] if (main or uploads) else []
    held = dist.gather(paths)
    skip = set(held[0])
    for earlier in held[1 : dist.rank()]:
        skip.update(earlier)
    report = _upload_node(checkpoints, folder, name, skip) if uploads else {"files": []}
    if uploads and "files" in report:
        log.info("node files: %d files of checkpoint %s uploaded by this node", len(report["files"]), name)
    reports = dist.gather(report)
    if not main:
        if uploads:
            shutil.rmtree(folder, ignore_errors=True)
        return []
    failed = [f"rank {r}: {rep['error']}" for r, rep in enumerate(reports) if "error" in rep]
    if failed:
        raise RuntimeError(f"checkpoint {name}: a node's files were not uploaded ({'; '.join(failed)})")
    extra, seen = [], set()
    for rep in reports[1:]:
        for entry in rep["files"]:
            if entry["path"] not in seen:
                seen.add(entry["path"])
                extra.append(entry)
    return extra


def restore_node(
    checkpoints: CheckpointStore, dest_root: Path, name: str, manifest: dict, *, allowed: Optional[list] = None
) -> Path:
    """Checkpoint ``name`` into ``dest_root/name`` on this node: the manifest read again from storage and
    compared with rank 0's, every file fetched and verified, every pickle checked. Raises CorruptCheckpoint."""
    from orchestrator.checkpoint import safe_load

    ckpt = next((c for c in checkpoints.committed() if c.name == name), None)
    if ckpt is None:
        raise mf.CorruptCheckpoint(f"checkpoint {name} (rank 0 restored it) is not committed in storage")
    stored = mf.loads(checkpoints.store.get_bytes(ckpt.manifest_key))
    if stored.get("files") != manifest.get("files"):
        raise mf.CorruptCheckpoint(f"checkpoint {name}: the manifest differs from the one rank 0 verified")
    local = Path(dest_root) / name
    shutil.rmtree(local, ignore_errors=True)
    checkpoints.fetch(ckpt, stored, local)
    safe_load.check_restorable(local, stored, allowed=allowed)
    return local


def restore_on_every_node(
    checkpoints: CheckpointStore, dest_root: Path, restored: Optional[Path], manifest: Optional[dict], sees: bool
) -> Optional[Path]:
    """A collective after rank 0's restore: the local path of rank 0's checkpoint on this rank's node (the
    node's local rank 0 downloads it where this node does not see rank 0's folder)."""
    if restored is None or manifest is None:
        return None
    name = Path(restored).name
    local = Path(dest_root) / name
    error = None
    if not sees and local_main():
        try:
            restore_node(checkpoints, dest_root, name, manifest)
            log.info(
                "node files: checkpoint %s downloaded and verified on this node (%d files)",
                name,
                len(manifest["files"]),
            )
        except Exception as err:  # noqa: BLE001 - every rank must reach the gather
            error = f"{type(err).__name__}: {err}"
    errors = [f"rank {r}: {e}" for r, e in enumerate(dist.gather(error)) if e]
    if errors:
        raise mf.CorruptCheckpoint(f"checkpoint {name} could not be restored on every node ({'; '.join(errors)})")
    return Path(restored) if sees else local
