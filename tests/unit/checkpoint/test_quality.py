"""Held-out quality, in-process: the matchers, the metric each config chooses, the evaluation's logs, the best
checkpoint's save and retention, the launch checks, and the stored DPO reference log-probs (untrusted storage)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from orchestrator.checkpoint import manifest as mf
from orchestrator.attempt.ports import CheckpointInterval, StepClock
from orchestrator.checkpoint.callback import OrchestratorCallback
from orchestrator.checkpoint.ref_logps import FILE, RefLogProbStore
from orchestrator.checkpoint.store import CheckpointStore
from orchestrator.app.compose import compose_config
from orchestrator.core.errors import ConfigError
from orchestrator.storage import open_store
from recipes import evaluation


def test_exact_match_compares_the_whole_answer_after_normalising_whitespace():
    assert evaluation.matches("exact_match", "  Paris \n", "Paris")
    assert evaluation.matches("exact_match", "New   York", "New York")
    assert not evaluation.matches("exact_match", "Paris, France", "Paris")
    assert not evaluation.matches("exact_match", "12", "1")  # the first-number matcher's blind spot is gone
    assert evaluation.matches("contains", "It is Paris, France.", "Paris")
    assert not evaluation.matches("contains", "It is Lyon.", "Paris") and not evaluation.matches("contains", "x", " ")
    assert evaluation.matches("first_number", " 8\nQ: 3 + 4 =", " 8")


def _cfg(*overrides):
    return compose_config(list(overrides))


def test_the_metric_follows_the_data_and_recipe_eval_metric(tmp_path):
    assert evaluation.generation_matcher(_cfg()) == "first_number"  # the built-in task only
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}))
    assert evaluation.generation_matcher(_cfg("data=jsonl", f"data.path={chat}")) == "exact_match"
    assert evaluation.generation_matcher(_cfg("recipe.eval_metric=contains")) == "contains"
    assert evaluation.quality_metric(_cfg()).name == "eval_accuracy"
    assert evaluation.quality_metric(_cfg("recipe.eval_metric=none")) == evaluation.QualityMetric("eval_loss", False, False)
    assert evaluation.quality_metric(_cfg("recipe=dpo")).name == "eval_reward_accuracy"
    args = evaluation.quality_args(_cfg("train.eval_steps=25", "train.early_stopping_patience=2"))
    assert args == {"prediction_loss_only": True, "eval_strategy": "steps", "eval_steps": 25,
                    "metric_for_best_model": "eval_accuracy", "greater_is_better": True,
                    "restore_callback_states_from_checkpoint": True}


@pytest.mark.parametrize("overrides,needle", [
    (["train.early_stopping_patience=3"], "train.early_stopping_patience=3 counts evaluations"),
    (["checkpoint.final=best"], "checkpoint.final=best keeps the best evaluation's weights"),
    (["train.eval_steps=10", "checkpoint.final=best", "checkpoint.save_final_weights=false"], "writes no final weights"),
    (["train.eval_steps=-1"], "train.eval_steps=-1 must be at least 0"),
    (["train.eval_steps=5", "train.early_stopping_patience=2", "train.early_stopping_threshold=-0.1"],
     "train.early_stopping_threshold=-0.1 must be at least 0"),
    (["recipe.eval_metric=bleu"], "recipe.eval_metric='bleu' is not a valid choice"),
    (["checkpoint.final=first"], "checkpoint.final='first' is not a valid choice"),
])
def test_launch_refuses_evaluation_settings_that_do_not_fit(overrides, needle):
    with pytest.raises(ConfigError) as err:
        compose_config(overrides)
    assert needle in str(err.value)


def _state(step: int, best=None) -> TrainerState:
    state = TrainerState()
    state.global_step, state.best_metric = step, best
    state.log_history = [{"eval_loss": 1.0, "step": step}]
    return state


def test_the_quality_callback_completes_the_evaluation_logs_in_place():
    cfg = _cfg()
    rows = [{"prompt": "Q: 1 + 1 =\nA:", "completion": " 2"}, {"prompt": "Q: 2 + 2 =\nA:", "completion": " 4"}]
    calls = []

    def generate(model, tokenizer, prompts, answers, max_new_tokens, matcher):
        calls.append((prompts, answers, matcher))
        return 0.5

    cb = evaluation.QualityCallback(cfg, tokenizer=None, eval_dataset=rows, generate=generate)
    state = _state(10)
    logs = {"eval_loss": 2.0, "eval_rewards/accuracies": 0.75, "eval_rewards/margins": 0.1}
    cb.on_log(None, state, TrainerControl(), logs=logs, model=object())
    assert logs["eval_accuracy"] == 0.5 and logs["eval_perplexity"] == pytest.approx(np.exp(2.0))
    assert (logs["eval_reward_accuracy"], logs["eval_reward_margin"]) == (0.75, 0.1)
    assert state.log_history[-1]["eval_accuracy"] == 0.5  # trainer_state.json keeps it too
    assert calls == [(["Q: 1 + 1 =\nA:", "Q: 2 + 2 =\nA:"], [" 2", " 4"], "first_number")]
    train_logs = {"loss": 1.0}
    cb.on_log(None, state, TrainerControl(), logs=train_logs, model=object())
    assert train_logs == {"loss": 1.0} and len(calls) == 1  # training logs: nothing generated


def _args(tmp_path, **kw):
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kw)


def test_a_new_best_evaluation_during_training_is_saved_and_its_step_recorded(tmp_path):
    args = _args(tmp_path, eval_strategy="steps", eval_steps=10, metric_for_best_model="eval_accuracy",
                 greater_is_better=True)
    cb = OrchestratorCallback(hooks=None, interval=CheckpointInterval.off(), steps=StepClock(), save_best=True)
    control = TrainerControl()
    cb.on_evaluate(args, _state(0), control, metrics={"eval_accuracy": 0.9})  # before training: no candidate
    assert not control.should_save
    cb._training = True
    state = _state(10, best=0.4)
    cb.on_evaluate(args, state, control, metrics={"eval_accuracy": 0.5})
    assert control.should_save and state.best_global_step == 10
    control, state = TrainerControl(), _state(20, best=0.5)
    cb.on_evaluate(args, state, control, metrics={"eval_accuracy": 0.5})  # not better: no save
    assert not control.should_save and state.best_global_step is None
    cb.on_train_end(args, state, control)
    cb.on_evaluate(args, _state(30, best=0.5), control, metrics={"eval_accuracy": 0.9})  # the end-of-training one
    assert not control.should_save
    plain = OrchestratorCallback(hooks=None, interval=CheckpointInterval.off(), steps=StepClock())  # checkpoint.final=last: evaluations save nothing
    plain._training = True
    plain.on_evaluate(args, _state(10, best=0.4), control, metrics={"eval_accuracy": 0.9})
    assert not control.should_save


def _commit(checkpoints: CheckpointStore, tmp_path: Path, step: int, best_step) -> None:
    folder = tmp_path / f"ckpt-{step}"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"w" * step)
    checkpoints.commit_async(folder, step=step, fence=1, meta={"best_step": best_step}, may_commit=lambda: None,
                             on_committed=lambda result, manifest: None)
    checkpoints.wait()


def test_retention_keeps_the_best_checkpoint_beside_the_newest(tmp_path):
    checkpoints = CheckpointStore(open_store(str(tmp_path / "runs")), "job", keep_last=2, staging_dir=tmp_path / "s")
    for step, best in [(10, None), (20, 20), (30, 20), (40, 20), (50, 20)]:
        _commit(checkpoints, tmp_path, step, best)
    assert [c.step for c in checkpoints.committed()] == [20, 40, 50]
    _commit(checkpoints, tmp_path, 60, 60)  # a new best: the old one goes
    assert [c.step for c in checkpoints.committed()] == [50, 60]
    local, manifest = checkpoints.restore_latest(tmp_path / "restore", step=50)
    assert manifest["step"] == 50 and (local / "adapter_model.safetensors").read_bytes() == b"w" * 50
    checkpoints.close()


def _ref_store(tmp_path, trajectory=None) -> RefLogProbStore:
    checkpoints = CheckpointStore(open_store(str(tmp_path / "runs")), "job", staging_dir=tmp_path / "s")
    return RefLogProbStore(checkpoints, work=tmp_path / "work", main=True, trajectory=trajectory or {"t": 1})


def test_stored_reference_log_probs_come_back_exactly_and_only_for_their_key(tmp_path):
    store = _ref_store(tmp_path)
    key = store.key(split="train", data_fingerprint="d1", model_fingerprint="m1", batch_size=8)
    arrays = {"ref_chosen_logps": np.array([-1.5, -2.25, -3.0], dtype=np.float32),
              "ref_rejected_logps": np.array([-4.0, -5.5, -6.125], dtype=np.float32)}
    assert store.load(key, rows=3) is None
    store.save(key, arrays)
    back = store.load(key, rows=3)
    assert all(back[k].dtype == np.float32 and np.array_equal(back[k], arrays[k]) for k in arrays)
    for other in (dict(data_fingerprint="d2", model_fingerprint="m1"), dict(data_fingerprint="d1", model_fingerprint="m2")):
        assert store.key(split="train", batch_size=8, **other) != key  # another dataset or base model: another key
    assert _ref_store(tmp_path, {"t": 2}).key(split="train", data_fingerprint="d1", model_fingerprint="m1",
                                              batch_size=8) != key
    assert store.load(key, rows=4) is None  # not the split's length: unusable


def test_tampered_reference_log_probs_are_refused_and_computed_again(tmp_path, caplog):
    store = _ref_store(tmp_path)
    key = store.key(split="train", data_fingerprint="d", model_fingerprint="m", batch_size=8)
    store.save(key, {"ref_chosen_logps": np.zeros(2, np.float32), "ref_rejected_logps": np.ones(2, np.float32)})
    raw = open_store(str(tmp_path / "runs"))
    prefix = f"job/ref_log_probs/{key}/"
    data = bytearray(raw.get_bytes(prefix + FILE))
    data[-1] ^= 0xFF  # one byte of the values changed, the manifest left as it was
    raw.put_bytes(prefix + FILE, bytes(data))
    assert store.load(key, rows=2) is None
    assert "does not match its SHA-256" in caplog.text
    manifest = json.loads(raw.get_bytes(prefix + mf.MANIFEST_NAME))
    manifest["files"][0]["path"] = "../../escape.safetensors"  # a path out of its folder
    raw.put_bytes(prefix + mf.MANIFEST_NAME, json.dumps(manifest).encode())
    assert store.load(key, rows=2) is None
    assert not (tmp_path / "escape.safetensors").exists()
