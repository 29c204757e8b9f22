"""Benchmark results as the result store gives them (``orchestrator.records.bench_result.BenchResult``), built from
the tables an evaluation produces."""
from __future__ import annotations

from typing import Any, Optional

from orchestrator.records.bench_result import BenchResult

IDENTITY = {"harness_version": "0.4.9", "task_hash": "ab12", "seed": 1234}


def result(step: int = 0, *, scores: dict, samples: Optional[dict] = None, checkpoint: Optional[str] = None,
           cost_usd: Optional[float] = None, **identity: Any) -> BenchResult:
    fields = dict(IDENTITY, **identity)
    return BenchResult.of(checkpoint=checkpoint or f"{step:09d}-0001", step=step, manifest_sha256="m",
                          scores=scores, samples=samples or {}, cost_usd=cost_usd, **fields)
