"""Training options from ``trl sft``/Axolotl habits: refused at launch when they cannot run, and really
passed to the Trainer when they can (in-process, on the tiny model).

Exact resume with them on is proven end to end in tests/e2e/test_exact_resume.py (QLoRA with bf16 mixed
precision; SFT with packing, an 8-bit optimizer and a data-loader worker).
"""
from __future__ import annotations

import pytest
import torch

from orchestrator.config import train_options
from orchestrator.app.compose import compose_config
from orchestrator.core.errors import ConfigError, DataError, UserError
from recipes import common, data, qlora, sft

L4_BF16 = ["compute=l4-spot", "train.mixed_precision=bf16"]


REFUSED = [
    (["train.mixed_precision=fp16"], ["fp16 needs a CUDA GPU", "train.mixed_precision=bf16"]),
    (["compute=t4-spot", "train.mixed_precision=bf16"], ["t4", "no bfloat16", "train.mixed_precision=fp16"]),
    (["model.dtype=float16"], ["without loss scaling", "train.mixed_precision=fp16"]),
    (["compute=l4-spot", "model.dtype=float16", "train.mixed_precision=fp16", "recipe.peft=full"],
     ["cannot unscale float16", "model.dtype=float32"]),
    (["train.tf32=true"], ["train.tf32=true is a CUDA setting"]),
    (["model.attn_implementation=flash_attention_2"], ["CUDA GPUs only", "model.attn_implementation=sdpa"]),
    (L4_BF16 + ["model.attn_implementation=flash_attention_2"], ["flash_attn", "not installed", "pip install flash-attn"]),
    (L4_BF16 + ["model.attn_implementation=flash_attention_3"], ["Hopper", "flash_attention_2"]),
    (["model.attn_implementation=fast"], ["not an attention kernel", "sdpa"]),
    (["recipe=dpo", "train.packing=true"], ["recipe=sft or qlora only"]),
    (["recipe=dpo", "train.padding_free=true"], ["train.padding_free=true works with recipe=sft or qlora only"]),
    (["train.optim=galore_adamw"], ["needs optim_target_modules", "adamw_torch"]),
    (["train.optim=adam_w"], ["not a Trainer optimizer", "paged_adamw_8bit"]),
    (["train.optim=adamw_torch_8bit"], ["torchao", "CUDA GPU"]),
    (["train.max_grad_norm=-1"], ["train.max_grad_norm=-1.0", "at least 0"]),
    (["train.dataloader_num_workers=-1"], ["train.dataloader_num_workers=-1"]),
    (["data.num_proc=0"], ["data.num_proc=0"]),
    (["data.chat_template=nope"], ["not a template TRL ships", "llama3"]),
    (["data.chat_template=/nowhere/t.jinja"], ["no such file"]),
    (["data.source=mix"], ["at least two sources"]),
    (["data.mix=[{source: synthetic}, {source: synthetic, seed: 2}]"], ["data.source=mix"]),
]


@pytest.mark.parametrize("overrides,needles", REFUSED, ids=[" ".join(o)[-60:] for o, _ in REFUSED])
def test_an_option_that_cannot_run_is_refused_at_launch_with_the_fix(overrides, needles):
    with pytest.raises(UserError) as err:
        compose_config(overrides)
    assert err.value.exit_code == 4
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_an_unknown_mixed_precision_word_is_a_choice_error():
    with pytest.raises(ConfigError, match="train.mixed_precision='bf32' is not a valid choice; choose one of: auto, no, bf16, fp16"):
        compose_config(["train.mixed_precision=bf32"])


def test_options_that_can_run_compose():
    gpu = compose_config(["compute=h100-spot", "train.mixed_precision=bf16", "train.tf32=true",
                          "model.attn_implementation=sdpa"])
    assert (gpu.train.mixed_precision, gpu.train.tf32, gpu.model.attn_implementation) == ("bf16", True, "sdpa")
    t4 = compose_config(["compute=t4-spot", "train.mixed_precision=fp16", "model.dtype=float16"])
    assert (t4.compute.gpu_type, t4.train.mixed_precision, t4.model.dtype) == ("t4", "fp16", "float16")
    cpu = compose_config(["train.packing=true", "train.padding_free=true", "train.optim=paged_adamw_8bit",
                          "train.dataloader_num_workers=2", "data.num_proc=2", "data.chat_template=llama3"])
    assert cpu.train.packing and cpu.train.padding_free and cpu.train.optim == "paged_adamw_8bit"
    assert (cpu.train.dataloader_num_workers, cpu.data.num_proc, cpu.data.chat_template) == (2, 2, "llama3")


