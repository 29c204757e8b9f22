"""Benchmark results in storage: ``<storage.uri>/<run>/bench/<task hash>-seed<seed>/<checkpoint>.json`` (a
checkpoint's, ``final.json`` for the final weights) and ``<storage.uri>/_bench/<key>/base.json`` (the base model's,
shared by every job of the storage: its key covers the model, the task set and the seed).

Each result records the hash of the checkpoint manifest it scored, the harness version, the task configuration's
hash and the seed, and the SHA-256 of all of it; with ``ORCH_MANIFEST_HMAC_KEY`` set it is signed as checkpoint
manifests are (``checkpoint.manifest.signed``). Storage is untrusted: a result is decoded once into a
``BenchResult`` (its signature when a key is set, its hash, every field's type, each score and per-item value a
finite number in [0, 1], each score the mean of its per-item values where it has them) and used only when all
four identities match what this evaluation would produce; otherwise it is reported (a warning naming the
object), ignored, and the checkpoint (or the base model) evaluated again: never a crash. The folder is outside
``checkpoints/``: a result outlives its checkpoint's retention.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from typing import Any, Optional, cast

from orchestrator.core import signing
from orchestrator.evaluation.stats import items_agree
from orchestrator.storage.base import finite_number

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


class BadResult(ValueError):
    """A stored result that is not sound: what is wrong, for the warning that names its object."""


def _fraction(value: Any, what: str, *, optional: bool = False) -> Optional[float]:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadResult(f"{what} is {str(value)[:40]!r}, not a finite number")
    if not 0.0 <= value <= 1.0:
        raise BadResult(f"{what} is {value!r}, outside [0, 1]")
    return float(value)


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadResult(f"{what} is {str(value)[:40]!r}, not a name")
    return value


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadResult(f"{what} is {str(value)[:40]!r}, not a count")
    return value


def _table(value: Any, what: str) -> dict:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in value.items()):
        raise BadResult(f"{what} is not a table of tasks and metrics")
    return value


def _scores(raw: Any) -> dict:
    out: dict = {}
    for task, metrics in _table(raw, "scores").items():
        for metric, score in metrics.items():
            if not isinstance(score, dict) or set(score) - {"value", "stderr"}:
                raise BadResult(f"score {task}/{metric} is not {{value, stderr}}")
            stderr = score.get("stderr")
            out.setdefault(task, {})[metric] = dict(
                {"value": _fraction(score.get("value"), f"score {task}/{metric}")},
                **({} if stderr is None else {"stderr": _fraction(stderr, f"the stderr of {task}/{metric}")}))
    return out


def _samples(raw: Any, scores: dict) -> dict:
    """Per-item values, each metric's the items its score is the mean of (recomputed here: else refused)."""
    out: dict = {}
    for task, metrics in _table(raw, "samples").items():
        for metric, items in metrics.items():
            if not isinstance(items, list) or not items:
                raise BadResult(f"the items of {task}/{metric} are not a list of values")
            values = [cast(float, _fraction(v, f"an item of {task}/{metric}")) for v in items]
            score = (scores.get(task) or {}).get(metric)
            if score is None:
                raise BadResult(f"it holds items of {task}/{metric} but no such score")
            if not items_agree(score["value"], values):
                raise BadResult(f"score {task}/{metric} {score['value']!r} is not the mean of its {len(values)} "
                                f"items ({sum(values) / len(values)!r})")
            out.setdefault(task, {})[metric] = values
    return out


