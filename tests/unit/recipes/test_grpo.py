"""recipe=grpo: launch checks of the reward functions and batch shapes, the reward cache, the batch in flight."""
from __future__ import annotations

import importlib
import json
import math

import pytest

from orchestrator.app.compose import compose_config
from orchestrator.core.errors import ConfigError

BAD = [
    (["recipe.reward_funcs=[no_such_module_xyz:fn]"], ["no_such_module_xyz", "cannot be imported", "PYTHONPATH"]),
    (["recipe.reward_funcs=[recipes.rewards:nope]"], ["has no callable 'nope'"]),
    (["recipe.reward_funcs=[recipes.rewards]"], ["'recipes.rewards' is a module, not a function"]),
    (["recipe.reward_funcs=[exact_answer]"], ["not an import path", "package.module:function", "think_format_reward"]),
    # hostile entries: a file path, a relative import, an expression, the standard library are never imported
    (["recipe.reward_funcs=['/tmp/evil.score']"], ["not an import path"]),
    (["recipe.reward_funcs=[..evil.score]"], ["not an import path"]),
    (["recipe.reward_funcs=[\"__import__('os').system\"]"], ["not an import path"]),
    (["recipe.reward_funcs=[os.system]"], ["standard library (os)"]),
    (["recipe.reward_funcs=['subprocess:run']"], ["standard library (subprocess)"]),
    (["recipe.reward_funcs=[antigravity.fly]"], ["standard library (antigravity)"]),
    (["recipe.reward_funcs=[tests.helpers.grpo_rewards.no_kwargs]"], ["takes no **kwargs"]),
    (["recipe.reward_funcs=[think_format_reward]"], ["conversational completions", "data=synthetic"]),
    (["recipe.reward_funcs=[tests.helpers.grpo_rewards:NOT_CALLABLE]"], ["has no callable"]),
    (["recipe.reward_funcs=[tests.helpers.grpo_rewards:no_kwargs]"], ["takes no **kwargs", "def no_kwargs(prompts, completions, **kwargs)"]),
    (["recipe.reward_funcs=[tests.helpers.grpo_rewards:needs_judge]"], ["cannot be called as TRL calls it", "judge"]),
    (["recipe.reward_funcs=[]"], ["at least one reward function"]),
    (["recipe.num_generations=3", "train.per_device_batch_size=8", "recipe.steps_per_generation=1"],
     ["num_generations=3 does not divide the generation batch of 8"]),
    (["recipe.beta=-0.1"], ["recipe.beta=-0.1 must be a finite number of at least 0"]),
    (["recipe.use_vllm=true"], ["use_vllm=true needs a CUDA GPU"]),
    (["recipe.reward_weights=[1.0]"], ["2 reward functions"]),
    (["train.eval_steps=5"], ["train.eval_steps=0"]),
]


@pytest.mark.parametrize("overrides,needles", BAD)
def test_bad_grpo_settings_are_refused_at_compose_with_the_fix(overrides, needles):
    with pytest.raises(ConfigError) as err:
        compose_config(["recipe=grpo", *overrides])
    for needle in needles:
        assert needle in str(err.value), str(err.value)


def test_grpo_composes_with_its_own_option_names_and_full_fine_tune():
    cfg = compose_config(["recipe=grpo", "recipe.peft=full", "recipe.num_generations=2", "recipe.num_iterations=2"])
    assert cfg.recipe.peft == "full" and cfg.recipe.num_iterations == 2
    assert list(cfg.recipe.reward_funcs) == ["recipes.rewards:exact_answer", "recipes.rewards:answer_format"]
    with pytest.raises(Exception):
        compose_config(["recipe=sft", "recipe.num_generations=2"])  # an SFT job has no GRPO keys


def test_shipped_rewards_score_the_builtin_task():
    from recipes.rewards import answer_format, exact_answer

    assert exact_answer(["Q: 3 + 5 =\nA:"] * 3, [" 8", " 9", " 8 and"], answer=["8"] * 3) == [1.0, 0.0, 1.0]
    assert answer_format([""] * 3, [" 8", "8 x", "-3 "]) == [0.5, 0.0, 0.5]