def test_the_optimizer_table_covers_every_trainer_optimizer():
    """Every name transformers' Trainer knows is either runnable (with its state size) or refused with a reason."""
    from transformers.training_args import OptimizerNames

    assert set(train_options.OPTIMIZERS) | set(train_options.REFUSED_OPTIMIZERS) == {o.value for o in OptimizerNames}


def test_bitsandbytes_is_loaded_for_its_optimizers():
    assert common.quantisation_stack_needed(compose_config(["train.optim=paged_adamw_8bit"]))
    assert not common.quantisation_stack_needed(compose_config(["train.optim=adamw_torch_fused"]))


def _trainer(module, overrides, tmp_path):
    cfg = compose_config(overrides)
    train, evald = data.load_datasets(cfg.data, cfg.recipe.name)
    return cfg, module.build_trainer(cfg, train_dataset=train, eval_dataset=evald, output_dir=str(tmp_path), callbacks=[])


def _output_dtypes(module, seen: list):
    return module.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))


def test_mixed_precision_is_accelerates_autocast_and_leaves_the_storage_dtype(tmp_path):
    cfg, trainer = _trainer(sft, ["train.mixed_precision=bf16", "train.max_grad_norm=0.5", "train.max_steps=1",
                                  "data.num_examples=40"], tmp_path)
    assert trainer.args.bf16 and not trainer.args.fp16 and trainer.args.max_grad_norm == 0.5
    assert trainer.accelerator.mixed_precision == "bf16"
    seen: list = []
    hook = _output_dtypes(trainer.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer, seen)
    trainer.train()
    hook.remove()
    assert seen and set(seen) == {torch.bfloat16}, "the matmuls ran under bf16 autocast"
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}, "model.dtype stays the storage dtype"
    _, plain = _trainer(sft, ["data.num_examples=40", "train.max_steps=1"], tmp_path / "plain")
    assert not plain.args.bf16 and plain.accelerator.mixed_precision == "no", "TRL's bf16 default is not taken"
    seen.clear()
    hook = _output_dtypes(plain.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer, seen)
    plain.train()
    hook.remove()
    assert set(seen) == {torch.float32}


def test_qlora_under_bf16_dequantises_to_bf16(tmp_path):
    import bitsandbytes as bnb

    _, trainer = _trainer(qlora, ["recipe=qlora", "train.mixed_precision=bf16", "data.num_examples=40"], tmp_path)
    layers = [m for m in trainer.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and {m.compute_dtype for m in layers} == {torch.bfloat16}


def test_packing_fills_rows_with_real_tokens_and_counts_only_those(tmp_path):
    cfg, trainer = _trainer(sft, ["train.packing=true", "data.num_examples=200", "train.max_steps=3",
                                  "train.logging_steps=1"], tmp_path)
    packed = trainer.train_dataset
    assert trainer.padding_free and len(packed) < 180 / 3, "several examples per row"
    assert all(sum(r["seq_lengths"]) <= cfg.data.max_length for r in packed)
    batch = next(iter(trainer.get_train_dataloader()))
    assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 1, "one flattened sequence, no padding"
    assert (batch["position_ids"][0] == 0).sum() > cfg.train.per_device_batch_size, "position ids restart per example"
    seen: list = []
    embed = trainer.model.get_base_model().model.embed_tokens
    hook = embed.register_forward_pre_hook(lambda _m, args: seen.append(args[0].numel()))
    trainer.train()
    hook.remove()
    logged = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
    # TRL's count (what the cost report reads) is every token the model was fed, and no row was padded
    assert logged[-1] == sum(seen) < 3 * cfg.train.per_device_batch_size * cfg.data.max_length
    from orchestrator.money.cost import Price
    from orchestrator.money.report import JobFigures, estimated_tokens_per_step

    figures = JobFigures(Price(1.0, 1.0, 2.0, source="test"), [], step_at_start=0,
                         fallback_tokens_per_step=estimated_tokens_per_step(cfg))
    for entry in trainer.state.log_history:
        figures.observe_logs(entry, entry["step"])
    assert figures.figures(step=3, attempt_cost_usd=0.0, attempt_gpu_hours=0.0)["tokens_trained"] == sum(seen)


def test_a_packed_example_attends_only_to_itself_under_sdpa():
    """Padding-free rows carry no attention mask; transformers masks by the restarting position ids (TRL turns
    the cache off in training, which that needs), so packing does not leak one example into the next."""
    cfg = compose_config(["model.attn_implementation=sdpa"])
    model = common.load_model(common.resolve_model_path(cfg.model), cfg.model).eval()
    a, b = torch.randint(5, 500, (1, 10)), torch.randint(5, 500, (1, 7))
    positions = torch.cat([torch.arange(10), torch.arange(7)])[None]
    with torch.no_grad():
        packed = model(input_ids=torch.cat([a, b], 1), position_ids=positions, use_cache=False).logits[0, 10:]
        alone = model(input_ids=b).logits[0]
    assert torch.allclose(packed, alone, atol=1e-5)


def test_an_8bit_optimizer_keeps_8bit_states_that_round_trip_weights_only(tmp_path):
    import bitsandbytes as bnb

    _, trainer = _trainer(sft, ["recipe.peft=full", "train.optim=adamw_bnb_8bit", "train.max_steps=2",
                                "data.num_examples=40"], tmp_path)
    trainer.train()
    optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    assert isinstance(optimizer, bnb.optim.optimizer.Optimizer8bit)
    states = [s for s in optimizer.state.values() if "state1" in s]
    assert any(s["state1"].dtype == torch.uint8 for s in states), "tensors of 4096+ elements keep 8-bit moments"
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")
    restored = torch.load(tmp_path / "optimizer.pt", weights_only=True)  # how the Trainer loads it on resume
    again = bnb.optim.AdamW([{"params": g["params"]} for g in optimizer.param_groups], lr=1.0, optim_bits=8)
    again.load_state_dict(restored)
    for before, after in zip(optimizer.state.values(), again.state.values()):
        for key, value in before.items():
            if torch.is_tensor(value):
                assert torch.equal(value, after[key]) and value.dtype == after[key].dtype, key


def test_fp16_loss_scaling_state_is_saved_and_restored_by_the_trainer_weights_only(tmp_path):
    """fp16 needs CUDA (refused on CPU at launch), so the GradScaler's round trip is proven with torch's CPU
    scaler through the Trainer's own save/load and the project's restore guard."""
    import json

    from orchestrator.checkpoint import safe_load

    assert common.precision_kwargs(compose_config(["compute=t4-spot", "train.mixed_precision=fp16"]).train,
                                   cuda=True) == {"bf16": False, "fp16": True}
    _, trainer = _trainer(sft, ["data.num_examples=40"], tmp_path)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=7)
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    scaler.update(2.0**10)
    trainer.accelerator.scaler = scaler
    trainer._save_scaler(str(tmp_path))
    manifest = {"files": [{"path": "scaler.pt"}]}
    assert safe_load.check_restorable(tmp_path, manifest) == 1
    trainer.accelerator.scaler = fresh = torch.amp.GradScaler("cpu")
    with safe_load.no_code_from_storage():
        trainer._load_scaler(str(tmp_path))
    assert json.dumps(fresh.state_dict(), sort_keys=True) == json.dumps(scaler.state_dict(), sort_keys=True)
    assert fresh.get_scale() == 2.0**10


