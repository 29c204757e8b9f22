"""Where the Trainer writes its local checkpoint snapshot: memory when there is room.

The Trainer's synchronous save is the only part of a checkpoint that training
waits for; the hashing and upload run in the background from the same folder.
Writing that folder to a RAM-backed file system (``/dev/shm``) instead of disk
turns the save into serialisation into memory, with no file-system journal and
no writeback in the way. ``checkpoint.snapshot_dir``:

* ``auto`` (default): ``/dev/shm`` when it and the machine's available memory
  hold three snapshots (one being written, one queued, one uploading), else the
  attempt's work folder on disk; the choice and its reason are logged;
* ``work``: always the work folder (``run.work_dir``);
* any other value: that folder.

A killed attempt cannot clean up after itself, so every snapshot root records
its owner's pid and the next attempt on the machine removes roots whose owner
is gone: memory is never leaked across attempts.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

SHM = Path("/dev/shm")
SNAPSHOTS_IN_FLIGHT = 3  # one being written, one queued, one uploading
MEMORY_RESERVE_BYTES = 2 << 30  # leave this much of the machine's memory to training
OWNER_FILE = "owner.pid"


def estimate_snapshot_bytes(model, *, full_model: bool) -> int:
    """A checkpoint's size: the saved weights plus Adam's two fp32 moments per trainable parameter."""
    saved = trainable = 0
    for param in model.parameters():
        if param.requires_grad:
            trainable += param.numel()
            saved += param.numel() * param.element_size()
        elif full_model:
            saved += param.numel() * param.element_size()
    return saved + trainable * 8


def _available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def choose_root(
    setting: str, *, run_name: str, token: str, work: Path, estimate_bytes: int, shm: Path = SHM
) -> tuple[Path, str]:
    """(snapshot root, why) for this attempt."""
    if setting == "work":
        return work, "checkpoint.snapshot_dir=work"
    if setting != "auto":
        return Path(setting).expanduser().resolve() / run_name / token, f"checkpoint.snapshot_dir={setting}"
    need = SNAPSHOTS_IN_FLIGHT * estimate_bytes
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        return work, f"{shm} is not available"
    free = shutil.disk_usage(shm).free
    available = _available_memory_bytes()
    if free < need:
        return work, f"{shm} has {free / 2**20:.0f} MiB free, {need / 2**20:.0f} MiB wanted"
    if available is not None and available < need + MEMORY_RESERVE_BYTES:
        return work, (
            f"the machine has {available / 2**20:.0f} MiB available, "
            f"{(need + MEMORY_RESERVE_BYTES) / 2**20:.0f} MiB wanted"
        )
    return shm / "orchestrator" / run_name / token, f"{shm} holds {SNAPSHOTS_IN_FLIGHT} snapshots"


def claim(root: Path) -> None:
    """Create ``root`` and record this process as its owner."""
    root.mkdir(parents=True, exist_ok=True)
    (root / OWNER_FILE).write_text(str(os.getpid()))


def release(root: Path) -> None:
    """Remove this attempt's snapshot root, and the job's folder above it once empty."""
    shutil.rmtree(root, ignore_errors=True)
    try:
        root.parent.rmdir()
    except OSError:
        pass  # another attempt's root is still there


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphans(parent: Path) -> list[Path]:
    """Remove snapshot roots under ``parent`` whose owner process is gone (a killed attempt's)."""
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for root in parent.iterdir():
        owner = root / OWNER_FILE
        try:
            pid = int(owner.read_text().strip())
        except (OSError, ValueError):
            continue  # not ours, or being created right now
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(root, ignore_errors=True)
            removed.append(root)
            log.info("removed the local snapshot folder %s of a finished attempt (pid %d)", root, pid)
    return removed
