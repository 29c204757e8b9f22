"""recipe=grpo resumes exactly: SIGKILLs inside a generation batch and between its two iterations.

TRL's GRPOTrainer trains ``steps_per_generation x num_iterations`` micro-steps on one generation
batch it keeps in memory only. Checkpoints every 3 steps with a batch every 4 micro-steps fall at
each position in it (after 3 of 4 parts, after the first iteration, after 1, at a boundary). The job
is killed five times; its final weights and optimizer state must be byte-identical to an uninterrupted
run's, and its reward function (which logs every call) called for exactly the same (prompt, completion)
pairs.
"""
from __future__ import annotations

import json
import random
import signal

import pytest

from tests.helpers import jobs

GRPO = ["recipe=grpo", "recipe.reward_funcs=[tests.helpers.grpo_rewards:logged_exact_answer,recipes.rewards:answer_format]",
        "recipe.num_generations=4", "recipe.steps_per_generation=2", "recipe.num_iterations=2",
        "recipe.max_completion_length=3", "train.per_device_batch_size=4", "train.max_steps=30",
        "train.logging_steps=5", "data.num_examples=100", "checkpoint.every=0", "checkpoint.every_steps=3",
        "preemption.provider=none", "tracking.enabled=false", "requeue.backoff_base_seconds=0.2"]


def _reward_curve(storage, run: str) -> list:
    """(step, mean reward, per-function means) at every logging step, from the newest checkpoint's Trainer state."""
    newest = max(jobs.committed_steps(storage, run))
    store = storage.store()
    name = next(k for k in store.list(f"{run}/checkpoints/") if k.endswith("trainer_state.json")
                and f"/{newest:09d}-" in k)
    history = json.loads(store.get_bytes(name))["log_history"]
    return [(h["step"], h.get("reward"), h.get("rewards/logged_exact_answer/mean")) for h in history if "loss" in h]


def _newest_file(storage, run: str, name: str) -> bytes:
    """``name`` from the run's newest committed checkpoint."""
    newest = max(jobs.committed_steps(storage, run))
    store = storage.store()
    return store.get_bytes(next(k for k in store.list(f"{run}/checkpoints/") if k.endswith("/" + name)
                                and f"/{newest:09d}-" in k))


def _calls(path) -> list:
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.e2e
def test_grpo_sigkilled_five_times_ends_bit_identical_with_no_reward_called_twice(tmp_path):
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    ref_dir.mkdir()
    run_dir.mkdir()
    storage = jobs.Storage(str(tmp_path / "runs"))
    ref_log, run_log = ref_dir / "rewards.jsonl", run_dir / "rewards.jsonl"
    done = jobs.run_job(GRPO + storage.overrides() + ["run.name=grpo-ref"], ref_dir,
                        env=jobs.job_env(ref_dir, {"ORCH_TEST_REWARD_LOG": str(ref_log), "ORCH_STEP_DELAY_SECONDS": "0"}))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reference = _calls(ref_log)
    assert reference and len(set(reference)) == len(reference)  # the cache: no pair scored twice in one run

    env = jobs.job_env(run_dir, {"ORCH_TEST_REWARD_LOG": str(run_log), "ORCH_STEP_DELAY_SECONDS": "0.3"})
    rc, log, killed_at = jobs.interrupt_then_finish(GRPO + storage.overrides() + ["run.name=grpo-chaos"], run_dir,
                                                    storage, "grpo-chaos", random.Random("grpo"),
                                                    [signal.SIGKILL] * 5, env=env)
    assert rc == 0, log[-4000:]
    assert jobs.attempt_classes(storage, "grpo-chaos") == ["vanished"] * 5 + ["completed"]
    assert jobs.final_digest(storage, "grpo-chaos") == jobs.final_digest(storage, "grpo-ref"), (
        f"resumed GRPO weights differ from the uninterrupted run (kills after checkpoints at {killed_at})")
    assert max(jobs.committed_steps(storage, "grpo-chaos")) == max(jobs.committed_steps(storage, "grpo-ref")) == 30
    assert _newest_file(storage, "grpo-chaos", "optimizer.pt") == _newest_file(storage, "grpo-ref", "optimizer.pt")
    assert _calls(run_log) == reference, f"reward calls differ from the uninterrupted run's (kills after {killed_at})"
    # TRL's reward metrics gathered since the last log come back too: the logged curve is the uninterrupted one
    assert _reward_curve(storage, "grpo-chaos") == _reward_curve(storage, "grpo-ref"), killed_at
    assert "resumed inside a generation batch" in log, (killed_at, log[-3000:])


@pytest.mark.e2e
def test_grpo_full_fine_tune_trains_and_writes_full_weights(tmp_path):
    storage = jobs.Storage(str(tmp_path / "runs"))
    done = jobs.run_job(["recipe=grpo", "recipe.peft=full", "recipe.max_completion_length=3", "train.max_steps=4",
                         "train.logging_steps=2", "data.num_examples=60", "preemption.provider=none",
                         "tracking.enabled=false", "run.name=grpo-full", *storage.overrides()], tmp_path,
                        env=jobs.job_env(tmp_path, {"ORCH_STEP_DELAY_SECONDS": "0"}))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = [f["path"] for f in json.loads(storage.store().get_bytes("grpo-full/final/manifest.json"))["files"]]
    assert "model.safetensors" in files and "adapter_model.safetensors" not in files, files
    assert "rewards/exact_answer/mean" in done.stdout + done.stderr  # TRL's per-function reward metrics