def test_workers_and_num_proc_reach_the_trainer_and_are_not_trajectory(tmp_path):
    from orchestrator.checkpoint.fingerprint import trajectory_config

    cfg = compose_config(["train.dataloader_num_workers=2", "data.num_proc=2"])
    kw = common.training_kwargs(cfg, str(tmp_path))
    assert kw["dataloader_num_workers"] == 2 and kw["dataset_num_proc"] == 2
    assert trajectory_config(cfg) == trajectory_config(compose_config([])), "a job may resume with other counts"


def test_a_missing_kernel_on_the_training_machine_is_a_config_error(monkeypatch):
    """Where the launcher could not look (a remote image), the attempt refuses the kernel as a config error."""
    cfg = compose_config([])
    cfg.model.attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigError, match="model.attn_implementation=flash_attention_2 cannot be used here"):
        common.load_model(common.resolve_model_path(cfg.model), cfg.model)


# ---------------------------------------------------------------- data: chat template, mix


MESSAGES = [{"role": "user", "content": "2 + 2 ="}, {"role": "assistant", "content": "4"}]


def test_a_named_or_file_chat_template_replaces_the_tokenizers(tmp_path):
    cfg = compose_config(["data.chat_template=llama3"])
    tok = common.tokenizer_for(cfg, common.resolve_model_path(cfg.model))
    assert "<|start_header_id|>user<|end_header_id|>" in tok.apply_chat_template(MESSAGES, tokenize=False)
    path = tmp_path / "mine.jinja"
    path.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    cfg = compose_config([f"data.chat_template={path}"])
    tok = common.tokenizer_for(cfg, common.resolve_model_path(cfg.model))
    assert tok.apply_chat_template(MESSAGES, tokenize=False) == "[user] 2 + 2 =\n[assistant] 4\n"
    rows = data.load_datasets(cfg.data, "sft")[0]
    before = data.fingerprint(rows, cfg.data)
    path.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert data.fingerprint(rows, cfg.data) != before, "an edited template changes the data fingerprint"


