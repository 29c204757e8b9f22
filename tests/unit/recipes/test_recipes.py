"""The three recipes train on CPU with real TRL trainers, and the default job learns its task."""
from __future__ import annotations

import pytest
import math
import re

import torch

from orchestrator.app.compose import compose_config
from recipes import data, dpo, qlora, sft
from tests.helpers import jobs
from tests.helpers.paths import REPO


def _trainer(module, overrides, tmp_path):
    cfg = compose_config(overrides)
    train, evald = data.load_datasets(cfg.data, cfg.recipe.name)
    return cfg, module.build_trainer(cfg, train_dataset=train, eval_dataset=evald, output_dir=str(tmp_path), callbacks=[]), evald


def test_qlora_base_is_4bit_and_only_adapters_change(tmp_path):
    import bitsandbytes as bnb

    cfg, trainer, _ = _trainer(qlora, ["recipe=qlora", "train.max_steps=5", "data.num_examples=100"], tmp_path)
    model = trainer.model
    four_bit = [n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(four_bit) >= 7 * cfg.model.num_layers, "every projection of every block is a 4-bit layer"
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert changed, "training changed nothing"
    assert changed <= trainable and all("lora_" in n for n in changed), sorted(changed - trainable)[:5]
    assert all("lora_" in n for n in trainable)
    # the quantised base weights themselves are untouched (they are not parameters that train)
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)


def test_nf4_under_sft_and_dpo_trains_on_a_4bit_base(tmp_path):
    """recipe.quantization=nf4 is planned and fingerprinted as a 4-bit base: SFT and DPO must load one
    (the loading path of recipe=qlora) and train only their adapters on it."""
    import bitsandbytes as bnb

    for module, recipe in ((sft, "sft"), (dpo, "dpo")):
        cfg, trainer, _ = _trainer(module, [f"recipe={recipe}", "recipe.quantization=nf4", "train.max_steps=2",
                                            "data.num_examples=64"], tmp_path / recipe)
        four_bit = [n for n, m in trainer.model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
        assert len(four_bit) >= 7 * cfg.model.num_layers, (recipe, len(four_bit))
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        trainer.train()
        assert before and all("lora_" in n for n in before), recipe
        assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters() if n in before)


def test_dpo_trains_adapters_against_the_frozen_base(tmp_path):
    cfg, trainer, evald = _trainer(dpo, ["recipe=dpo", "train.max_steps=10", "data.num_examples=100"], tmp_path)
    assert trainer.ref_model is None, "the frozen base (adapters disabled) is the reference"
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    assert all(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters() if n in before)
    metrics = dpo.evaluate(trainer, cfg, evald)
    assert 0.0 <= metrics["eval_reward_accuracy"] <= 1.0 and "eval_reward_margin" in metrics


def test_dpo_keeps_the_lora_dropout_it_was_given(tmp_path):
    """TRL's DPOConfig.disable_dropout (default true) zeroes every dropout after PEFT wraps the model;
    recipe.lora_dropout=0.1 must still be dropout at p=0.1 while DPO trains."""
    cfg, trainer, _ = _trainer(dpo, ["recipe=dpo", "recipe.lora_dropout=0.1", "train.max_steps=3",
                                     "data.num_examples=64"], tmp_path)
    trainer.train()  # lora_B starts at zero; after a few steps dropout on the adapters' input shows in the output
    model = trainer.model
    drops = [m for n, m in model.named_modules() if "lora_dropout" in n and isinstance(m, torch.nn.Dropout)]
    assert drops and all(m.p == 0.1 for m in drops), sorted({m.p for m in drops})
    model.train()
    ids = trainer.processing_class("12 + 30 =", return_tensors="pt")["input_ids"]
    torch.manual_seed(0)
    first, second = model(input_ids=ids).logits, model(input_ids=ids).logits
    assert not torch.equal(first, second), "two training-mode passes agree: no dropout is active"
    model.eval()
    assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.mlflow
def test_sft_full_fine_tune_trains_every_weight(tmp_path):
    cfg, trainer, _ = _trainer(sft, ["recipe.peft=full", "train.max_steps=3", "data.num_examples=64"], tmp_path)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    unchanged = [n for n, p in trainer.model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert not unchanged, f"a full fine-tune left these weights untouched: {unchanged}"


@pytest.mark.mlflow
def test_sft_accepts_chat_messages(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"{a} + {b} ="}, {"role": "assistant", "content": str(a + b)}]}
            for a in range(5) for b in range(5)]
    f = tmp_path / "chat.jsonl"
    import json

    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg, trainer, evald = _trainer(sft, ["data=jsonl", f"data.path={f}", "train.max_steps=3"], tmp_path / "out")
    # each row is rendered with the tokenizer's chat template: the user's turn, then the assistant's answer
    text = trainer.processing_class.decode(trainer.train_dataset[0]["input_ids"])
    turn = re.search(r"(\d+) \+ (\d+) =\s*A: (\d+)", text)
    assert turn and int(turn.group(3)) == int(turn.group(1)) + int(turn.group(2)), text
    trainer.train()
    summary = trainer.state.log_history[-1]
    assert trainer.state.global_step == 3 and math.isfinite(summary["train_loss"]), trainer.state.log_history
    assert isinstance(sft.accuracy(trainer, cfg, evald), float)


