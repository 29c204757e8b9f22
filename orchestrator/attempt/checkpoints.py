"""The attempt's checkpoint controller: where the Trainer's snapshots go, commit, restore, final weights.

It owns the attempt's local folders (work folder, snapshot root) and the
checkpoint store (background uploader, retention). The main rank commits and
restores; every rank calls the same methods, and the others only take part in
the collectives (barrier before a commit, the broadcast of the restored path).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional, cast

from orchestrator.checkpoint import pernode, safe_load, snapshot
from orchestrator.checkpoint.store import CheckpointStore, announce_restore, checkpoint_name
from orchestrator.core import ranks as dist
from orchestrator.core.errors import ConfigError, UserError

log = logging.getLogger(__name__)

SHARED_MARKER = ".every-rank-sees"


def every_rank_sees(folder: Path, main: bool) -> bool:
    """Whether every rank sees rank 0's ``folder`` (asked with a fresh nonce rank 0 writes there); True on one
    process. A collective: every rank calls it."""
    return all(ranks_seeing(folder, main))


def ranks_seeing(folder: Path, main: bool) -> list[bool]:
    """For each rank, whether it sees rank 0's ``folder`` (a collective; ``[True]`` on one process)."""
    if dist.world_size() <= 1:
        return [True]
    nonce = None
    if main:
        folder.mkdir(parents=True, exist_ok=True)
        nonce = uuid.uuid4().hex
        (folder / SHARED_MARKER).write_text(nonce)
    nonce = dist.broadcast(nonce)
    try:
        seen = (folder / SHARED_MARKER).read_text() == nonce
    except OSError:
        seen = False
    return dist.gather(seen)


def shared_snapshot_root(root: Path, work: Path, main: bool) -> Path:
    """``root``, or the (shared) ``work`` folder where not every rank sees ``root`` (memory of rank 0's node only)."""
    if root == work or every_rank_sees(root, main):
        return root
    log.warning("not every rank sees %s (nodes with memory of their own): snapshots in %s", root, work)
    if main:
        snapshot.release(root)
    return work


def best_step(folder: Path) -> Optional[int]:
    """The best evaluation's step recorded in a Trainer checkpoint's state (``checkpoint.final=best``), if any."""
    try:
        return json.loads((Path(folder) / "trainer_state.json").read_text()).get("best_global_step")
    except (OSError, ValueError):
        return None


class BackgroundRestore:
    """Rank 0's download and verification of the newest committed checkpoint, in a thread of its own so it
    overlaps the model's load; ``result()`` joins it and raises what it raised.

    ``deepspeed``: the run uses DeepSpeed, so its checkpoints hold DeepSpeed's classes. Their allow-list is
    resolved (DeepSpeed imported) by ``start``, in the caller's thread, not in this one: the model's load
    imports DeepSpeed meanwhile, and two threads importing it at once deadlock in the import system (one
    got a half-imported module, so a sound checkpoint was refused for it, or the other one crashed). A run
    without DeepSpeed never imports it, so the thread may (for a checkpoint a DeepSpeed run wrote).
    """

    def __init__(self, checkpoints: CheckpointStore, dest: Path, clock: Any = None, *, deepspeed: bool = False):
        self.checkpoints, self.dest, self.clock, self.deepspeed = checkpoints, dest, clock, deepspeed
        self._thread = threading.Thread(target=self._download, name="checkpoint-restore", daemon=True)
        self._outcome: tuple = (None, None, None)  # (folder, manifest, error)
        self._allowed: Optional[list] = None  # None: resolved by the check, for each checkpoint

    def start(self) -> "BackgroundRestore":
        if self.deepspeed:
            try:
                self._allowed = safe_load.allowed_globals(deepspeed=True)
            except ImportError:  # DeepSpeed missing: the Trainer says so (nothing imports it meanwhile)
                pass
        self._thread.start()
        return self

    def _download(self) -> None:
        started = time.monotonic()
        try:
            self._outcome = (*self.checkpoints.restore_latest(self.dest, allowed=self._allowed), None)
        except Exception as err:  # noqa: BLE001 - raised where the restore is joined
            self._outcome = (None, None, err)
        if self.clock is not None:
            self.clock.download_s = time.monotonic() - started

    def result(self) -> tuple[Optional[Path], Optional[dict]]:
        self._thread.join()
        folder, manifest, error = self._outcome
        if error is not None:
            raise error
        return folder, manifest


