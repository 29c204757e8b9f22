"""A stored benchmark result (``<run>/bench/<task hash>-seed<seed>/<checkpoint>.json``, ``_bench/<key>/base.json``)
as its readers see it: one decode into types, with types, finiteness and bounds checked (issue 41).

``orchestrator.evaluation.results`` stores and finds them (``ResultStore``); every reader (the job's points and
chart, the benchmark selection, the gains over the base, a sweep's rung) reads a ``BenchResult``'s attributes.

``BenchResult.decode`` checks, in this order: JSON; the version; the signature (with ``ORCH_MANIFEST_HMAC_KEY`` set:
``orchestrator.core.signing``, over the record as stored); the SHA-256 of the body; every field's type; each score,
standard error and per-item value a finite number in [0, 1]; each score the mean of its per-item values where it has
them (recomputed: ``items_agree``). Anything else is one ``CorruptRecord`` naming the object and what is wrong: the
result store then ignores it, with a warning, and evaluates that checkpoint (or the base model) again.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from orchestrator.core import signing
from orchestrator.records.fields import MAX_STEPS, MAX_USD, CorruptRecord

RESULT_VERSION = 1
ITEMS_TOLERANCE = 1e-6  # a score and the mean of its per-item values: the same number up to float rounding
MAX_SECONDS = 1e9


def items_agree(value: Any, items: Any) -> bool:
    """Whether ``value`` is the mean of ``items`` (the harness's per-item values of an accuracy-like metric):
    per-item values that are not those the score was computed from are not paired with anything."""
    if not items or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(sum(float(v) for v in items) / len(items) - float(value)) <= ITEMS_TOLERANCE


def digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Score:
    value: float
    stderr: Optional[float] = None

    def encode(self) -> dict[str, float]:
        return {"value": self.value} if self.stderr is None else {"value": self.value, "stderr": self.stderr}


class _Reader:
    """The checks of one result's fields; errors are CorruptRecord naming ``where``."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, problem: str) -> CorruptRecord:
        return CorruptRecord(self.where, problem)

    def fraction(self, value: Any, what: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(f"{what} is {str(value)[:40]!r}, not a finite number")
        if not 0.0 <= value <= 1.0:
            raise self.fail(f"{what} is {value!r}, outside [0, 1]")
        return float(value)

    def name(self, value: Any, what: str) -> str:
        if not isinstance(value, str) or not value or len(value) > 512:
            raise self.fail(f"{what} is {str(value)[:40]!r}, not a name")
        return value

    def count(self, value: Any, what: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEPS:
            raise self.fail(f"{what} is {str(value)[:40]!r}, not a count")
        return value

    def table(self, value: Any, what: str) -> Mapping[str, Mapping[str, Any]]:
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in value.items()):
            raise self.fail(f"{what} is not a table of tasks and metrics")
        return value

    def scores(self, raw: Any) -> dict[str, dict[str, Score]]:
        out: dict[str, dict[str, Score]] = {}
        for task, metrics in self.table(raw, "scores").items():
            for metric, score in metrics.items():
                if not isinstance(score, dict) or set(score) - {"value", "stderr"}:
                    raise self.fail(f"score {task}/{metric} is not {{value, stderr}}")
                stderr = score.get("stderr")
                out.setdefault(task, {})[metric] = Score(
                    self.fraction(score.get("value"), f"score {task}/{metric}"),
                    None if stderr is None else self.fraction(stderr, f"the stderr of {task}/{metric}"),
                )
        return out

    def samples(self, raw: Any, scores: Mapping[str, Mapping[str, Score]]) -> dict[str, dict[str, tuple[float, ...]]]:
        """Per-item values, each metric's the items its score is the mean of (recomputed here: else refused)."""
        out: dict[str, dict[str, tuple[float, ...]]] = {}
        for task, metrics in self.table(raw, "samples").items():
            for metric, items in metrics.items():
                if not isinstance(items, list) or not items:
                    raise self.fail(f"the items of {task}/{metric} are not a list of values")
                values = tuple(self.fraction(v, f"an item of {task}/{metric}") for v in items)
                score = scores.get(task, {}).get(metric)
                if score is None:
                    raise self.fail(f"it holds items of {task}/{metric} but no such score")
                if not items_agree(score.value, values):
                    raise self.fail(
                        f"score {task}/{metric} {score.value!r} is not the mean of its {len(values)} "
                        f"items ({sum(values) / len(values)!r})"
                    )
                out.setdefault(task, {})[metric] = values
        return out

    def amount(self, value: Any, high: float) -> bool:
        return (
            not isinstance(value, bool)
            and isinstance(value, (int, float))
            and math.isfinite(value)
            and 0 <= value <= high
        )


@dataclass(frozen=True)
class BenchResult:
    """One stored benchmark result, decoded once (``decode``) and written once (``encode``)."""

    checkpoint: str
    step: int
    manifest_sha256: str
    harness_version: str
    task_hash: str
    seed: int
    scores: Mapping[str, Mapping[str, Score]]  # task -> metric -> its score
    samples: Mapping[str, Mapping[str, tuple[float, ...]]]  # task -> metric -> per-item values (mean = score)
    seconds: float = 0.0
    cost_usd: Optional[float] = None  # the job's cost when the checkpoint was evaluated

    @classmethod
    def of(
        cls,
        *,
        scores: Mapping[str, Mapping[str, Mapping[str, Any]]],
        samples: Mapping[str, Mapping[str, Iterable[float]]],
        **fields: Any,
    ) -> "BenchResult":
        """A result from an evaluation's tables (``{task: {metric: {"value", "stderr"}}}``, per-item lists)."""
        return cls(
            scores={
                t: {
                    m: Score(float(s["value"]), None if s.get("stderr") is None else float(s["stderr"]))
                    for m, s in ms.items()
                }
                for t, ms in scores.items()
            },
            samples={t: {m: tuple(float(v) for v in items) for m, items in ms.items()} for t, ms in samples.items()},
            **fields,
        )

    def score(self, task: str, metric: str) -> Optional[Score]:
        return self.scores.get(task, {}).get(metric)

    def items(self, task: str, metric: str) -> Optional[tuple[float, ...]]:
        return self.samples.get(task, {}).get(metric)

    @property
    def identity(self) -> dict[str, Any]:
        """Which items it scored: harness version, task configuration hash, seed."""
        return {"harness_version": self.harness_version, "task_hash": self.task_hash, "seed": self.seed}

    def samples_table(self) -> dict[str, dict[str, list[float]]]:
        return {t: {m: list(items) for m, items in ms.items()} for t, ms in self.samples.items()}

    def body(self) -> dict[str, Any]:
        return {
            "version": RESULT_VERSION,
            "checkpoint": self.checkpoint,
            "step": self.step,
            "manifest_sha256": self.manifest_sha256,
            "harness_version": self.harness_version,
            "task_hash": self.task_hash,
            "seed": self.seed,
            "scores": {t: {m: s.encode() for m, s in ms.items()} for t, ms in self.scores.items()},
            "samples": self.samples_table(),
            "seconds": self.seconds,
            "cost_usd": self.cost_usd,
        }

    def encode(self) -> bytes:
        """The result as stored: its body, the body's SHA-256, and its signature when a key is set."""
        body = self.body()
        return json.dumps(signing.signed(dict(body, sha256=digest(body))), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes, where: str) -> "BenchResult":
        """The stored bytes into types; CorruptRecord naming ``where`` and what is wrong."""
        read = _Reader(where)
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise read.fail("it is not JSON") from None
        if not isinstance(doc, dict) or doc.get("version") != RESULT_VERSION:
            raise read.fail("not a result this version writes")
        problem = signing.signature_problem(doc, "the result")  # over the record as stored, before anything else
        if problem:
            raise read.fail(problem)
        if doc.get("sha256") != digest({k: v for k, v in doc.items() if k not in ("sha256", "signature")}):
            raise read.fail("its content does not match its hash (edited or corrupt)")
        scores = read.scores(doc.get("scores"))
        seconds: Any = doc.get("seconds")
        cost: Any = doc.get("cost_usd")
        if not read.amount(seconds, MAX_SECONDS) or (cost is not None and not read.amount(cost, MAX_USD)):
            raise read.fail(f"its seconds or cost_usd is not a finite non-negative number (cost at most ${MAX_USD:g})")
        return cls(
            checkpoint=read.name(doc.get("checkpoint"), "checkpoint"),
            step=read.count(doc.get("step"), "step"),
            manifest_sha256=read.name(doc.get("manifest_sha256"), "manifest_sha256"),
            harness_version=read.name(doc.get("harness_version"), "harness_version"),
            task_hash=read.name(doc.get("task_hash"), "task_hash"),
            seed=read.count(doc.get("seed"), "seed"),
            scores=scores,
            samples=read.samples(doc.get("samples"), scores),
            seconds=float(seconds),
            cost_usd=None if cost is None else float(cost),
        )