@pytest.mark.e2e
def test_default_job_improves_held_out_accuracy(tmp_path):
    """The README's default job: SFT + LoRA on the tiny model; accuracy after training beats before."""
    result = jobs.run_job([f"storage.uri={tmp_path / 'runs'}", "tracking.uri=sqlite:///" + str(tmp_path / "mlflow.db"),
                           "preemption.provider=none"], tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    m = re.search(r"held-out accuracy before training: ([0-9.]+); after: ([0-9.]+)", result.stdout)
    assert m, result.stdout[-2000:]
    before, after = map(float, m.groups())
    assert after > before + 0.05, (before, after)


def _modules_after_recipe_imports(overrides: list[str]) -> dict:
    """In a fresh interpreter, as the worker starts: skip what the job doesn't need, import the recipe stack."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from orchestrator.app.compose import compose_config\n"
        "from orchestrator.process.training_stack import skip_unused_deepspeed, skip_unused_quantisation_stack\n"
        f"cfg = compose_config({overrides!r})\n"
        "skip_unused_quantisation_stack(cfg)\n"
        "skip_unused_deepspeed(cfg)\n"
        "import peft, torch, trl, transformers\n"
        "from accelerate.utils import extract_model_from_parallel\n"
        "from recipes import common\n"
        "extract_model_from_parallel(torch.nn.Linear(1, 1))  # what TRL's trainer asks at construction\n"
        "print(json.dumps({'bitsandbytes': sys.modules.get('bitsandbytes') is not None,"
        " 'peft_sees_bnb': peft.import_utils.is_bnb_available(),"
        " 'transformers_sees_bnb': transformers.utils.is_bitsandbytes_available(),"
        " 'deepspeed': sys.modules.get('deepspeed') is not None,"
        " 'transformers_sees_deepspeed': bool(transformers.integrations.is_deepspeed_available())}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
def test_a_job_loads_bitsandbytes_and_deepspeed_only_when_it_uses_them():
    """Each costs seconds of every attempt's start-up (DeepSpeed imports MLflow too) when merely installed."""
    plain = _modules_after_recipe_imports(["recipe=sft"])
    assert plain == {"bitsandbytes": False, "peft_sees_bnb": False, "transformers_sees_bnb": False,
                     "deepspeed": False, "transformers_sees_deepspeed": False}, plain
    four_bit_zero2 = _modules_after_recipe_imports(["recipe=qlora", "distributed=zero2"])
    assert four_bit_zero2["peft_sees_bnb"] and four_bit_zero2["transformers_sees_bnb"], four_bit_zero2
    assert four_bit_zero2["transformers_sees_deepspeed"], four_bit_zero2


def test_evaluating_a_4bit_model_leaves_its_weights_in_the_training_layout(tmp_path):
    """bitsandbytes repacks 4-bit weights for inference on CPUs with AVX512-BF16 (this machine has it: see
    /proc/cpuinfo), and the way back is not exact: the "before training" evaluation must not change what
    training computes on, or an uninterrupted QLoRA run parts from a resumed one."""
    cfg, trainer, evald = _trainer(qlora, ["recipe=qlora", "train.max_steps=2", "data.num_examples=64"], tmp_path)
    layers = [m for m in trainer.model.modules() if hasattr(m, "support_avx512bf16_for_cpu")]
    assert layers
    before = [(m.weight.data.clone(), m.weight.quant_state.absmax.clone()) for m in layers]
    qlora.accuracy(trainer, cfg, evald)
    for m, (data_before, absmax_before) in zip(layers, before):
        assert not getattr(m.weight.quant_state, "packing_format_for_cpu", False)
        assert torch.equal(m.weight.data, data_before) and torch.equal(m.weight.quant_state.absmax, absmax_before)


def test_every_recipe_of_the_config_is_registered_and_provides_the_recipe_interface():
    """recipe.name's choices (conf/recipe/*.yaml) and the registry agree, and each module is a Recipe."""
    from pathlib import Path

    import recipes

    conf = {p.stem for p in (REPO / "conf" / "recipe").glob("*.yaml")}
    assert conf == set(recipes.REGISTRY)
    for name in sorted(conf):
        assert isinstance(recipes.recipe_for(name), recipes.Recipe)


def test_an_unregistered_recipe_is_a_config_error_naming_the_choices():
    import recipes
    from orchestrator.core.errors import ConfigError

    with pytest.raises(ConfigError, match="choose one of dpo, grpo, qlora, sft"):
        recipes.recipe_for("ppo")


def test_timed_loads_counts_only_the_loads_inside_it(monkeypatch):
    """The restart split's model-load figure: the loads inside a ``timed_loads`` block, nested blocks each."""
    from recipes import common

    ticks = iter([10.0, 12.5, 20.0, 21.0])  # outside: 10 -> 12.5; inside: 20 -> 21
    monkeypatch.setattr(common.time, "monotonic", lambda: next(ticks))
    common._count_load(common.time.monotonic())  # outside any block: counted nowhere
    with common.timed_loads() as outer:
        with common.timed_loads() as inner:
            common._count_load(common.time.monotonic())
    assert (outer.seconds, inner.seconds) == (1.0, 1.0)
