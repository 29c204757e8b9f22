"""recipe=grpo resumes exactly: SIGKILLs inside a generation batch and between its two iterations.

TRL's GRPOTrainer trains ``steps_per_generation x num_iterations`` micro-steps on one generation
batch it keeps in memory only. Checkpoints every 3 steps with a batch every 4 micro-steps fall at
each position in it (after 3 of 4 parts, after the first iteration, after 1, at a boundary). The job
is killed five times; its final weights and optimizer state must be byte-identical to an uninterrupted
run's, the prompts of every generation batch the same at the same step, the per-step reward curve in
MLflow the same point for point, and its reward function (which logs every call) called for exactly
the same (prompt, completion) pairs -- but for the rewards a kill caught before their shard was stored
(the reward cache writes beside training), which the resumed attempt scores once more.
"""
from __future__ import annotations

import json
import random
import signal
import uuid

import pytest

from tests.helpers import jobs

REWARD = "tests.helpers.grpo_rewards:logged_exact_answer"
GRPO = ["recipe=grpo", f"recipe.reward_funcs=[{REWARD},recipes.rewards:answer_format,"
        "tests.helpers.grpo_rewards:logged_prompts]",
        "recipe.num_generations=4", "recipe.steps_per_generation=2", "recipe.num_iterations=2",
        "recipe.max_completion_length=3", "train.per_device_batch_size=4", "train.max_steps=30",
        "train.logging_steps=5", "data.num_examples=100", "checkpoint.every=0", "checkpoint.every_steps=3",
        "preemption.provider=none", "requeue.backoff_base_seconds=0.2"]
CURVES = ("reward", f"rewards/{REWARD.split(':')[1]}/mean", "rewards/answer_format/mean")


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


def _stored_rewards(storage, run: str, tmp_path) -> set:
    """The reward-cache keys committed in storage now (verified as an attempt reads them)."""
    from orchestrator.checkpoint.reward_cache import RewardCache
    from orchestrator.checkpoint.store import CheckpointStore

    scratch = tmp_path / f"peek-{uuid.uuid4().hex[:6]}"
    cache = RewardCache(CheckpointStore(storage.store(), run, staging_dir=scratch / "s"), work=scratch, main=False)
    cache.load()
    cache.close()
    return set(cache.values)


def _cache_key(call) -> tuple:
    from recipes.rewards import completion_hash, row_id

    prompt, completion, answer = call
    return (REWARD, row_id(prompt, {"answer": answer}), completion_hash(completion))


def _kill_five_times(overrides, run_dir, storage, run, env) -> tuple:
    """SIGKILL the worker five times (each after a fresh commit); after each kill, the reward calls logged so far
    and the rewards stored. Returns (exit code, log, steps seen, [(calls logged, stored keys)])."""
    rng, seen, at_kill = random.Random("grpo"), [], []
    proc = jobs.start_job(overrides, run_dir, env=env)
    try:
        for _ in range(5):
            seen.append(jobs.interrupt_worker(proc, storage, run, rng, signal.SIGKILL))
            at_kill.append((len(_calls(run_dir / "rewards.jsonl")), _stored_rewards(storage, run, run_dir)))
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    return rc, jobs.log_text(run_dir), seen, at_kill


def _lost_to_kills(calls: list, at_kill: list) -> set:
    """Indices of the calls whose reward was not yet stored when a kill came (a resume scores those again)."""
    lost: set = set()
    for logged, stored in at_kill:
        lost |= {i for i in range(logged) if _cache_key(calls[i]) not in stored}
    return lost


def _prompts_by_step(path) -> dict:
    """{step: prompt ids} of every generation batch; a batch regenerated after a kill must be the same batch."""
    out: dict = {}
    for line in path.read_text().splitlines():
        step, ids = json.loads(line)
        assert out.setdefault(step, ids) == ids, f"the batch generated at step {step} differs on regeneration"
    return out


def _mlflow_curves(client, experiment: str, run: str) -> dict:
    exp = client.get_experiment_by_name(experiment)
    (mlrun,) = client.search_runs([exp.experiment_id], filter_string=f"tags.job = '{run}'")
    return {key: [(m.step, m.value) for m in sorted(client.get_metric_history(mlrun.info.run_id, key),
                                                     key=lambda m: (m.step, m.timestamp))] for key in CURVES}


