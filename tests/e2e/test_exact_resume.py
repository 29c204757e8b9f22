"""Exact resume: a job SIGKILLed at random points and restarted ends with the same weights.

Each job runs as a user runs it (``python -m orchestrator.launch``), its worker
killed with SIGKILL three times at seeded random moments; the supervisor
requeues it, each attempt restores the newest committed checkpoint, and the
final weights must be byte-identical to an uninterrupted run with the same seed.
"""
from __future__ import annotations

import json
import random
import re
import signal
from pathlib import Path

import pytest

from tests.helpers import jobs

SHM = Path("/dev/shm")

RECIPE_OVERRIDES = {
    # early stopping that triggers after the resumes: evaluations every 5 steps, none after the first counts as
    # better (no accuracy beats its best by more than 1.0), so the ninth (step 45 of 60) stops the job -- if the
    # counter, in each checkpoint, comes back at every resume: a forgotten one would stop later, a double-counted
    # one earlier. final/ is the best evaluation's checkpoint, kept by retention against keep_last=3
    "sft_early_stop": ["recipe=sft", "recipe.lora_dropout=0.1", "train.gradient_accumulation_steps=2",
                       "data.num_examples=120", "train.max_steps=60", "train.eval_steps=5",
                       "train.early_stopping_patience=8", "train.early_stopping_threshold=1.0", "checkpoint.final=best"],
    # the reference log-probs computed once, by the first attempt, stored, and loaded by every restart
    "dpo": ["recipe=dpo", "recipe.lora_dropout=0.1", "train.gradient_accumulation_steps=2", "train.max_steps=40",
            "recipe.precompute_ref_log_probs=true"],
    # bf16 autocast on CPU, the 4-bit base dequantising to bf16 (what a GPU QLoRA run computes in)
    "qlora": ["recipe=qlora", "recipe.lora_dropout=0.1", "train.max_steps=40", "train.mixed_precision=bf16"],
    # TRL's bfd packing (padding-free rows), bitsandbytes' 8-bit AdamW on a full fine-tune (LoRA's tensors are
    # under bitsandbytes' 4096-element floor, where it keeps 32-bit states), a data-loader worker process, held-out evaluations every 10 steps
    "sft-packed": ["recipe=sft", "recipe.peft=full", "train.packing=true", "train.optim=adamw_bnb_8bit",
                   "train.dataloader_num_workers=1", "train.eval_steps=10"],
}


def _storage(kind, tmp_path, request) -> jobs.Storage:
    if kind == "local":
        return jobs.Storage(str(tmp_path / "runs"))
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    return jobs.Storage(bucket, server.endpoint_url)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "recipe,kind",
    # sft-packed runs on S3 in place of a plain SFT S3 case, the early-stopping SFT case in place of the plain local
    # one: plain SFT's path is inside both, and the suite pays no more SIGKILL x3 jobs than before
    [("sft_early_stop", "local"), ("sft-packed", "s3"), ("dpo", "s3"), ("qlora", "local")],
)
def test_sigkilled_three_times_ends_bit_identical(recipe, kind, tmp_path, request, references):
    storage = _storage(kind, tmp_path, request)
    common = jobs.FAST + RECIPE_OVERRIDES[recipe] + storage.overrides()

    run = f"chaos-{recipe.replace('_', '-')}-{kind}"  # unique: another xdist worker may run a job beside this one
    rc, log, killed_at = jobs.interrupt_then_finish(common + [f"run.name={run}"], tmp_path, storage, run,
                                                    random.Random(f"{recipe}-{kind}"), [signal.SIGKILL] * 3)
    assert rc == 0, log[-4000:]
    assert "restoring checkpoint" in log
    if recipe in ("sft-packed", "qlora"):  # a restart took the tokenised training set from storage (data.prepared_cache)
        assert "prepared training set from" in log

    ledger = jobs.ledger(storage, run)
    classes = [a["exit_class"] for a in ledger["attempts"]]
    assert classes == ["vanished", "vanished", "vanished", "completed"], (classes, killed_at)
    assert ledger["status"] == "completed"
    assert jobs.final_digest(storage, run) == references.digest(common), (
        f"resumed {recipe} weights differ from the uninterrupted run (kills after checkpoints at {killed_at})"
    )
    if recipe == "dpo":  # TRL ran the reference over the training pairs once; each restart read them from storage
        assert log.count("reference log-probs of the train split computed") == 1, log[-4000:]
        assert log.count("reference log-probs of the train split loaded from storage") == 3, log[-4000:]
    if recipe == "sft_early_stop":
        assert ledger["step"] == 45 and "has not improved" in ledger["quality"]["stopped_early"], ledger
        assert "stopped early:" in log, log[-4000:]
        # the best evaluation's checkpoint: one retention kept beside the keep_last=3 newest (about one a second),
        # or, should the last evaluation be the best, the weights training ended with
        best = re.search(r"final weights: the best checkpoint \(step (\d+),", log)
        assert (best and int(best.group(1)) < 45) or "the last step 45 is the best evaluation" in log, log[-4000:]
        final = json.loads(storage.store().get_bytes(f"{run}/final/manifest.json"))
        assert final["step"] == (int(best.group(1)) if best else 45)  # the step whose weights final/ holds
    if SHM.is_dir():
        # the Trainer wrote its snapshots to memory, and no SIGKILLed attempt's folder was left there
        assert f"local checkpoint snapshots in {SHM}" in log
        assert not (SHM / "orchestrator" / run).exists() or not any((SHM / "orchestrator" / run).iterdir())
