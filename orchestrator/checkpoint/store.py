"""Commit checkpoints to object storage in the background; find, verify and restore the newest.

Commit protocol (after Composer's "pointer written last"):
1. the Trainer writes its checkpoint folder locally (the only part training waits for);
2. the folder is moved into a staging area the uploader owns;
3. a background thread hashes and uploads every data file (boto3's transfer
   manager goes multipart for large ones);
4. if this attempt still holds the job's fence, the manifest is written last:
   only then does the checkpoint exist;
5. retention deletes older checkpoints beyond ``keep_last``, manifest first, and
   never the newest committed one.
"""

from __future__ import annotations

import logging
import queue
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from orchestrator.checkpoint import manifest as mf
from orchestrator.storage.base import ObjectStore

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{9})-(\d{4})$")


def checkpoint_name(step: int, fence: int) -> str:
    return f"{step:09d}-{fence:04d}"


@dataclass(order=True)
class CommittedCheckpoint:
    step: int
    fence: int
    name: str = field(compare=False)
    manifest_key: str = field(compare=False)


@dataclass
class CommitResult:
    name: str
    step: int
    ok: bool
    seconds: float
    bytes: int = 0
    error: Optional[str] = None


UPLOADER_NICENESS = 10


def _lower_thread_priority() -> None:
    """Let the training threads win the CPU: hashing and copying can wait, the next step cannot.

    Linux gives each thread its own nice value; elsewhere this is a no-op.
    """
    import os

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), UPLOADER_NICENESS)
    except (AttributeError, OSError):
        pass


def announce_restore(local: Path, manifest: dict) -> None:
    log.info(
        "restoring checkpoint %s (step %d), all %d files verified",
        Path(local).name,
        manifest["step"],
        len(manifest["files"]),
    )


def retry_transient(fn, attempts: int = 4, first_delay_s: float = 0.5):
    """``fn()``, retried with exponential backoff while the store reports a transient error (not once a
    retrying store has given up on it: StorageUnavailable has waited its whole window already)."""
    from orchestrator.storage.base import TransientStorageError
    from orchestrator.storage.retry import StorageUnavailable

    for i in range(attempts):
        try:
            return fn()
        except TransientStorageError as err:
            if i == attempts - 1 or isinstance(err, StorageUnavailable):
                raise
            time.sleep(first_delay_s * 2**i)


def gated(barriers: list, may_commit: Callable[[], None]) -> Callable[[], None]:
    """``may_commit`` after every barrier returned, on the uploader's thread just before a checkpoint's manifest:
    GRPO's reward cache (``orchestrator.checkpoint.reward_cache``) stores the rewards computed before it."""

    def gate() -> None:
        for barrier in barriers:
            barrier()
        may_commit()

    return gate