def test_a_broken_jinja_file_is_refused_at_launch(tmp_path):
    path = tmp_path / "bad.jinja"
    path.write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(UserError, match="is not valid Jinja"):
        compose_config([f"data.chat_template={path}"])


def _jsonl(path, rows):
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _mix(tmp_path, weights):
    a = _jsonl(tmp_path / "a.jsonl", [{"prompt": f"a{i}", "completion": " x"} for i in range(300)])
    b = _jsonl(tmp_path / "b.jsonl", [{"prompt": f"b{i}", "completion": " y"} for i in range(300)])
    items = ", ".join(f"{{path: {p}, weight: {w}}}" for p, w in zip((a, b), weights))
    return compose_config(["data.source=mix", f"data.mix=[{items}]", "data.max_eval_examples=10"])


def test_a_mix_draws_by_weight_deterministically_and_is_fingerprinted_as_one(tmp_path):
    cfg = _mix(tmp_path, (3, 1))
    train, _ = data.load_datasets(cfg.data, "sft")
    again, _ = data.load_datasets(cfg.data, "sft")
    assert list(train) == list(again), "the same rows in the same order on every attempt"
    share = sum(r["prompt"].startswith("a") for r in train) / len(train)
    assert 0.65 < share < 0.85, share
    other, _ = data.load_datasets(_mix(tmp_path, (1, 1)).data, "sft")
    assert data.fingerprint(train, cfg.data) == data.fingerprint(again, cfg.data) != data.fingerprint(other, cfg.data)


def test_mix_sources_with_other_columns_are_refused(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"prompt": "p", "completion": " c"}] * 4)
    b = _jsonl(tmp_path / "b.jsonl", [{"messages": MESSAGES}] * 4)
    cfg = compose_config(["data.source=mix", f"data.mix=[{{path: {a}}}, {{path: {b}}}]"])
    with pytest.raises(DataError, match="different columns"):
        data.load_datasets(cfg.data, "sft")
    with pytest.raises(UserError, match="is relative"):
        compose_config(["data.source=mix", "data.mix=[{path: a.jsonl}, {path: b.jsonl}]"])


def test_hub_revisions_reach_the_loaders(monkeypatch):
    import datasets

    seen = {}

    def fake_load_dataset(path, split=None, revision=None):
        seen.update(path=path, split=split, revision=revision)
        return datasets.Dataset.from_list([{"prompt": "p", "completion": " c"}] * 4)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    cfg = compose_config(["data=hub", "data.path=org/set", "data.revision=0123abc"])
    data.load_datasets(cfg.data, "sft")
    assert seen == {"path": "org/set", "split": "train", "revision": "0123abc"}


# ---------------------------------------------------------------- hub revisions: pinned, recorded


def test_hub_revisions_are_pinned_to_commits_at_launch_and_recorded(monkeypatch):
    from huggingface_hub import constants
    from omegaconf import OmegaConf

    from orchestrator.app import hub_pins
    from orchestrator.records import repro

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    asked = []

    def resolve(repo_type, repo_id, revision):
        asked.append((repo_type, repo_id, revision))
        return {"model": "a" * 40, "dataset": "b" * 40}[repo_type]

    overrides = ["model=qwen2.5-0.5b", "model.revision=main", "data=hub", "data.path=org/set"]
    cfg = compose_config(overrides)
    pinned = hub_pins.pin_revisions(cfg, overrides, resolve=resolve)
    assert asked == [("model", "Qwen/Qwen2.5-0.5B", "main"), ("dataset", "org/set", None)]
    assert pinned[-2:] == ["model.revision=" + "a" * 40, "data.revision=" + "b" * 40]
    assert "model.revision=main" not in pinned
    again = hub_pins.pin_revisions(compose_config(pinned), pinned, resolve=resolve)
    assert again == pinned and len(asked) == 2, "a commit is kept as it is"
    record = repro.inputs_record(OmegaConf.to_container(compose_config(pinned), resolve=True))
    assert record["model_input"] == "Qwen/Qwen2.5-0.5B@" + "a" * 40
    assert record["data_input"] == "hub:org/set@" + "b" * 40
    moved = dict(record, model_input="Qwen/Qwen2.5-0.5B@" + "c" * 40)
    assert any(line.startswith("model (hub id@revision)") for line in repro.diff_records(record, moved))
    assert hub_pins.pin_revisions(compose_config([]), [], resolve=resolve) == [] and len(asked) == 2, \
        "the built-in model and data have nothing to pin"


def test_the_attention_kernel_reaches_from_pretrained():
    cfg = compose_config(["model.attn_implementation=eager"])
    model = common.load_model(common.resolve_model_path(cfg.model), cfg.model)
    assert model.config._attn_implementation == "eager"