def test_trls_dotted_paths_and_named_rewards_are_accepted_and_score(tmp_path):
    """TRL's GRPO script's forms: ``pkg.mod.fn`` split at the last dot, and trl.rewards' named functions."""
    from recipes.rewards import exact_answer, reward_functions

    cfg = compose_config(["recipe=grpo", "recipe.reward_funcs=[recipes.rewards.exact_answer,"
                          "get_soft_overlong_punishment]"])
    exact, overlong = reward_functions(cfg)
    assert exact is exact_answer
    assert overlong(prompts=["p"] * 2, completions=["a", "b"], completion_ids=[[1] * 10, [1] * 1152]) == [0.0, -0.5]

    rows = tmp_path / "chat.jsonl"  # TRL's named format reward reads conversational completions
    rows.write_text(json.dumps({"prompt": [{"role": "user", "content": "2 + 2?"}], "answer": "4"}) + "\n")
    cfg = compose_config(["recipe=grpo", "data=jsonl", f"data.path={rows}", "recipe.reward_funcs=[think_format_reward]"])
    (think,) = reward_functions(cfg)
    done = [[{"role": "assistant", "content": "<think>\nadd\n</think>\n4"}], [{"role": "assistant", "content": "4"}]]
    assert think(prompts=["p", "p"], completions=done) == [1.0, 0.0]


def test_trls_math_rewards_need_math_verify(monkeypatch):
    monkeypatch.setattr(importlib.import_module("trl.import_utils"), "is_math_verify_available", lambda: False)
    with pytest.raises(ConfigError, match="needs the math_verify package.*pip install"):
        compose_config(["recipe=grpo", "recipe.reward_funcs=[accuracy_reward]"])


def test_a_reward_reading_a_column_the_data_lacks_is_refused_and_one_it_has_accepted(tmp_path):
    """TRL's accuracy_reward reads ``solution``: a required argument is a column, checked where the launch knows them."""
    with pytest.raises(ConfigError, match="missing a required argument: 'judge'.*the columns answer, prompt"):
        compose_config(["recipe=grpo", "recipe.reward_funcs=[tests.helpers.grpo_rewards.needs_judge]"])
    rows = tmp_path / "judged.jsonl"
    rows.write_text(json.dumps({"prompt": "Q: 1 + 1 =\nA:", "judge": "strict"}) + "\n")
    cfg = compose_config(["recipe=grpo", "data=jsonl", f"data.path={rows}",
                          "recipe.reward_funcs=[tests.helpers.grpo_rewards.needs_judge]"])
    assert list(cfg.recipe.reward_funcs) == ["tests.helpers.grpo_rewards.needs_judge"]


def _cache(tmp_path, run="g"):
    from orchestrator.checkpoint.reward_cache import RewardCache
    from orchestrator.checkpoint.store import CheckpointStore
    from orchestrator.storage import open_store

    store = open_store(str(tmp_path / "runs"))
    return RewardCache(CheckpointStore(store, run, keep_last=2, staging_dir=tmp_path / "st"), work=tmp_path / "w",
                       main=True), store


def test_reward_cache_scores_each_pair_once_across_a_resume(tmp_path):
    from recipes.rewards import CachedReward

    calls = []

    def reward(prompts, completions, answer=None, **kwargs):
        calls.extend(zip(prompts, completions))
        return [float(c == a) for c, a in zip(completions, answer)]

    cache, _ = _cache(tmp_path)
    fn = CachedReward(reward, "tests:reward", cache)
    assert fn.__name__ == "reward"  # TRL names the metric after it
    prompts, completions, answers = ["p1", "p1", "p2", "p2"], ["1", "1", "2", "3"], ["1", "1", "2", "2"]
    assert fn(prompts, completions, answer=answers, trainer_state=None) == [1.0, 1.0, 1.0, 0.0]
    assert calls == [("p1", "1"), ("p2", "2"), ("p2", "3")]  # the repeated pair scored once
    cache.flush()  # what the attempt does before each checkpoint's manifest
    resumed, _ = _cache(tmp_path)  # a new attempt: the cache comes from storage
    again = CachedReward(reward, "tests:reward", resumed)
    assert again(prompts + ["p3"], completions + ["4"], answer=answers + ["4"]) == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert calls[3:] == [("p3", "4")]
    # the same completion with another answer column is another row: scored
    assert again(["p1"], ["1"], answer=["2"]) == [0.0] and calls[-1] == ("p1", "1")