@dataclass(frozen=True)
class BenchResult:
    """One stored benchmark result, decoded once (``decode``) and written once (``encode``): its digest, its
    signature (``ORCH_MANIFEST_HMAC_KEY``), every field's type, scores and items finite fractions, and each
    score the mean of its per-item values where it has them."""

    checkpoint: str
    step: int
    manifest_sha256: str
    harness_version: str
    task_hash: str
    seed: int
    scores: dict
    samples: dict
    seconds: float = 0.0
    cost_usd: Optional[float] = None

    def body(self) -> dict:
        return {"version": RESULT_VERSION, "checkpoint": self.checkpoint, "step": self.step,
                "manifest_sha256": self.manifest_sha256, "harness_version": self.harness_version,
                "task_hash": self.task_hash, "seed": self.seed, "scores": self.scores, "samples": self.samples,
                "seconds": self.seconds, "cost_usd": self.cost_usd}

    def record(self) -> dict:
        """The result as the rest of the package reads it (a dict of the fields, checked)."""
        return dict(self.body(), sha256=_digest(self.body()))

    def encode(self) -> bytes:
        return json.dumps(signing.signed(self.record()), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "BenchResult":
        """Raises BadResult naming what is wrong."""
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise BadResult("it is not JSON") from None
        if not isinstance(doc, dict) or doc.get("version") != RESULT_VERSION:
            raise BadResult("not a result this version writes")
        problem = signing.signature_problem(doc, "the result")  # over the record as stored, before anything else
        if problem:
            raise BadResult(problem)
        body = {k: v for k, v in doc.items() if k not in ("sha256", "signature")}
        if doc.get("sha256") != _digest(body):
            raise BadResult("its content does not match its hash (edited or corrupt)")
        scores = _scores(doc.get("scores"))
        seconds: Any = doc.get("seconds")
        cost: Any = doc.get("cost_usd")
        if not finite_number(seconds) or seconds < 0 or (cost is not None and (not finite_number(cost) or cost < 0)):
            raise BadResult("its seconds or cost_usd is not a finite non-negative number")
        return cls(checkpoint=_name(doc.get("checkpoint"), "checkpoint"), step=_count(doc.get("step"), "step"),
                   manifest_sha256=_name(doc.get("manifest_sha256"), "manifest_sha256"),
                   harness_version=_name(doc.get("harness_version"), "harness_version"),
                   task_hash=_name(doc.get("task_hash"), "task_hash"), seed=_count(doc.get("seed"), "seed"),
                   scores=scores, samples=_samples(doc.get("samples"), scores), seconds=float(seconds),
                   cost_usd=None if cost is None else float(cost))


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
        return cls(store, f"{run_name}/bench/{task_set.config_hash[:16]}-seed{int(seed)}", harness_version=task_set.harness_version,
                   task_hash=task_set.config_hash, seed=seed)

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}.json"

    def save(self, name: str, *, step: int, manifest_sha256: str, evaluation: Any,
             cost_usd: Optional[float] = None) -> dict:
        """``cost_usd``: the job's cost when the checkpoint was evaluated (logged beside its scores)."""
        result = BenchResult(checkpoint=name, step=int(step), manifest_sha256=manifest_sha256,
                             harness_version=self.identity["harness_version"], task_hash=self.identity["task_hash"],
                             seed=self.identity["seed"], scores=evaluation.scores,
                             samples=kept_samples(evaluation.scores, evaluation.samples),
                             seconds=round(float(evaluation.seconds), 3), cost_usd=cost_usd)
        self.store.put_bytes(self.key(name), result.encode())
        return result.record()

    def load(self, name: str, *, manifest_sha256: str) -> Optional[dict]:
        """The stored result of ``name`` if it is sound and scored exactly this manifest with this task set; else
        None (evaluated again), with a warning naming the object and what is wrong."""
        key = self.key(name)
        try:
            raw = self.store.get_bytes(key)
        except (FileNotFoundError, KeyError):
            return None
        try:
            result = BenchResult.decode(raw)
            problem = self._problem(result, manifest_sha256)
        except BadResult as err:
            problem = str(err)
        if problem:
            self.refused.append(f"{key}: {problem}")
            log.warning("benchmark result %s ignored (%s); it is evaluated again", key, problem)
            return None
        return result.record()

    def _problem(self, result: BenchResult, manifest_sha256: str) -> Optional[str]:
        if result.manifest_sha256 != manifest_sha256:
            return "it scored another checkpoint (its manifest hash differs)"
        for field_name, value in self.identity.items():
            if getattr(result, field_name) != value:
                return f"its {field_name} is {getattr(result, field_name)!r}, this evaluation's {value!r}"
        return None

    def names(self) -> list[str]:
        return sorted(k[len(self.prefix):-len(".json")] for k in self.store.list(self.prefix) if k.endswith(".json"))