class CheckpointStore:
    """One job's checkpoints under ``<run_name>/checkpoints/`` in ``store``."""

    def __init__(self, store: ObjectStore, run_name: str, *, keep_last: int = 3, staging_dir: Path):
        self.store = store
        self.run_name = run_name
        self.keep_last = keep_last
        self.prefix = f"{run_name}/checkpoints/"
        self.staging_dir = Path(staging_dir)
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        self._queue: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._pending = 0
        self._pending_lock = threading.Condition()
        self.results: list[CommitResult] = []
        self.barriers: list[Callable[[], object]] = []  # before each checkpoint's manifest (``gated``)

    # ---- listing -------------------------------------------------------------
    def committed(self) -> list[CommittedCheckpoint]:
        """Committed checkpoints (those with a manifest), oldest first."""
        found = []
        for key in self.store.list(self.prefix):
            rest = key[len(self.prefix) :]
            name, _, leaf = rest.partition("/")
            m = _NAME.match(name)
            if m and leaf == mf.MANIFEST_NAME:
                found.append(CommittedCheckpoint(int(m.group(1)), int(m.group(2)), name, key))
        return sorted(found)

    def uncommitted_names(self) -> list[str]:
        committed = {c.name for c in self.committed()}
        names = {key[len(self.prefix) :].partition("/")[0] for key in self.store.list(self.prefix)}
        return sorted(n for n in names if _NAME.match(n) and n not in committed)

    def newest_step(self) -> int:
        return next((c.step for c in reversed(self.committed())), 0)

    # ---- commit --------------------------------------------------------------
    def commit_async(
        self,
        local_folder: Path,
        *,
        step: int,
        fence: int,
        meta: dict,
        may_commit: Callable[[], None],
        on_committed: Callable[[CommitResult, dict], None],
        extra_files: Sequence[Any] = (),
    ) -> str:
        """Take ownership of ``local_folder`` and commit it in the background. ``may_commit`` is called just before
        the manifest is written and raises (e.g. Fenced) when this attempt may no longer commit; ``on_committed``
        runs after the manifest is written. ``extra_files``: manifest entries other nodes already uploaded
        under the checkpoint's prefix (``orchestrator.checkpoint.pernode``). Returns the checkpoint's name.
        """
        name = checkpoint_name(step, fence)
        staged = self.staging_dir / name
        if staged.exists():
            shutil.rmtree(staged)
        local_folder.rename(staged)  # instant, same filesystem: the Trainer can write its next one
        with self._pending_lock:
            self._pending += 1
        self._ensure_thread()
        self._queue.put((staged, name, step, fence, meta, may_commit, on_committed, list(extra_files)))
        return name

    @property
    def in_flight(self) -> int:
        """Commits queued or uploading (read without the lock: a hint for measurements, not for control)."""
        return self._pending

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until every queued commit finished; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._pending_lock:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._pending_lock.wait(left)
        return True

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="checkpoint-uploader", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        _lower_thread_priority()
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._commit(*job)
            finally:
                with self._pending_lock:
                    self._pending -= 1
                    self._pending_lock.notify_all()

    def _commit(
        self, staged: Path, name: str, step: int, fence: int, meta: dict, may_commit, on_committed, extra_files: list
    ) -> None:
        started = time.monotonic()
        key_prefix = f"{self.prefix}{name}/"
        try:
            manifest = self._upload(
                staged,
                key_prefix,
                step=step,
                fence=fence,
                meta=meta,
                may_commit=gated(self.barriers, may_commit),
                extra_files=extra_files,
            )
            result = CommitResult(name, step, True, time.monotonic() - started, manifest["total_bytes"])
            log.info(
                "checkpoint %s committed (step %d, %.1f MB, %.2fs)",
                name,
                step,
                manifest["total_bytes"] / 1e6,
                result.seconds,
            )
            self.results.append(result)
            on_committed(result, manifest)
            self.apply_retention(keep_step=meta.get("best_step"))
        except Exception as err:  # noqa: BLE001 - a failed upload must not kill training
            result = CommitResult(name, step, False, time.monotonic() - started, error=f"{type(err).__name__}: {err}")
            self.results.append(result)
            log.error("checkpoint %s NOT committed: %s; the previous checkpoint stays the newest", name, result.error)
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def _upload(
        self,
        folder: Path,
        key_prefix: str,
        *,
        step: int,
        fence: int,
        meta: dict,
        may_commit: Callable[[], None] = lambda: None,
        extra_files: Sequence[Any] = (),
    ) -> dict:
        """Hash and upload every file of ``folder`` under ``key_prefix``, then (if ``may_commit()`` does not
        raise) the manifest, last, listing ``extra_files`` (uploaded by other nodes) too: the one commit protocol.
        Returns the manifest."""
        manifest = mf.build_manifest(folder, run_name=self.run_name, step=step, fence=fence, meta=meta)
        for entry in manifest["files"]:
            retry_transient(lambda e=entry: self.store.upload_file(folder / e["path"], key_prefix + e["path"]))
        if extra_files:
            manifest["files"] += list(extra_files)
            manifest["total_bytes"] = sum(f["size"] for f in manifest["files"])
        may_commit()
        retry_transient(lambda: self.store.put_bytes(key_prefix + mf.MANIFEST_NAME, mf.dumps(manifest)))
        return manifest

    def commit_folder(self, folder: Path, key_prefix: str, *, step: int, fence: int, meta: dict) -> dict:
        """Commit ``folder`` under ``key_prefix`` now (the final weights): an older manifest there is removed
        first, so a half-replaced folder never looks complete. Raises on failure."""
        self.store.delete(key_prefix + mf.MANIFEST_NAME)
        return self._upload(folder, key_prefix, step=step, fence=fence, meta=meta)

    # ---- retention -----------------------------------------------------------
    def apply_retention(self, keep_step: Optional[int] = None) -> list[str]:
        """Delete committed checkpoints beyond ``keep_last`` (manifest first, so a half-deleted one never looks valid).

        ``keep_step``: the best evaluation's step (``checkpoint.final=best``), whose checkpoint is kept too.
        """
        committed = self.committed()
        doomed = [c for c in committed[: max(0, len(committed) - self.keep_last)] if c.step != keep_step]
        for ckpt in doomed:
            self.store.delete(ckpt.manifest_key)
            self.store.delete_prefix(f"{self.prefix}{ckpt.name}/")
            log.info("retention: deleted checkpoint %s (keep_last=%d)", ckpt.name, self.keep_last)
        return [c.name for c in doomed]

    def remove_uncommitted(self) -> list[str]:
        """Delete data of checkpoints whose manifest never landed (an attempt killed mid-upload). Called at the
        start of an attempt, after it took the job's fence, so no live attempt is still uploading them."""
        names = self.uncommitted_names()
        for name in names:
            self.store.delete_prefix(f"{self.prefix}{name}/")
            log.warning(
                "checkpoint %s has no manifest (an upload was interrupted); its partial files were removed", name
            )
        return names

    # ---- restore -------------------------------------------------------------
    def restore_latest(
        self, dest_root: Path, *, step: Optional[int] = None, allowed: Optional[list] = None
    ) -> tuple[Optional[Path], Optional[dict]]:
        """Download and verify the newest committed checkpoint (``step``: of that step), falling back to older ones.

        Every manifest path is checked before any download, every file's size and SHA-256 before anything
        is deserialised, every pickle loaded once with ``weights_only=True`` and the allow-list of
        :mod:`orchestrator.checkpoint.safe_load`; a checkpoint failing any is reported, the previous one tried.
        The caller checks that the job may resume from it and announces the restore (``announce_restore``).
        ``allowed``: the allow-list already resolved (``safe_load.check_restorable``: a caller in a thread).
        Returns (local folder, manifest) or (None, None) when there is none.
        """
        from orchestrator.checkpoint import safe_load

        committed = [c for c in self.committed() if step is None or c.step == step]
        for ckpt in reversed(committed):
            local = Path(dest_root) / ckpt.name
            shutil.rmtree(local, ignore_errors=True)
            try:
                # 1. the manifest, every listed path checked before anything is downloaded
                manifest = mf.loads(self.store.get_bytes(ckpt.manifest_key))
                # 2. the files, each into its checked place inside ``local``, 3. their sizes and hashes
                self.fetch(ckpt, manifest, local)
                # 4. every pickle through the allow-list, without running it
                safe_load.check_restorable(local, manifest, allowed=allowed)
            except (mf.CorruptCheckpoint, FileNotFoundError, ValueError) as err:
                log.warning("checkpoint %s is unusable (%s); trying the previous one", ckpt.name, err)
                shutil.rmtree(local, ignore_errors=True)
                continue
            return local, manifest
        if committed and step is None:
            log.warning("none of the %d committed checkpoints is usable; training starts from scratch", len(committed))
        return None, None

    def fetch(self, ckpt: CommittedCheckpoint, manifest: dict, local: Path) -> None:
        """``ckpt``'s files into ``local``, verified (``manifest.fetch_folder``: paths, sizes, hashes)."""
        mf.fetch_folder(self.store, f"{self.prefix}{ckpt.name}/", manifest, local)
