"""Benchmark results in storage: ``<storage.uri>/<run>/bench/<task hash>-seed<seed>/<checkpoint>.json`` (a
checkpoint's, ``final.json`` for the final weights) and ``<storage.uri>/_bench/<key>/base.json`` (the base model's,
shared by every job of the storage: its key covers the model, the task set and the seed).

Each result records the hash of the checkpoint manifest it scored, the harness version, the task configuration's
hash and the seed, and the SHA-256 of all of it; with ``ORCH_MANIFEST_HMAC_KEY`` set it is signed as checkpoint
manifests are (``core.signing``). Storage is untrusted: a result is decoded once, in the records floor, into a
``BenchResult`` (``orchestrator.records.bench_result``: its signature when a key is set, its hash, every field's
type, each score and per-item value a finite number in [0, 1], each score the mean of its per-item values where
it has them) and used only when all four identities match what this evaluation would produce; otherwise it is
reported (a warning naming the object), ignored, and the checkpoint (or the base model) evaluated again: never a
crash. Its readers use its attributes. The folder is outside ``checkpoints/``: a result outlives its
checkpoint's retention.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Optional

from orchestrator.records.bench_result import BenchResult, items_agree
from orchestrator.records.fields import CorruptRecord

log = logging.getLogger(__name__)


def manifest_hash(store: Any, key: str) -> Optional[str]:
    """SHA-256 of the manifest as stored at ``key`` (None: there is none)."""
    try:
        return hashlib.sha256(store.get_bytes(key)).hexdigest()
    except (FileNotFoundError, KeyError):
        return None


def kept_samples(scores: dict, samples: dict) -> dict:
    """The per-item values of the metrics whose score is their mean (an evaluation's, before it is stored): the
    others' (a metric aggregated otherwise) are no evidence of that score and pair with nothing."""
    out: dict = {}
    for task, metrics in (samples or {}).items():
        for metric, items in metrics.items():
            value = ((scores.get(task) or {}).get(metric) or {}).get("value")
            if items_agree(value, items):
                out.setdefault(task, {})[metric] = list(items)
    return out


class ResultStore:
    """The results of one task set (``identity``: harness version, task hash, seed) under ``prefix``."""

    def __init__(self, store: Any, prefix: str, *, harness_version: str, task_hash: str, seed: int):
        self.store = store
        self.prefix = prefix.rstrip("/") + "/"
        self.identity: dict[str, Any] = {"harness_version": harness_version, "task_hash": task_hash, "seed": int(seed)}
        self.refused: list[str] = []  # what was found and not trusted, for the report

    @classmethod
    def for_run(cls, store: Any, run_name: str, task_set: Any, seed: int) -> "ResultStore":
        """A job's results of one task set and seed: an evaluation with another ``eval.seed`` (``orchestrator eval``)
        is stored beside the training's, never over them."""
        return cls(
            store,
            f"{run_name}/bench/{task_set.config_hash[:16]}-seed{int(seed)}",
            harness_version=task_set.harness_version,
            task_hash=task_set.config_hash,
            seed=seed,
        )

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}.json"

    def save(
        self, name: str, *, step: int, manifest_sha256: str, evaluation: Any, cost_usd: Optional[float] = None
    ) -> BenchResult:
        """``cost_usd``: the job's cost when the checkpoint was evaluated (logged beside its scores)."""
        result = BenchResult.of(
            checkpoint=name,
            step=int(step),
            manifest_sha256=manifest_sha256,
            **self.identity,
            scores=evaluation.scores,
            samples=kept_samples(evaluation.scores, evaluation.samples),
            seconds=round(float(evaluation.seconds), 3),
            cost_usd=cost_usd,
        )
        self.store.put_bytes(self.key(name), result.encode())
        return result

    def load(self, name: str, *, manifest_sha256: str) -> Optional[BenchResult]:
        """The stored result of ``name`` if it is sound and scored exactly this manifest with this task set; else
        None (evaluated again), with a warning naming the object and what is wrong."""
        key = self.key(name)
        try:
            raw = self.store.get_bytes(key)
        except (FileNotFoundError, KeyError):
            return None
        try:
            result = BenchResult.decode(raw, self.store.get_uri(key))
            problem = self._problem(result, manifest_sha256)
        except CorruptRecord as err:
            problem = err.problem
        if problem:
            self.refused.append(f"{key}: {problem}")
            log.warning("benchmark result %s ignored (%s); it is evaluated again", key, problem)
            return None
        return result

    def _problem(self, result: BenchResult, manifest_sha256: str) -> Optional[str]:
        if result.manifest_sha256 != manifest_sha256:
            return "it scored another checkpoint (its manifest hash differs)"
        for field_name, value in self.identity.items():
            if getattr(result, field_name) != value:
                return f"its {field_name} is {getattr(result, field_name)!r}, this evaluation's {value!r}"
        return None

    def names(self) -> list[str]:
        return sorted(k[len(self.prefix) : -len(".json")] for k in self.store.list(self.prefix) if k.endswith(".json"))