def test_a_reward_marked_uncached_is_called_on_every_batch_the_others_through_the_cache(tmp_path):
    from recipes.rewards import CachedReward, reward_functions

    cache, _ = _cache(tmp_path)
    cfg = compose_config(["recipe=grpo", "recipe.reward_funcs=[recipes.rewards:exact_answer,"
                          "tests.helpers.grpo_rewards:logged_prompts]"])
    cached, probe = reward_functions(cfg, cache)
    assert isinstance(cached, CachedReward) and not isinstance(probe, CachedReward)
    assert probe([""], ["1"], answer=["1"]) == [0.0]


@pytest.mark.parametrize("tamper", ["value", "nan", "manifest_owner"])
def test_a_tampered_reward_cache_shard_is_refused_and_its_rewards_computed_again(tmp_path, tamper, caplog):
    cache, store = _cache(tmp_path)
    cache.put("f", {("a" * 32, "b" * 32): 1.0})
    cache.put("f", {("c" * 32, "d" * 32): 0.5})
    cache.flush()
    shard = sorted(k for k in store.list("g/reward_cache/") if k.endswith("rewards.json"))[0]
    body = json.loads(store.get_bytes(shard))
    if tamper == "value":
        body["entries"][0][3] = 7.0  # same size, other bytes: the manifest's hash refuses it
        store.put_bytes(shard, json.dumps(body).encode())
    elif tamper == "nan":
        from orchestrator.checkpoint.reward_cache import parse_entries
        from orchestrator.records.fields import CorruptRecord

        body["entries"][0][3] = math.nan
        with pytest.raises(CorruptRecord, match="entry 0: reward nan is not a finite number"):
            parse_entries(json.loads(json.dumps(body)))
        return
    else:
        key = shard.replace("rewards.json", "manifest.json")
        store.put_bytes(key, store.get_bytes(key).replace(b'"run_name": "g"', b'"run_name": "other"'))
    resumed, _ = _cache(tmp_path)
    assert resumed.get("f", ("a" * 32, "b" * 32)) is None  # refused: computed again
    assert resumed.get("f", ("c" * 32, "d" * 32)) == 0.5  # the other shard still serves
    assert "unusable" in caplog.text


def test_the_batch_in_flight_round_trips_and_non_finite_values_are_refused(tmp_path):
    import torch
    from safetensors.torch import save_file

    from recipes.grpo import read_buffer

    parts = [{"advantages": torch.tensor([0.5, -0.5]), "completion_ids": torch.tensor([[1, 2], [3, 4]]),
              "num_items_in_batch": 4}, {"advantages": torch.tensor([1.0, 0.0]),
                                         "completion_ids": torch.tensor([[5, 6], [7, 8]]), "num_items_in_batch": 4}]
    tensors = {f"{i}/{k}": v for i, p in enumerate(parts) for k, v in p.items() if torch.is_tensor(v)}
    scalars = [{"num_items_in_batch": 4}, {"num_items_in_batch": 4}]
    save_file(tensors, str(tmp_path / "b.safetensors"))
    back = read_buffer(tmp_path / "b.safetensors", scalars, 2, "cpu")
    assert torch.equal(back[1]["completion_ids"], parts[1]["completion_ids"]) and back[0]["num_items_in_batch"] == 4
    with pytest.raises(ValueError, match="2 parts"):
        read_buffer(tmp_path / "b.safetensors", scalars[:1], 2, "cpu")
    tensors["0/advantages"] = torch.tensor([math.inf, 0.0])
    save_file(tensors, str(tmp_path / "b.safetensors"))
    with pytest.raises(ValueError, match="non-finite"):
        read_buffer(tmp_path / "b.safetensors", scalars, 2, "cpu")


def _commit_generation_checkpoint(store, tmp_path, step: int, advantages) -> str:
    """A checkpoint folder as ExactResumeGRPOTrainer writes it inside a generation batch, committed as a job does."""
    import torch
    from safetensors.torch import save_file

    from orchestrator.checkpoint.store import CheckpointStore

    folder = tmp_path / f"trainer-{step}"
    folder.mkdir()
    save_file({"0/advantages": torch.tensor(advantages), "1/advantages": torch.tensor(advantages)},
              str(folder / "grpo_buffer_rank0.safetensors"))
    (folder / "grpo_state.json").write_text(json.dumps({"step": step, "generate_every": 4, "buffer": [{}, {}],
                                                        "metrics": {"reward": [0.5]}}))
    checkpoints = CheckpointStore(store, "job", staging_dir=tmp_path / "staging")
    name = checkpoints.commit_async(folder, step=step, fence=1, meta={}, may_commit=lambda: None,
                                    on_committed=lambda result, manifest: None)
    checkpoints.wait()
    checkpoints.close()
    return name