class CheckpointController:
    """Args:
    checkpoints: the job's checkpoint store (``<storage>/<run>/checkpoints/``).
    record: the attempt's ledger record (fencing, one ledger entry per commit).
    main: whether this rank commits and restores.
    work: this attempt's local folder (removed at the end).
    token: the attempt's token, shared by its ranks (names its snapshot root).
    snapshot_dir: ``checkpoint.snapshot_dir`` (auto | work | a path).
    full_model: a full fine-tune (snapshots hold the whole model and its optimizer state).
    meta: what every manifest records (trajectory, dataset fingerprint are filled in by ``set_dataset``).
    attempt_cost_usd: the attempt's cost so far, recorded with each commit (the ledger's heartbeat).
    clock: the attempt's restart clock (``orchestrator.attempt.restart.RestartClock``), or None.
    """

    def __init__(
        self,
        checkpoints: CheckpointStore,
        record: Any,
        *,
        main: bool,
        work: Path,
        token: str,
        snapshot_dir: str,
        full_model: bool,
        trajectory: dict,
        attempt_cost_usd: Callable[[], float],
        clock: Any = None,
    ):
        self.checkpoints, self.store, self.run_name = checkpoints, checkpoints.store, checkpoints.run_name
        self.record, self.main, self.work, self.token = record, main, work, token
        self.snapshot_dir, self.full_model, self.trajectory = snapshot_dir, full_model, trajectory
        self.dataset_fp, self.attempt_cost_usd = "", attempt_cost_usd
        self.snapshot_root = work  # moved to memory by use_snapshot_root() when there is room
        self.clock = clock
        self._prefetch: Optional[BackgroundRestore] = None  # the checkpoint's download, behind the model's load
        self.sees, self.shared = True, True  # this rank sees rank 0's work folder; every rank does (restore())
        self.snapshot_sees, self.snapshot_shared = True, True  # the same of the snapshot root (use_snapshot_root())
        if main:
            shutil.rmtree(work, ignore_errors=True)

    # ---- around the ledger's begin --------------------------------------------
    def newest_step(self) -> int:
        """The newest committed step, after aborting multipart uploads a killed attempt left open."""
        self.store.abort_incomplete_uploads(f"{self.run_name}/")
        return self.checkpoints.newest_step()

    def remove_uncommitted(self) -> None:
        """Once this attempt holds the fence, no live attempt is still uploading the manifest-less ones."""
        if self.main:
            self.checkpoints.remove_uncommitted()

    def set_dataset(self, fingerprint: str) -> None:
        """The dataset is read: its fingerprint goes into every manifest; the checkpoint's download starts
        (rank 0, in the background), so that it overlaps the model's load."""
        self.dataset_fp = fingerprint
        if self.clock is not None:
            self.clock.mark("data_read")
        if self.main and self._prefetch is None:
            self._prefetch = self._download()

    def _download(self) -> BackgroundRestore:
        deepspeed = self.trajectory.get("distributed.name") in ("zero2", "zero3")
        return BackgroundRestore(self.checkpoints, self.work / "restore", self.clock, deepspeed=deepspeed).start()

    @property
    def meta(self) -> dict:
        return {"trajectory": self.trajectory, "dataset_fingerprint": self.dataset_fp}

    # ---- restore ----------------------------------------------------------------
    def restore(self, check: Callable[[dict], None]) -> tuple[Optional[Path], Optional[dict]]:
        """Rank 0 joins the download ``set_dataset`` started (the newest usable checkpoint, verified) and asks
        ``check(manifest)`` whether it may resume from it; every rank gets its local path. Where not every rank
        sees rank 0's work folder (nodes with disks of their own), each such node downloads and verifies the same
        checkpoint into its own work folder (``orchestrator.checkpoint.pernode``), and each commit takes every
        node's files."""
        seeing = ranks_seeing(self.work, self.main)
        self.sees, self.shared = seeing[dist.rank() if len(seeing) > 1 else 0], all(seeing)
        if not self.shared and self.main:
            log.info("nodes with disks of their own: each node uploads and restores its own checkpoint files")
        restored, manifest = self._restore(check)
        if not self.shared:
            restored = pernode.restore_on_every_node(
                self.checkpoints, self.work / "restore", restored, manifest, self.sees
            )
        if self.clock is not None:
            self.clock.mark("restored")
        return restored, manifest

    def _restore(self, check: Callable[[dict], None]) -> tuple[Optional[Path], Optional[dict]]:
        if self.main:
            try:
                if self._prefetch is None:
                    self._prefetch = self._download()
                restored, manifest = self._prefetch.result()
                if manifest is not None:
                    check(manifest)
                    announce_restore(cast(Path, restored), manifest)  # a manifest: restored from a folder
            except UserError as err:
                dist.broadcast(("error", str(err)))
                raise
            dist.broadcast(("ok", (str(restored) if restored else None, manifest)))
            return restored, manifest
        status, payload = dist.broadcast(None)
        if status == "error":
            raise ConfigError(payload)
        path, manifest = payload
        return (Path(path) if path else None), manifest

    # ---- saving -----------------------------------------------------------------
    def use_snapshot_root(self, trainer) -> None:
        use_snapshot_root(self, trainer)

    def commit(self, folder: Path, step: int, *, wait: bool, seconds_left: Optional[float] = None) -> None:
        """Commit the Trainer's folder in the background (``wait``: before returning, for an emergency save)."""
        dist.barrier()  # every rank's files (RNG, optimizer shards) are written before rank 0 commits
        extra: list = []
        if not self.snapshot_shared:  # every node's files uploaded by the node, listed in rank 0's manifest
            name = checkpoint_name(step, self.record.fence) if self.main else None
            try:
                extra = pernode.share_node_files(self.checkpoints, folder, name, self.main, self.snapshot_sees)
            except RuntimeError as err:
                log.error("checkpoint at step %d NOT committed: %s", step, err)
                shutil.rmtree(folder, ignore_errors=True)
                return
        if not self.main:
            return
        meta = dict(self.meta, attempt_fence=self.record.fence, wall_time=time.time(), best_step=best_step(folder))
        started = time.monotonic()

        def on_committed(result, manifest):
            self.record.record_checkpoint(
                step, f"{self.run_name}/checkpoints/{result.name}", result.bytes, cost_usd=self.attempt_cost_usd()
            )

        self.checkpoints.commit_async(
            folder,
            step=step,
            fence=self.record.fence,
            meta=meta,
            may_commit=self.record.check_fence,
            on_committed=on_committed,
            extra_files=extra,
        )
        if wait:
            self.checkpoints.wait()
            took = time.monotonic() - started
            ok = self.checkpoints.results and self.checkpoints.results[-1].ok
            log.warning(
                "emergency checkpoint at step %d %s in %.2fs%s",
                step,
                "committed" if ok else "FAILED",
                took,
                "" if seconds_left is None else f" ({seconds_left:.1f}s before the deadline)",
            )

    def save_final(self, trainer, step: int, *, config_yaml: str, upload: bool, to_mlflow: Any = None) -> bool:
        """The trained weights, tokenizer and (redacted) config: under ``<run>/final/`` when ``upload``
        (``checkpoint.save_final_weights``), committed through the store's protocol (retried, manifest
        last) if this attempt still holds the job; as the MLflow run's logged model through ``to_mlflow``
        (``tracking.log_final_weights``). Returns whether ``<run>/final/`` was written."""
        if not (upload or to_mlflow is not None):
            return False
        final = self.work / "final"
        trainer.save_model(str(final))  # collective under ZeRO-3; the Trainer writes on rank 0
        dist.barrier()
        if not self.main:
            return upload
        trainer.processing_class.save_pretrained(str(final))
        (final / "config.yaml").write_text(config_yaml)
        self.record.check_fence()
        if upload:
            self.checkpoints.commit_folder(
                final, f"{self.run_name}/final/", step=step, fence=self.record.fence, meta=self.meta
            )
        if to_mlflow is not None:
            to_mlflow.log_final_model(final, adapter=not self.full_model, step=step)
        return upload

    def fetch_step(self, step: int) -> Optional[Path]:
        """The committed checkpoint of ``step``, downloaded and verified by rank 0 (None: there is none usable);
        every rank gets its local path."""
        path, manifest = None, None
        if self.main:
            local, manifest = self.checkpoints.restore_latest(self.work / "best", step=step)
            path = str(local) if local else None
        path, manifest = dist.broadcast((path, manifest))
        if path and not self.shared:
            return pernode.restore_on_every_node(self.checkpoints, self.work / "best", Path(path), manifest, self.sees)
        return Path(path) if path else None

    def ref_log_probs(self):
        """Where DPO's reference log-probs are kept across attempts (``recipe.precompute_ref_log_probs``)."""
        from orchestrator.checkpoint.ref_logps import RefLogProbStore

        return RefLogProbStore(
            self.checkpoints,
            work=self.work,
            main=self.main,
            trajectory=self.trajectory,
            fence=lambda: self.record.fence,
        )

    def reward_cache(self):
        """Where GRPO's rewards are kept across attempts (``recipe.reward_cache``)."""
        from orchestrator.checkpoint.reward_cache import RewardCache

        return RewardCache(self.checkpoints, work=self.work, main=self.main, fence=lambda: self.record.fence)

    def final_uri(self) -> str:
        return self.store.get_uri(f"{self.run_name}/final/")

    def upload_seconds(self) -> float:
        return sum(r.seconds for r in self.checkpoints.results)

    def uploading(self) -> bool:
        """A commit is queued or uploading in the background (what checkpoint.every=auto measures it by)."""
        return self.checkpoints.in_flight > 0

    def wait(self) -> None:
        self.checkpoints.wait()

    def close(self) -> None:
        """Stop the uploader; the main rank removes the attempt's local folders."""
        self.checkpoints.close()
        if self.main:
            shutil.rmtree(self.work, ignore_errors=True)
            if self.snapshot_root != self.work:
                snapshot.release(self.snapshot_root)


