"""GRPO's reward cache: every reward computed, by (reward function, prompt id, completion hash), beside the checkpoints.

Rewards may be expensive or side-effecting (a sandbox, a judge). A resumed attempt regenerates the
completions of the generation batch it was killed in (the same completions: the RNG comes back with
the checkpoint), and without a cache would score them again. Here each batch of new rewards is
committed as one shard under ``<run>/reward_cache/<shard>/`` with the checkpoints' protocol (the
file, then the manifest last), by a writer thread beside training, and every attempt loads all
shards first. A checkpoint's manifest is written only after every shard queued before it
(``flush``, a barrier of the checkpoint store's uploader): resuming from a checkpoint finds every
reward computed before it. A machine that vanishes while a shard is still being written loses that
shard: its batch is regenerated on resume (it comes after the newest checkpoint) and scored again.

Storage is untrusted: a shard's manifest must be this job's and name this shard, its one file must
match the manifest's size and SHA-256 before it is parsed (JSON, never a pickle), and it decodes into
``orchestrator.records.reward_record.RewardShard``: every entry three hex ids and a finite number of magnitude at
most ``REWARD_BOUND`` (1e6: a reward is a score of one completion, and GRPO squares rewards in the advantages'
standard deviation, so 1e300 trains on inf). A shard that fails any check is reported and skipped: its rewards are
computed again, nothing else is lost. A reward function's own value beyond the bound (or not finite) is never kept
in the cache.
"""

from __future__ import annotations

import json
import logging
import shutil
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path
from typing import Any, Optional

from orchestrator.checkpoint import manifest as mf
from orchestrator.records.fields import CorruptRecord
from orchestrator.records.reward_record import FILE, KIND, REWARD_BOUND, RewardShard, RewardShardManifest, cacheable

log = logging.getLogger(__name__)
__all__ = ["FILE", "REWARD_BOUND", "RewardCache", "cacheable", "parse_entries"]


def _as_float(value: Any) -> Optional[float]:
    """A reward function's value (a float, NumPy's or a 0-d tensor's) as the cache keeps it; None if it keeps none."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if cacheable(number) else None


class RewardCache:
    """Args:
    checkpoints: the job's ``CheckpointStore`` (its commit protocol; ``.store`` to read).
    work: a local scratch folder of this attempt.
    main: whether this rank writes shards (the others keep theirs in memory).
    fence: the attempt's fence (a callable: known after the ledger's begin), in each shard's name.
    """

    def __init__(self, checkpoints: Any, *, work: Path, main: bool, fence=lambda: 0):
        self.checkpoints, self.store = checkpoints, checkpoints.store
        self.prefix = f"{checkpoints.run_name}/reward_cache/"
        self.work, self.main, self.fence = Path(work), main, fence
        self.values: dict[tuple[str, str, str], float] = {}
        self.written = 0
        self.loaded = False
        # normal priority, unlike the checkpoint uploader: a shard is milliseconds of work, and until it is
        # stored a vanished machine loses those rewards (the resume scores them again)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="reward-cache")
        if main:  # each checkpoint's manifest waits for the shards queued before it
            checkpoints.barriers.append(self.flush)

    def get(self, func: str, key: tuple[str, str]) -> Optional[float]:
        if not self.loaded:
            self.load()
        return self.values.get((func, *key))

    def put(self, func: str, values: dict) -> None:
        """Keep ``values`` ({(prompt id, completion hash): reward}) and queue them as one shard (``flush`` waits)."""
        fresh = {
            (func, *key): number for key, number in ((k, _as_float(v)) for k, v in values.items()) if number is not None
        }  # None/NaN/beyond the bound: not a result to keep
        self.values.update(fresh)
        if fresh and self.main:
            fence = int(self.fence())
            name = f"{fence:05d}-{self.written:06d}"
            self.written += 1
            self._writer.submit(self._commit, name, fence, fresh)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every shard queued so far is committed (or failed and reported); False on timeout.

        The writer is one thread taking shards in order, so a marker queued now runs after all of them."""
        try:
            self._writer.submit(lambda: None).result(timeout)
        except FuturesTimeout:
            return False
        except RuntimeError:  # closed: nothing is pending
            pass
        return True

    def close(self) -> None:
        self._writer.shutdown(wait=True)

    def _commit(self, name: str, fence: int, fresh: dict) -> None:
        folder = self.work / "reward_cache_out" / name
        shutil.rmtree(folder, ignore_errors=True)
        try:
            folder.mkdir(parents=True)
            (folder / FILE).write_text(json.dumps(RewardShard(fresh).encode()))
            self.checkpoints.commit_folder(
                folder, f"{self.prefix}{name}/", step=0, fence=fence, meta={"kind": KIND, "shard": name}
            )
        except Exception as err:  # noqa: BLE001 - training goes on; a resumed attempt scores these again
            log.warning(
                "could not store %d rewards (%s: %s); a resumed attempt will compute them again",
                len(fresh),
                type(err).__name__,
                err,
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def load(self) -> int:
        """Read every committed shard (verified); returns how many rewards came back."""
        self.loaded = True
        shards = sorted(
            {
                k[len(self.prefix) :].split("/", 1)[0]
                for k in self.store.list(self.prefix)
                if k.endswith("/" + mf.MANIFEST_NAME)
            }
        )
        before = len(self.values)
        for name in shards:
            try:
                self.values.update(self._read(name))
            except (CorruptRecord, mf.CorruptCheckpoint, FileNotFoundError, ValueError, OSError) as err:
                log.warning("reward cache shard %s is unusable (%s); its rewards will be computed again", name, err)
        if shards:
            log.info("reward cache: %d rewards from %d shards in storage", len(self.values) - before, len(shards))
        self.written = max(self.written, sum(1 for s in shards if s.startswith(f"{int(self.fence()):05d}-")))
        return len(self.values) - before

    def _read(self, name: str) -> dict:
        local = self.work / "reward_cache_in" / name
        shutil.rmtree(local, ignore_errors=True)
        where = self.store.get_uri(f"{self.prefix}{name}/")
        try:
            manifest = mf.loads(self.store.get_bytes(f"{self.prefix}{name}/{mf.MANIFEST_NAME}"))
            RewardShardManifest.decode(manifest, where).check(self.checkpoints.run_name, name, where)
            self.store.download_file(f"{self.prefix}{name}/{FILE}", mf.safe_join(local, FILE))
            mf.verify_folder(local, manifest)
            return dict(RewardShard.decode(json.loads((local / FILE).read_text()), where + FILE).rewards)
        finally:
            shutil.rmtree(local, ignore_errors=True)


def parse_entries(body: Any, where: str = FILE) -> dict:
    """``{"entries": [[func, prompt id, completion hash, reward], ...]}``, decoded (``RewardShard``); CorruptRecord
    naming ``where`` and the entry otherwise."""
    return dict(RewardShard.decode(body, where).rewards)
