"""A sweep whose rungs are decided by a benchmark score (``sweep.metric=bench/<task>/<metric>``, the shipped
``tiny_arith_mc`` on the tiny model): each trial's value at a rung is the score stored for the checkpoint at the
rung's step (and, at the last rung, for the final weights), and the decisions are taken on those values."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import jobs

pytestmark = pytest.mark.e2e

SWEEP = [
    "sweep=asha", "sweep.name=bench", "sweep.n_trials=2", "sweep.max_parallel=2", "sweep.seed=3",
    "sweep.budget_usd=2", "sweep.min_fraction=0.34", "sweep.reduction_factor=3",
    "sweep.metric=bench/tiny_arith_mc/acc", "eval.tasks=[tiny_arith_mc]", "eval.limit=20",
    "train.learning_rate=tag(log, interval(1e-3,3e-2))", "train.max_steps=12", "train.logging_steps=4",
    "data.num_examples=100", "checkpoint.every=off", "checkpoint.every_steps=4", "preemption.provider=none",
    "tracking.enabled=false", "train.eval_at_end=false",
]


def scores_by_step(runs: Path, run: str) -> dict[int, float]:
    """The benchmark results the trial's job stored (``<run>/bench/<hash>/<checkpoint>.json``), by step."""
    out = {}
    for path in (runs / run / "bench").glob("*/*.json"):
        record = json.loads(path.read_text())
        if isinstance(record, dict) and "scores" in record:
            out[int(record["step"])] = record["scores"]["tiny_arith_mc"]["acc"]["value"]
    return out


def test_a_sweep_decides_its_rungs_by_the_benchmark_score_of_the_rungs_checkpoint(tmp_path):
    runs = tmp_path / "runs"
    env = jobs.job_env(tmp_path)
    done = jobs.run_job(SWEEP + [f"storage.uri={runs}", f"run.work_dir={tmp_path / 'work'}"], tmp_path, env=env,
                        timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((runs / "bench" / "sweep.json").read_text())
    assert doc["settings"]["metric"] == "bench/tiny_arith_mc/acc" and doc["settings"]["direction"] == "maximize"
    for trial in doc["trials"]:
        stored = scores_by_step(runs, trial["run_name"])
        assert trial["values"]["0"] == pytest.approx(stored[4]), (trial, stored)  # the step-4 checkpoint's score
        if "1" in trial["values"]:
            assert trial["values"]["1"] == pytest.approx(stored[12])  # the last rung: the final weights' score
    made = {(d["trial"], d["rung"]): d["value"] for d in doc["decisions"]}
    assert (0, 0) in made and (1, 0) in made
    assert made[(0, 0)] == doc["trials"][0]["values"]["0"]
    assert "leader: t" in done.stdout and "bench/tiny_arith_mc/acc=" in done.stdout