@pytest.mark.e2e
@pytest.mark.mlflow
def test_grpo_sigkilled_five_times_ends_bit_identical_with_no_reward_called_twice(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    ref_dir.mkdir()
    run_dir.mkdir()
    storage = jobs.Storage(str(tmp_path / "runs"))
    experiment = f"grpo-{uuid.uuid4().hex[:8]}"
    tracking = ["tracking.enabled=true", f"tracking.uri={mlflow_server.uri}", f"tracking.experiment={experiment}"]
    overrides = GRPO + tracking + storage.overrides()

    def env(folder, delay):
        out = jobs.job_env(folder, {"ORCH_TEST_REWARD_LOG": str(folder / "rewards.jsonl"),
                                    "ORCH_TEST_PROMPT_LOG": str(folder / "prompts.jsonl"),
                                    "ORCH_STEP_DELAY_SECONDS": delay})
        out.pop("MLFLOW_TRACKING_URI", None)
        return out

    done = jobs.run_job(overrides + ["run.name=grpo-ref"], ref_dir, env=env(ref_dir, "0"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reference = _calls(ref_dir / "rewards.jsonl")
    assert reference and len(set(reference)) == len(reference)  # the cache: no pair scored twice in one run

    rc, log, killed_at, at_kill = _kill_five_times(overrides + ["run.name=grpo-chaos"], run_dir, storage,
                                                   "grpo-chaos", env(run_dir, "0.3"))
    assert rc == 0, log[-4000:]
    assert jobs.attempt_classes(storage, "grpo-chaos") == ["vanished"] * 5 + ["completed"]
    assert jobs.final_digest(storage, "grpo-chaos") == jobs.final_digest(storage, "grpo-ref"), (
        f"resumed GRPO weights differ from the uninterrupted run (kills after checkpoints at {killed_at})")
    assert max(jobs.committed_steps(storage, "grpo-chaos")) == max(jobs.committed_steps(storage, "grpo-ref")) == 30
    assert _newest_file(storage, "grpo-chaos", "optimizer.pt") == _newest_file(storage, "grpo-ref", "optimizer.pt")
    # the prompts trained on: every generation batch at the same step with the same prompt ids (none skipped,
    # none repeated; the batch in flight at a kill came back from the checkpoint, not from a new sample)
    trained = _prompts_by_step(run_dir / "prompts.jsonl")
    assert trained == _prompts_by_step(ref_dir / "prompts.jsonl") and sorted(trained) == list(range(0, 30, 4))
    # every reward computed once, as in the uninterrupted run, but those a kill caught before their shard was
    # stored (computed once more on resume, and only those)
    calls = _calls(run_dir / "rewards.jsonl")
    lost = _lost_to_kills(calls, at_kill)
    assert [c for i, c in enumerate(calls) if i not in lost] == reference, (
        f"reward calls differ from the uninterrupted run's (kills after {killed_at}, {len(lost)} caught unstored)")
    print(f"GRPO chaos: {len(calls)} reward calls, reference {len(reference)}, {len(lost)} unstored at a kill")
    # TRL's reward metrics gathered since the last log come back too: the logged curve is the uninterrupted one
    assert _reward_curve(storage, "grpo-chaos") == _reward_curve(storage, "grpo-ref"), killed_at
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    curves, ref_curves = _mlflow_curves(client, experiment, "grpo-chaos"), _mlflow_curves(client, experiment, "grpo-ref")
    assert [s for s, _ in ref_curves["reward"]] == [5, 10, 15, 20, 25, 30], ref_curves
    assert curves == ref_curves, killed_at  # point for point, no step twice
    exp = client.get_experiment_by_name(experiment)
    (mlrun,) = client.search_runs([exp.experiment_id], filter_string="tags.job = 'grpo-chaos'")
    rollouts = 30 * 4 / 2  # steps x rows a step / num_iterations: each generation batch counted once
    assert mlrun.data.metrics["cost/rollouts"] == rollouts
    assert mlrun.data.metrics["cost/usd_per_1k_rollouts"] == pytest.approx(mlrun.data.metrics["cost_usd"] / rollouts * 1000)
    assert "per 1k rollouts: $" in log
    assert "resumed inside a generation batch" in log, (killed_at, log[-3000:])


@pytest.mark.e2e
def test_grpo_full_fine_tune_trains_and_writes_full_weights(tmp_path):
    storage = jobs.Storage(str(tmp_path / "runs"))
    done = jobs.run_job(["recipe=grpo", "recipe.peft=full", "recipe.max_completion_length=3", "train.max_steps=4",
                         "train.logging_steps=2", "data.num_examples=60", "preemption.provider=none",
                         "tracking.enabled=false", "run.name=grpo-full", f"run.work_dir={tmp_path / 'work'}",
                         *storage.overrides()], tmp_path,
                        env=jobs.job_env(tmp_path, {"ORCH_STEP_DELAY_SECONDS": "0"}))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = [f["path"] for f in json.loads(storage.store().get_bytes("grpo-full/final/manifest.json"))["files"]]
    assert "model.safetensors" in files and "adapter_model.safetensors" not in files, files
    # TRL's per-function reward metrics, in the job's log file (the Trainer's dicts stay off a console that is no
    # terminal: docs/tracking.md)
    assert "rewards/exact_answer/mean" in (tmp_path / "work" / "grpo-full" / "job.log").read_text()
