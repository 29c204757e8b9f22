"""Benchmark results in storage: ``<storage.uri>/<run>/bench/<task hash>/<checkpoint>.json`` (a checkpoint's,
``final.json`` for the final weights) and ``<storage.uri>/_bench/<key>/base.json`` (the base model's, shared by
every job of the storage).

Each result records the hash of the checkpoint manifest it scored, the harness version, the task configuration's
hash and the seed, and the SHA-256 of all of it. Storage is untrusted: a result is used only when its own hash,
its numbers (finite) and all four match what
this evaluation would produce; otherwise it is reported, ignored, and the checkpoint evaluated again. The
folder is outside ``checkpoints/``: a result outlives its checkpoint's retention.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from typing import Any, Optional

log = logging.getLogger(__name__)

RESULT_VERSION = 1


def manifest_hash(store: Any, key: str) -> Optional[str]:
    """SHA-256 of the manifest as stored at ``key`` (None: there is none)."""
    try:
        return hashlib.sha256(store.get_bytes(key)).hexdigest()
    except (FileNotFoundError, KeyError):
        return None


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _finite_numbers(node: Any) -> bool:
    if isinstance(node, dict):
        return all(_finite_numbers(v) for v in node.values())
    if isinstance(node, list):
        return all(_finite_numbers(v) for v in node)
    if isinstance(node, bool) or node is None or isinstance(node, str):
        return True
    return isinstance(node, (int, float)) and math.isfinite(node)


class ResultStore:
    """The results of one task set (``identity``: harness version, task hash, seed) under ``prefix``."""

    def __init__(self, store: Any, prefix: str, *, harness_version: str, task_hash: str, seed: int):
        self.store = store
        self.prefix = prefix.rstrip("/") + "/"
        self.identity = {"harness_version": harness_version, "task_hash": task_hash, "seed": int(seed)}
        self.refused: list[str] = []  # what was found and not trusted, for the report

    @classmethod
    def for_run(cls, store: Any, run_name: str, task_set: Any, seed: int) -> "ResultStore":
        return cls(store, f"{run_name}/bench/{task_set.config_hash[:16]}", harness_version=task_set.harness_version,
                   task_hash=task_set.config_hash, seed=seed)

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}.json"

    def save(self, name: str, *, step: int, manifest_sha256: str, evaluation: Any,
             cost_usd: Optional[float] = None) -> dict:
        """``cost_usd``: the job's cost when the checkpoint was evaluated (logged beside its scores)."""
        body = {"version": RESULT_VERSION, "checkpoint": name, "step": int(step), "manifest_sha256": manifest_sha256,
                **self.identity, "scores": evaluation.scores, "samples": evaluation.samples,
                "seconds": round(float(evaluation.seconds), 3), "cost_usd": cost_usd}
        record = dict(body, sha256=_digest(body))
        self.store.put_bytes(self.key(name), json.dumps(record, sort_keys=True).encode())
        return record

    def load(self, name: str, *, manifest_sha256: str) -> Optional[dict]:
        """The stored result of ``name`` if it is sound and scored exactly this manifest with this task set."""
        key = self.key(name)
        try:
            raw = self.store.get_bytes(key)
        except (FileNotFoundError, KeyError):
            return None
        problem = None
        try:
            record = json.loads(raw)
        except ValueError:
            record, problem = None, "it is not JSON"
        if problem is None:
            problem = self._problem(record, manifest_sha256)
        if problem:
            self.refused.append(f"{key}: {problem}")
            log.warning("benchmark result %s ignored (%s); the checkpoint is evaluated again", key, problem)
            return None
        return record

    def _problem(self, record: Any, manifest_sha256: str) -> Optional[str]:
        if not isinstance(record, dict) or record.get("version") != RESULT_VERSION:
            return "not a result this version writes"
        body = {k: v for k, v in record.items() if k != "sha256"}
        if record.get("sha256") != _digest(body):
            return "its content does not match its hash (edited or corrupt)"
        if not _finite_numbers(record.get("scores")) or not _finite_numbers(record.get("samples")):
            return "a score is not a finite number"
        if not isinstance(record.get("scores"), dict) or not isinstance(record.get("samples"), dict):
            return "no scores"
        if record.get("manifest_sha256") != manifest_sha256:
            return "it scored another checkpoint (its manifest hash differs)"
        for field, value in self.identity.items():
            if record.get(field) != value:
                return f"its {field} is {record.get(field)!r}, this evaluation's {value!r}"
        return None

    def names(self) -> list[str]:
        return sorted(k[len(self.prefix):-len(".json")] for k in self.store.list(self.prefix) if k.endswith(".json"))
