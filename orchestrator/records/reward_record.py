"""GRPO's reward cache as stored: each shard's manifest and its ``rewards.json``, decoded once into types.

A shard (``orchestrator.checkpoint.reward_cache``) is ``<run>/reward_cache/<shard>/`` committed with the
checkpoints' protocol: ``rewards.json`` (``{"entries": [[function, prompt id, completion hash, reward], ...]}``)
and its manifest, whose ``meta`` says which shard it is (``{"kind": "grpo_reward_cache", "shard": name}``). Both
are read from storage, so both are untrusted: ``RewardShardManifest.decode`` and ``RewardShard.decode`` check every
field (ids of 32 hex digits, a reward a finite number of magnitude at most ``REWARD_BOUND``: 1e300 is corrupt, as
GRPO squares rewards and trains on inf) and raise ``CorruptRecord`` naming the shard and the entry. The cache skips
that one shard (its rewards are computed again); the other shards go on serving.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from orchestrator.records.fields import MAX_TEXT, CorruptRecord, Fields

REWARD_BOUND = 1e6  # the largest magnitude of a cached reward (docs/grpo.md)
KIND = "grpo_reward_cache"  # a shard manifest's meta.kind
FILE = "rewards.json"  # a shard's one file
_ID = re.compile(r"[0-9a-f]{32}")
MAX_FUNCTION = MAX_TEXT  # a reward function's name (a dotted import path), at most this long

Key = tuple[str, str, str]  # (reward function, prompt id, completion hash)


def cacheable(value: Any) -> bool:
    """A reward the cache keeps and serves: a finite number (not a bool) of magnitude at most REWARD_BOUND."""
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and abs(value) <= REWARD_BOUND
    )


@dataclass(frozen=True)
class RewardShardManifest:
    """What a shard's manifest says of it: whose job, which shard, which files."""

    run_name: str
    shard: str
    files: tuple[str, ...]

    @classmethod
    def decode(cls, doc: Any, where: str) -> "RewardShardManifest":
        f = Fields(doc, where)
        meta = Fields(f.mapping("meta"), f"{where} meta")
        return cls(
            run_name=f.text("run_name", "?"),
            shard=meta.text("shard", "?"),
            files=tuple(entry.text("path") for entry in f.objects("files")),
        )

    def check(self, run_name: str, shard: str, where: str) -> None:
        """CorruptRecord unless it is shard ``shard`` of job ``run_name`` and lists only ``rewards.json``."""
        if (self.run_name, self.shard) != (run_name, shard):
            raise CorruptRecord(where, f"its manifest is that of job {self.run_name!r}, shard {self.shard!r}")
        if self.files != (FILE,):
            raise CorruptRecord(where, f"it lists {list(self.files)}, not [{FILE!r}]")


def _entry(entry: Any, n: int, where: str) -> tuple[Key, float]:
    if not (
        isinstance(entry, list)
        and len(entry) == 4
        and isinstance(entry[0], str)
        and len(entry[0]) <= MAX_FUNCTION
        and all(isinstance(x, str) and _ID.fullmatch(x) for x in entry[1:3])
    ):
        raise CorruptRecord(
            where, f"entry {n} {str(entry)[:80]!r} is not [function, prompt id, completion hash, reward]"
        )
    value = entry[3]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CorruptRecord(where, f"entry {n}: reward {value!r} is not a finite number")
    if not cacheable(value):
        raise CorruptRecord(
            where, f"entry {n}: reward {value!r} is beyond +-{REWARD_BOUND:g} (reward_record.REWARD_BOUND)"
        )
    return (entry[0], entry[1], entry[2]), float(value)


@dataclass(frozen=True)
class RewardShard:
    """One shard's rewards: (reward function, prompt id, completion hash) -> reward."""

    rewards: Mapping[Key, float]

    @classmethod
    def decode(cls, doc: Any, where: str) -> "RewardShard":
        """``doc`` (the parsed rewards.json) into types; CorruptRecord naming ``where`` and the entry."""
        if not isinstance(doc, Mapping) or not isinstance(doc.get("entries"), list):
            raise CorruptRecord(where, "it holds no list of entries")
        return cls(rewards=dict(_entry(entry, n, where) for n, entry in enumerate(doc["entries"])))

    def encode(self) -> dict[str, Any]:
        return {"entries": [[*key, value] for key, value in self.rewards.items()]}
