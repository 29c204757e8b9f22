"""A folder on a local or shared filesystem as an object store.

Every write lands in a temporary file in the destination folder, is fsynced,
then renamed over the key with ``os.replace``: a reader sees the old object or
the new one, never half of either. Conditional writes hold an ``fcntl`` lock
file beside the key, so they are safe between processes on one host (and on
network filesystems whose locks work, such as NFSv4).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

from orchestrator.storage.base import ObjectStore, PreconditionFailed

# Names this store keeps beside the keys; they are never listed as keys.
_TMP_PREFIX = ".orch-tmp-"
_LOCK_PREFIX = ".orch-lock-"
# A temporary file untouched this long belongs to a killed writer.
STALE_TEMP_SECONDS = 3600.0


# Lock files this process has open. flock belongs to the open file, not to the process: a process forked while
# one is held (a DataLoader worker forked by the training loop while the checkpoint thread commits to the ledger)
# held the lock for its whole life, and the attempt's next heartbeat waited for it forever. A forked child closes
# its copies at once, so the lock ends when its holder releases it; the guard keeps a fork out of the moment
# between opening a lock file and recording it.
_held_locks: set[int] = set()
_fork_guard = threading.Lock()


def _close_inherited_locks() -> None:
    global _fork_guard
    _fork_guard = threading.Lock()
    for fd in _held_locks:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held_locks.clear()


os.register_at_fork(
    before=lambda: _fork_guard.acquire(),
    after_in_parent=lambda: _fork_guard.release(),
    after_in_child=_close_inherited_locks,
)


def _version_of(data: bytes) -> str:
    # The content hash is the version token: two writes of identical bytes
    # share a token, which is harmless for a compare-and-swap on content.
    return hashlib.sha256(data).hexdigest()


class LocalStore(ObjectStore):
    """An object store rooted at a folder. ``uri`` is the folder's absolute path."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)

    def __repr__(self) -> str:
        return f"LocalStore({self.uri!r})"

    # -- paths -------------------------------------------------------------
    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(
                f"invalid storage key {key!r}: use a relative path like 'run/ledger.json' without '.', '..' or empty parts"
            )
        if any(p.startswith((_TMP_PREFIX, _LOCK_PREFIX)) for p in parts):
            raise ValueError(
                f"invalid storage key {key!r}: names starting with {_TMP_PREFIX!r} or {_LOCK_PREFIX!r} are reserved"
            )
        return self.root.joinpath(*parts)

    @contextlib.contextmanager
    def _temp_beside(self, path: Path) -> Iterator[Path]:
        """A temporary file in ``path``'s folder, removed unless the caller renamed it away."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{_TMP_PREFIX}{path.name}-")
        os.close(fd)
        try:
            yield Path(tmp)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    @staticmethod
    def _write_synced(tmp: Path, data: bytes) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    @staticmethod
    def _fsync_dir(folder: Path) -> None:
        # Makes the rename itself durable; some filesystems refuse to open folders.
        with contextlib.suppress(OSError):
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = path.parent / f"{_LOCK_PREFIX}{path.name}"
        with _fork_guard:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            _held_locks.add(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            with _fork_guard:
                _held_locks.discard(fd)
                os.close(fd)  # closing releases the lock

    # -- ObjectStore -------------------------------------------------------
    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        with self._temp_beside(path) as tmp:
            self._write_synced(tmp, data)
            os.replace(tmp, path)
        self._fsync_dir(path.parent)

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise FileNotFoundError(f"no object {key!r} in {self.uri}") from None

    def upload_file(self, local_path: str | Path, key: str) -> None:
        path = self._path(key)
        with self._temp_beside(path) as tmp:
            shutil.copyfile(local_path, tmp)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        self._fsync_dir(path.parent)

    def download_file(self, key: str, local_path: str | Path) -> None:
        src = self._path(key)
        if not src.is_file():
            raise FileNotFoundError(f"no object {key!r} in {self.uri}")
        dest = Path(local_path)
        with self._temp_beside(dest) as tmp:
            try:
                shutil.copyfile(src, tmp)
            except FileNotFoundError:  # deleted between the check and the copy
                raise FileNotFoundError(f"no object {key!r} in {self.uri}") from None
            os.replace(tmp, dest)

    def _walk(self, prefix: str) -> Iterator[tuple[str, Path]]:
        """(relative name, path) of every file whose relative name starts with ``prefix``."""
        # Like S3, a prefix is a string prefix of keys, not only a folder:
        # walk from the deepest folder the prefix names, then filter.
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root.joinpath(*folder.split("/")) if folder else self.root
        if not start.is_dir():
            return
        for dirpath, _, filenames in os.walk(start):
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                if rel.startswith(prefix) or name.startswith(_TMP_PREFIX):
                    yield rel, Path(dirpath) / name

    def list(self, prefix: str = "") -> list[str]:
        return sorted(
            rel
            for rel, path in self._walk(prefix)
            if not path.name.startswith((_TMP_PREFIX, _LOCK_PREFIX)) and rel.startswith(prefix)
        )

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(f"no object {key!r} in {self.uri}")
        return path.stat().st_size

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(key))

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        data = self.get_bytes(key)
        return data, _version_of(data)

    def put_if(self, key: str, data: bytes, *, if_version: str | None) -> str:
        path = self._path(key)
        with self._temp_beside(path) as tmp:
            self._write_synced(tmp, data)
            with self._locked(path):
                if if_version is None:
                    self._create_exclusive(tmp, path, key)
                else:
                    try:
                        current = _version_of(path.read_bytes())
                    except FileNotFoundError:
                        raise PreconditionFailed(f"{key!r} in {self.uri} no longer exists") from None
                    if current != if_version:
                        raise PreconditionFailed(f"{key!r} in {self.uri} changed since it was read")
                    os.replace(tmp, path)
        self._fsync_dir(path.parent)
        return _version_of(data)

    def _create_exclusive(self, tmp: Path, path: Path, key: str) -> None:
        # A hard link publishes the complete file and fails if the name exists,
        # atomically and even against writers that ignore the lock.
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise PreconditionFailed(f"{key!r} already exists in {self.uri}") from None
        except OSError as err:
            if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            # No hard links on this filesystem: the lock we hold keeps this exclusive.
            if path.exists():
                raise PreconditionFailed(f"{key!r} already exists in {self.uri}") from None
            os.replace(tmp, path)

    def abort_incomplete_uploads(self, prefix: str = "") -> int:
        """Remove temporary files left by killed writers (untouched for STALE_TEMP_SECONDS)
        in the folders under ``prefix``; returns how many."""
        cutoff = time.time() - STALE_TEMP_SECONDS
        removed = 0
        for _, path in self._walk(prefix):
            if not path.name.startswith(_TMP_PREFIX):
                continue
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
        return removed