def use_snapshot_root(ctl: "CheckpointController", trainer) -> None:
    """Let the Trainer write its checkpoint folder (and the uploader stage it) in memory when there is room.

    The Trainer's save is the only part of a checkpoint training waits for;
    into ``/dev/shm`` it is serialisation into memory. Rank 0 decides, every
    rank of the attempt uses the same folder.
    """
    chosen: Any = (None, False)  # (the root, whether it is the work folder), then as rank 0 chose it
    if ctl.main:
        estimate = snapshot.estimate_snapshot_bytes(trainer.model, full_model=ctl.full_model)
        root, why = snapshot.choose_root(
            ctl.snapshot_dir, run_name=ctl.run_name, token=ctl.token, work=ctl.work, estimate_bytes=estimate
        )
        if root != ctl.work:
            snapshot.remove_orphans(root.parent)
            snapshot.claim(root)
        log.info("local checkpoint snapshots in %s (%s; about %.1f MB each)", root, why, estimate / 1e6)
        chosen = (str(root), root == ctl.work)
    # rank 0's choice of its work folder: each rank's own work folder (the path may differ between nodes)
    chosen, in_work = dist.broadcast(chosen)
    root = ctl.work if in_work else shared_snapshot_root(Path(chosen), ctl.work, ctl.main)
    ctl.snapshot_root = root
    seeing = ranks_seeing(root, ctl.main)  # the commit takes every node's files where a node has its own
    ctl.snapshot_sees, ctl.snapshot_shared = seeing[dist.rank() if len(seeing) > 1 else 0], all(seeing)
    trainer.args.output_dir = str(root / "trainer")
    ctl.checkpoints.staging_dir = root / "staging"
    ctl.checkpoints.staging_dir.mkdir(parents=True, exist_ok=True)