def test_a_tampered_batch_in_flight_is_refused_and_the_previous_checkpoint_restored(tmp_path, caplog):
    from safetensors.torch import save_file
    import torch

    from orchestrator.checkpoint.store import CheckpointStore
    from orchestrator.storage.local import LocalStore

    store = LocalStore(tmp_path / "store")
    older = _commit_generation_checkpoint(store, tmp_path, 5, [0.5, -0.5])
    newer = _commit_generation_checkpoint(store, tmp_path, 9, [1.0, -1.0])
    forged = tmp_path / "forged.safetensors"  # other advantages, same shapes: what a bucket writer would try
    save_file({"0/advantages": torch.tensor([9.0, -9.0]), "1/advantages": torch.tensor([9.0, -9.0])}, str(forged))
    store.put_bytes(f"job/checkpoints/{newer}/grpo_buffer_rank0.safetensors", forged.read_bytes())
    local, manifest = CheckpointStore(store, "job", staging_dir=tmp_path / "s").restore_latest(tmp_path / "restore")
    assert local.name == older and manifest["step"] == 5
    assert f"checkpoint {newer} is unusable" in caplog.text


def test_trl_metrics_in_a_checkpoint_must_be_numbers():
    from recipes.grpo import read_metrics

    assert read_metrics({"reward": [0.5, 1], "kl": []}) == {"reward": [0.5, 1.0], "kl": []}
    for bad in ({"reward": ["x"]}, {"reward": 0.5}, [1]):
        with pytest.raises(ValueError):
            read_metrics(bad)


def test_the_planner_counts_grpos_rows_reference_model_and_generation_cache():
    from orchestrator.planning.memory import estimate_memory

    sft = estimate_memory(compose_config(["recipe=sft", "recipe.peft=full"]))
    grpo = estimate_memory(compose_config(["recipe=grpo", "recipe.peft=full", "recipe.beta=0.04",
                                           "recipe.max_completion_length=16", "recipe.steps_per_generation=2"]))
    lora = estimate_memory(compose_config(["recipe=grpo", "recipe.beta=0.04", "recipe.max_completion_length=16"]))
    assert grpo.tokens_per_step == sft.tokens_per_step * (64 + 16) // 64  # prompt and completion per row
    assert grpo.components["reference_model"] == grpo.components["weights"]  # full fine-tune, beta > 0
    assert "reference_model" not in lora.components and "reference_model" not in sft.components  # LoRA: the base
    # 2 (K and V) x layers x kv_dim x (prompt + completion) x (8 rows x 2 steps) x float32
    assert grpo.components["generation_cache"] == 2 * 2 * 64 * 80 * 16 * 4
    assert "generation_cache" not in sft.components


def test_launch_exits_4_with_the_fix_for_a_reward_function_it_cannot_import(tmp_path, monkeypatch, capsys):
    from tests.helpers.launcher import launch

    done = launch(["recipe=grpo", "recipe.reward_funcs=[mypkg_missing.rewards:judge]",
                   f"storage.uri={tmp_path / 'runs'}", "run.name=bad-reward"], tmp_path, monkeypatch, capsys)
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    text = done.stdout + done.stderr
    assert "mypkg_missing" in text and "PYTHONPATH" in text
    assert not (tmp_path / "runs" / "bad-reward" / "ledger.json").exists()  # refused before any attempt


class _FakeVllm:
    """What TRL's VLLMGeneration offers the trainer: ``sync_weights`` (a push) and ``generate``."""

    def __init__(self, fail_push=False):
        self.fail_push, self.generated = fail_push, 0

    def sync_weights(self):
        if self.fail_push:
            raise ConnectionError("weight update group broke")

    def generate(self, **kwargs):
        self.generated += 1
        return "completions"


