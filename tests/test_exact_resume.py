"""Exact resume: a job SIGKILLed at random points and restarted ends with the same weights.

Each job runs as a user runs it (``python -m orchestrator.launch``), its worker
killed with SIGKILL three times at seeded random moments; the supervisor
requeues it, each attempt restores the newest committed checkpoint, and the
final weights must be byte-identical to an uninterrupted run with the same seed.
"""
from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest

from tests import jobs

SHM = Path("/dev/shm")

RECIPE_OVERRIDES = {
    # dropout on, gradient accumulation 2, short epochs so several epoch boundaries are crossed; enough steps
    # that the third kill (a random pause after the third fresh commit) lands before the job completes
    "sft": ["recipe=sft", "recipe.lora_dropout=0.1", "train.gradient_accumulation_steps=2", "data.num_examples=120",
            "train.max_steps=60"],
    "dpo": ["recipe=dpo", "recipe.lora_dropout=0.1", "train.gradient_accumulation_steps=2", "train.max_steps=40"],
    "qlora": ["recipe=qlora", "recipe.lora_dropout=0.1", "train.max_steps=40"],
}


def _storage(kind, tmp_path, request) -> jobs.Storage:
    if kind == "local":
        return jobs.Storage(str(tmp_path / "runs"))
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    return jobs.Storage(bucket, server.endpoint_url)


@pytest.mark.parametrize(
    "recipe,kind",
    [("sft", "local"), ("sft", "s3"), ("dpo", "s3"), ("qlora", "local")],
)
def test_sigkilled_three_times_ends_bit_identical(recipe, kind, tmp_path, request, references):
    storage = _storage(kind, tmp_path, request)
    common = jobs.FAST + RECIPE_OVERRIDES[recipe] + storage.overrides()

    run = f"chaos-{recipe}-{kind}"  # unique: another xdist worker may run a job beside this one
    rc, log, killed_at = jobs.interrupt_then_finish(common + [f"run.name={run}"], tmp_path, storage, run,
                                                    random.Random(f"{recipe}-{kind}"), [signal.SIGKILL] * 3)
    assert rc == 0, log[-4000:]
    assert "restoring checkpoint" in log
    if recipe in ("sft", "qlora"):  # a restart took the tokenised training set from storage (data.prepared_cache)
        assert "prepared training set from" in log

    ledger = jobs.ledger(storage, run)
    classes = [a["exit_class"] for a in ledger["attempts"]]
    assert classes == ["vanished", "vanished", "vanished", "completed"], (classes, killed_at)
    assert ledger["status"] == "completed"
    assert jobs.final_digest(storage, run) == references.digest(common), (
        f"resumed {recipe} weights differ from the uninterrupted run (kills after checkpoints at {killed_at})"
    )
    if SHM.is_dir():
        # the Trainer wrote its snapshots to memory, and no SIGKILLed attempt's folder was left there
        assert f"local checkpoint snapshots in {SHM}" in log
        assert not (SHM / "orchestrator" / run).exists() or not any((SHM / "orchestrator" / run).iterdir())