def test_vllm_rollouts_after_a_resume_need_a_push_of_the_restored_step_first():
    from types import SimpleNamespace

    from recipes.grpo_vllm import StaleGenerationWeights, WeightVersion

    trainer = SimpleNamespace(state=SimpleNamespace(global_step=0), vllm_generation=_FakeVllm())
    version, gen = WeightVersion(trainer), trainer.vllm_generation
    with pytest.raises(StaleGenerationWeights, match="no weights were pushed"):
        gen.generate(prompts=[])
    gen.sync_weights()
    assert gen.generate(prompts=[]) == "completions"
    trainer.state.global_step = 4  # trained on: a rollout without a new push would sample the old policy
    with pytest.raises(StaleGenerationWeights, match="weights of step 0, the rollout is for step 4"):
        gen.generate(prompts=[])
    version.resumed(12)  # a new attempt restored step 12: nothing pushed yet
    trainer.state.global_step = 12
    with pytest.raises(StaleGenerationWeights, match="no weights were pushed"):
        gen.generate(prompts=[])
    gen.sync_weights()
    assert gen.generate(prompts=[]) == "completions" and gen.generated == 2
    trainer.vllm_generation.fail_push = True
    trainer.state.global_step = 16
    with pytest.raises(ConnectionError):
        gen.sync_weights()
    with pytest.raises(StaleGenerationWeights):  # a push that failed leaves no version behind
        gen.generate(prompts=[])


def test_a_reward_of_huge_magnitude_in_the_cache_is_refused_and_computed_again(tmp_path, caplog):
    """Issue 41: a reward of 1e300 in a (soundly committed) shard passed the finite check and trained on inf
    (its square overflows in the advantages' std). Beyond +-1e6 a cached reward is refused, its shard's rewards
    computed again."""
    from orchestrator.checkpoint.reward_cache import REWARD_BOUND, parse_entries
    from orchestrator.records.fields import CorruptRecord
    from recipes.rewards import CachedReward

    cache, _ = _cache(tmp_path)
    cache._commit("00000-000099", 0, {("f", "a" * 32, "b" * 32): 1e300})  # a shard as a writer of the bucket makes it
    cache.put("f", {("c" * 32, "d" * 32): 0.5})
    cache.flush()
    resumed, _ = _cache(tmp_path)
    assert resumed.get("f", ("a" * 32, "b" * 32)) is None and resumed.get("f", ("c" * 32, "d" * 32)) == 0.5
    assert "00000-000099 is unusable" in caplog.text and "beyond" in caplog.text
    assert REWARD_BOUND == 1e6
    with pytest.raises(CorruptRecord, match="beyond"):
        parse_entries({"entries": [["f", "a" * 32, "b" * 32, -2e6]]})
    # a reward function's own huge value is what it returned (TRL's to use), never kept in the cache
    calls = []

    def huge(prompts, completions, **kwargs):
        calls.append(len(completions))
        return [1e7 for _ in completions]

    reward = CachedReward(huge, "m:huge", resumed)
    assert reward(["p"], ["x"]) == [1e7] and reward(["p"], ["x"]) == [1e7] and calls == [1, 1]


def test_a_non_finite_batch_in_flight_in_a_sound_checkpoint_is_generated_again_not_a_crash(tmp_path, caplog):
    """Issue 41: a NaN in the stored generation batch (its checkpoint's hashes sound) crashed every attempt; the
    batch is now generated again from the restored step (as after a checkpoint at a batch boundary)."""
    from types import SimpleNamespace

    import torch
    from safetensors.torch import save_file

    from recipes.grpo import STATE_FILE, load_generation_state

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    save_file({"0/advantages": torch.tensor([math.nan, 0.5]), "1/advantages": torch.tensor([1.0, 0.0])},
              str(folder / "grpo_buffer_rank0.safetensors"))
    (folder / STATE_FILE).write_text(json.dumps({"step": 5, "generate_every": 4, "buffer": [{}, {}],
                                                 "metrics": {"reward": [0.5]}}))
    trainer = SimpleNamespace(accelerator=SimpleNamespace(process_index=0, device="cpu"), num_iterations=1,
                              args=SimpleNamespace(steps_per_generation=4), _step=0, _buffered_inputs=[{}],
                              _metrics={"train": {}})
    trainer.args.steps_per_generation, trainer.num_iterations = 2, 2
    load_generation_state(trainer, folder)
    assert trainer._step == 5 and trainer._buffered_inputs is None  # TRL generates the batch again
    assert "grpo_buffer_rank0.safetensors" in caplog.text and "generated again" in caplog.text


def test_a_numpy_reward_is_still_cached():
    import numpy as np

    from orchestrator.checkpoint.reward_cache import _as_float

    assert _as_float(np.float32(0.5)) == 0.5 and _as_float(True) is None and _as_float(np.float64(2e6)) is None
