"""The pre-flight planner: worked memory sums, sharding, cost, fallbacks and the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from orchestrator.planning import model_shape as model_config

from orchestrator.planning import plan

from orchestrator.planning import cost as plan_cost

from orchestrator.planning import memory as plan_memory
from orchestrator.config.schema import Config
from orchestrator.money.cost import Price
from orchestrator.core.errors import ConfigError
from tests.helpers.plans import LLAMA_7B, LLAMA_70B, full, job
from tests.helpers.paths import REPO

ROOT = REPO


def preset(name: str) -> dict:
    return json.loads((model_config.PRESETS_DIR / f"{name}.json").read_text())


def qlora(**extra):
    return job(recipe={"name": "qlora", "quantization": "nf4"}, **extra)


# ---------------------------------------------------------------- parameter counts


def test_shipped_configs_give_the_published_parameter_counts():
    assert model_config.count_parameters(preset("llama-3.1-8b"))["total"] == pytest.approx(8.03e9, rel=0.002)
    assert model_config.count_parameters(preset("qwen2.5-7b"))["total"] == pytest.approx(7.6e9, rel=0.01)
    assert model_config.count_parameters(preset("qwen2.5-0.5b"))["total"] == pytest.approx(0.494e9, rel=0.002)
    assert model_config.count_parameters(preset("llama-3.1-70b"))["total"] == pytest.approx(70.6e9, rel=0.002)
    assert model_config.count_parameters(LLAMA_7B)["total"] == 6_738_415_616  # Llama-2-7B, exactly
    tied = model_config.count_parameters(preset("qwen2.5-0.5b"))
    assert tied["lm_head"] == 0


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2.5-0.5b"])
def test_counts_match_a_real_model_and_peft(name):
    """A shrunk copy of each shipped architecture (GQA; Qwen2's q/k/v biases and tied
    embeddings) built by transformers has exactly the counted parameters and LoRA size."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = preset(name)
    config.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=100, bos_token_id=1, eos_token_id=2)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    assert model_config.count_parameters(config)["total"] == sum(p.numel() for p in model.parameters())
    targets = ["q_proj", "k_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=targets))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert model_config.lora_parameters(config, 4, targets) == trainable


def test_tiny_llama_config_is_the_builders_and_counts_right():
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = model_config.tiny_llama_config(OmegaConf.structured(Config).model)
    assert spec["intermediate_size"] == 4 * spec["hidden_size"] and spec["model_type"] == "llama"
    model = LlamaForCausalLM(LlamaConfig(**spec))
    assert model_config.count_parameters(spec)["total"] == sum(p.numel() for p in model.parameters())


def test_unknown_lora_target_is_a_config_error():
    with pytest.raises(ConfigError, match="lm_head_x.*all-linear"):
        model_config.lora_parameters(LLAMA_7B, 8, ["lm_head_x"])


# ---------------------------------------------------------------- worked memory sums


def test_full_finetune_7b_mixed_precision_is_16_bytes_per_param():
    p = plan_memory.estimate_memory(full(), LLAMA_7B)
    c, n = p.components, p.params["total"]
    assert c["weights"] == 2 * n and c["gradients"] == 2 * n and c["master_weights"] == 4 * n
    assert c["optimizer"] == 8 * n
    states = c["weights"] + c["gradients"] + c["master_weights"] + c["optimizer"]
    assert states / n == 16
    assert states == pytest.approx(112e9, rel=0.05)  # 6.74e9 params x 16 = 107.8 GB
    fp32 = plan_memory.estimate_memory(full(model={"dtype": "float32"}), LLAMA_7B).components
    assert "master_weights" not in fp32
    assert (fp32["weights"] + fp32["gradients"] + fp32["optimizer"]) / n == 16


def test_nf4_7b_base_is_half_a_byte_per_param_plus_constants():
    p = plan_memory.estimate_memory(qlora(), LLAMA_7B)
    c, linear = p.components, p.params["linear_weights"]
    assert c["quant_constants"] == round(linear * (8 / 64 + 32 / (64 * 256)) / 8)  # 0.127 bit/param
    base = c["weights"] + c["quant_constants"]
    assert 3.5e9 <= base <= 4.0e9  # 3.24 GB NF4 + 0.10 GB constants + 0.52 GB bf16 embeddings/lm_head
    unquantised = (p.params["total"] - linear) * 2
    assert (base - unquantised) / linear == pytest.approx(0.5 + 0.127 / 8, rel=0.001)


@pytest.mark.parametrize("config", [LLAMA_70B, preset("llama-3.1-70b")], ids=["llama-2-70b", "llama-3.1-70b"])
def test_nf4_70b_base_is_35_to_40_gb(config):
    c = plan_memory.estimate_memory(qlora(), config).components
    assert 35e9 <= c["weights"] + c["quant_constants"] <= 40e9


def test_lora_state_is_proportional_to_rank_and_target_count():
    def state(r, targets):
        return plan_memory.estimate_memory(job(recipe={"lora_r": r, "lora_target_modules": targets}), LLAMA_7B)

    r8, r16 = state(8, ["q_proj", "v_proj"]), state(16, ["q_proj", "v_proj"])
    def trainable_state(plan_):  # adapters + their gradients + Adam's two states
        return sum(plan_.components.get(k, 0) for k in ("adapters", "gradients", "master_weights", "optimizer"))

    assert trainable_state(r16) == 2 * trainable_state(r8)
    four = state(8, ["q_proj", "k_proj", "v_proj", "o_proj"])  # all 4096 x 4096 in Llama-2-7B
    assert trainable_state(four) == 2 * trainable_state(r8)
    assert r8.components["weights"] == r8.params["total"] * 2  # frozen base, no gradients for it


def test_zero2_over_8_gpus_shards_grads_and_optimizer_by_8():
    single = plan_memory.estimate_memory(full(), LLAMA_7B).components
    z2 = plan_memory.estimate_memory(full(distributed={"name": "zero2", "processes_per_node": 8}), LLAMA_7B).components
    for key in ("gradients", "master_weights", "optimizer"):
        assert z2[key] == pytest.approx(single[key] / 8, abs=1)
    assert z2["weights"] == single["weights"]
    z3 = plan_memory.estimate_memory(full(distributed={"name": "zero3", "processes_per_node": 8}), LLAMA_7B).components
    assert z3["weights"] == pytest.approx(single["weights"] / 8, abs=1)
    ddp = plan_memory.estimate_memory(full(distributed={"name": "ddp", "processes_per_node": 8}), LLAMA_7B).components
    assert ddp["optimizer"] == single["optimizer"]


def test_cpu_offload_moves_optimizer_states_off_the_gpu():
    cfg = full(distributed={"name": "zero3", "processes_per_node": 8, "cpu_offload": True})
    p = plan_memory.estimate_memory(cfg, LLAMA_7B)
    assert "optimizer" not in p.components and "master_weights" not in p.components
    assert p.cpu_offload_bytes == pytest.approx(12 * p.params["total"] / 8, abs=2)


def test_activation_checkpointing_reduces_activations():
    data = {"max_length": 2048}
    off = plan_memory.estimate_memory(full(data=data), LLAMA_7B)
    on = plan_memory.estimate_memory(full(data=data, train={"gradient_checkpointing": True}), LLAMA_7B)
    assert on.components["activations"] < off.components["activations"] / 5
    assert on.activations_alternative == off.components["activations"]
    dpo = plan_memory.estimate_memory(job(recipe={"name": "dpo"}, data=data), LLAMA_7B)
    sft = plan_memory.estimate_memory(job(data=data), LLAMA_7B)
    assert dpo.components["activations"] == 2 * sft.components["activations"]  # chosen + rejected


def test_fit_verdict_and_warning():
    p = plan_memory.estimate_memory(full(), LLAMA_7B)
    assert not plan_memory.fits(p, 80) and plan_memory.fits(p, 141 * 2)
    text = plan.format_plan(p, gpu_type="a100-80gb", memory_gb=80, options=[], cost=None)
    assert "WARNING: will NOT fit on a100-80gb" in text
    small = plan_memory.estimate_memory(qlora(), LLAMA_7B)
    assert plan_memory.fits(small, 24) and "fit: OK on l4" in plan.format_plan(small, gpu_type="l4", memory_gb=24,
                                                                        options=[], cost=None)


def test_gpu_types_that_fit_are_cheapest_run_first():
    catalog = {
        "a": {"memory_gb": 24, "clouds": {"x": {"on_demand": {"usd": 2.0}, "spot": {"usd": 1.0}}}},
        "b": {"memory_gb": 80, "clouds": {"x": {"on_demand": {"usd": 1.0}, "spot": {"usd": 0.5}}}},
        "c": {"memory_gb": 8, "clouds": {"x": {"on_demand": {"usd": 0.1}, "spot": {"usd": 0.05}}}},
    }
    cfg = qlora(compute={"gpu_type": "a", "spot": True})
    p = plan_memory.estimate_memory(cfg, LLAMA_7B)
    options = plan_cost.gpu_types_that_fit(p, cfg, catalog, LLAMA_7B)
    assert [o.gpu_type for o in options] == ["b", "a"]  # c is too small; a and b have no peak TFLOPs: by $/h
    assert options[0].usd_per_hour_total == 0.5


# ---------------------------------------------------------------- cost


def test_estimate_cost_counts_tokens_and_prices_spot_against_on_demand():
    cfg = job(train={"max_steps": 100, "per_device_batch_size": 4, "gradient_accumulation_steps": 2},
              data={"max_length": 512}, distributed={"name": "ddp", "processes_per_node": 2},
              compute={"gpu_type": "h100-80gb", "gpus_per_node": 2, "spot": True})
    price = Price(usd_per_hour_total=4.0, usd_per_gpu_hour=2.0, on_demand_usd_per_hour_total=10.0, source="test")
    est = plan_cost.estimate_cost(cfg, price, model_config=LLAMA_7B)
    assert est.tokens == 100 * 4 * 2 * 2 * 512
    assert est.usd < est.on_demand_usd and est.usd == pytest.approx(est.hours * 4.0)
    measured = plan_cost.estimate_cost(cfg, price, tokens_per_second=1000.0, model_config=LLAMA_7B)
    assert measured.hours == pytest.approx(est.tokens / 1000 / 3600)
    full_ft = plan_cost.estimate_cost(full(), price, model_config=LLAMA_7B)
    lora = plan_cost.estimate_cost(job(), price, model_config=LLAMA_7B)
    assert full_ft.flops_per_token == pytest.approx(1.5 * lora.flops_per_token)  # 6P vs 4P


# ---------------------------------------------------------------- loading config.json


def test_load_model_config_reads_a_local_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_7B))
    assert model_config.load_model_config(str(tmp_path)) == LLAMA_7B
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        model_config.load_model_config(str(tmp_path / "empty"))


def test_hub_unreachable_falls_back_to_the_shipped_preset(monkeypatch, caplog):
    monkeypatch.setattr(model_config, "_hub_config_path", lambda *a: (_ for _ in ()).throw(ConnectionError("offline")))
    assert model_config.load_model_config("meta-llama/Llama-3.1-8B", "llama-3.1-8b") == preset("llama-3.1-8b")
    assert "using the shipped presets/llama-3.1-8b.json" in caplog.text
    with pytest.raises(ConfigError, match="model.name_or_path to a local folder"):
        model_config.load_model_config("someone/unknown-model", "custom")


# ---------------------------------------------------------------- trial


def test_count_allocated_state_bytes_and_format_trial():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()
    n = sum(p.numel() for p in model.parameters())
    got = plan.count_allocated_state_bytes(model, optimizer)
    assert got["params"] == 4 * n and got["grads"] == 4 * n
    assert 8 * n <= got["optimizer"] <= 8 * n + 64  # exp_avg + exp_avg_sq, plus a scalar step per tensor
    p = plan_memory.estimate_memory(job(model={"name_or_path": "builtin:tiny-llama", "dtype": "float32"}))
    text = plan.format_trial(p, {**got, "peak_memory_bytes": 10**8, "step_time_s": 0.5, "data_wait_s": 0.2})
    assert "estimate" in text and "measured" in text and "WARNING: the data loader" in text
    assert "train.dataloader_num_workers=" in text, "the advice names the key that does it"


# ---------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "orchestrator", "plan", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.e2e
def test_cli_plans_qlora_llama_8b_on_l40s_offline():
    done = _cli("model=llama-3.1-8b", "recipe=qlora", "compute=l40s-spot")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "NF4 quantisation constants" in out and "total" in out
    assert "fit: OK on l40s" in out
    assert "GPU types that fit" in out
    assert "cost:" in out and "spot ~$" in out and "on-demand ~$" in out
    assert "shipped presets/llama-3.1-8b.json" in done.stderr


@pytest.mark.e2e
def test_cli_lists_the_gpu_types_in_the_order_it_says_on_a_job_of_unknown_duration():
    """The default job runs on compute=cpu (duration unknown); every GPU type's run rounds to $0.00, so the
    list is by the hour: t4 ($0.526/h) before l40s ($1.861/h), as the heading says."""
    import itertools
    import re

    done = _cli()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("GPU types that fit"))
    assert lines[start] == "GPU types that fit (cheapest run first, to the cent; then cheapest hour):", lines[start]
    rows = [re.match(r"  (\S+) +\d+ GB +\$([\d.,]+)/h +~\$([\d.,]+) for the run", line)
            for line in itertools.takewhile(lambda text: text.startswith("  "), lines[start + 1:])]
    order = [(float(m.group(3)), float(m.group(2))) for m in rows]
    assert order and order == sorted(order), lines[start:start + 10]
    names = [m.group(1) for m in rows]
    assert names.index("t4") < names.index("l40s"), names


@pytest.mark.e2e
def test_cli_warns_when_it_will_not_fit_and_exits_4_on_a_bad_config():
    done = _cli("model=llama-3.1-8b", "recipe=sft", "recipe.peft=full", "compute=l4-spot")
    assert done.returncode == 0, done.stderr
    assert "WARNING: will NOT fit on l4" in done.stdout
    bad = _cli("model=no-such-model")
    assert bad.returncode == 4 and "model=no-such-model" in bad.stderr


# ---------------------------------------------------------------- training options (#15)


def test_an_8bit_optimizer_holds_a_quarter_of_adams_states():
    adam = plan_memory.estimate_memory(full(model={"dtype": "float32"}), LLAMA_7B)
    eight = plan_memory.estimate_memory(full(model={"dtype": "float32"}, train={"optim": "paged_adamw_8bit"}), LLAMA_7B)
    n = adam.params["total"]
    assert adam.components["optimizer"] == 8 * n and eight.components["optimizer"] == 2 * n
    assert adam.total_bytes - eight.total_bytes == 6 * n
    assert any("8-bit states" in note for note in eight.notes)
    text = plan.format_plan(eight, gpu_type="a100-80gb", memory_gb=80, options=[], cost=None)
    assert "optimizer (paged_adamw_8bit)" in text and "paged_adamw_8bit" in eight.describe
    sgd = plan_memory.estimate_memory(full(train={"optim": "sgd"}), LLAMA_7B)
    assert "optimizer" not in sgd.components


def test_mixed_precision_counts_16bit_activations_and_autocast_copies_of_fp32_weights():
    seq = {"max_length": 1024}
    fp32 = plan_memory.estimate_memory(full(model={"dtype": "float32"}, data=seq), LLAMA_7B)
    amp = plan_memory.estimate_memory(full(model={"dtype": "float32"}, train={"mixed_precision": "bf16"}, data=seq), LLAMA_7B)
    p = amp.params
    assert amp.components["weights"] == fp32.components["weights"], "storage stays float32"
    assert amp.components["autocast_copies"] == 2 * (p["total"] - p["embeddings"] - p["norms"])
    assert amp.components["activations"] < fp32.components["activations"]
    assert amp.components["activations"] == plan_memory.activation_bytes(LLAMA_7B, 1024, 8, 2, False)
    bf16_weights = plan_memory.estimate_memory(full(train={"mixed_precision": "bf16"}), LLAMA_7B)
    assert "autocast_copies" not in bf16_weights.components, "16-bit weights need no 16-bit copy"


def test_float32_compute_is_priced_at_fp32_or_tf32_throughput():
    price = Price(usd_per_hour_total=2.0, usd_per_gpu_hour=2.0, on_demand_usd_per_hour_total=4.0, source="test")
    fp32 = dict(model={"dtype": "float32"})
    half = plan_cost.estimate_cost(job(**fp32, train={"mixed_precision": "bf16"}), price, model_config=LLAMA_7B)
    tf32 = plan_cost.estimate_cost(job(**fp32, train={"tf32": True}), price, model_config=LLAMA_7B)
    plain = plan_cost.estimate_cost(job(**fp32), price, model_config=LLAMA_7B)
    assert tf32.tokens_per_second == pytest.approx(half.tokens_per_second / 2)
    assert plain.tokens_per_second == pytest.approx(half.tokens_per_second / 16)
    assert "TF32" in tf32.basis and "FP32" in plain.basis and "16-bit" in half.basis


def test_padding_free_packing_under_sdpa_attends_over_the_flattened_batch():
    price = Price(usd_per_hour_total=2.0, usd_per_gpu_hour=2.0, on_demand_usd_per_hour_total=4.0, source="test")
    batch, seq = {"per_device_batch_size": 8}, {"max_length": 1024}
    padded = job(train=batch, data=seq)
    packed = job(train={**batch, "packing": True}, data=seq)
    flash = job(train={**batch, "packing": True}, model={"attn_implementation": "flash_attention_2"}, data=seq)
    mem = {name: plan_memory.estimate_memory(c, LLAMA_7B) for name, c in (("padded", padded), ("packed", packed), ("flash", flash))}
    tokens = 8 * 1024
    assert mem["packed"].components["activations"] - mem["flash"].components["activations"] == tokens * tokens
    assert mem["flash"].components["activations"] == mem["padded"].components["activations"]
    assert any("real tokens" in n for n in mem["packed"].notes) and any("upper bound" in n for n in mem["padded"].notes)
    d = model_config._dims(LLAMA_7B)
    fpt = {name: plan_cost.estimate_cost(c, price, model_config=LLAMA_7B).flops_per_token
           for name, c in (("padded", padded), ("packed", packed), ("flash", flash))}
    assert fpt["flash"] == fpt["padded"]
    assert fpt["packed"] - fpt["flash"] == pytest.approx(2 * 2 * d["layers"] * (tokens - 1024) * d["q_dim"])
    eager = plan_memory.estimate_memory(job(model={"attn_implementation": "eager"}, train=batch, data=seq), LLAMA_7B)
    assert eager.components["activations"] - mem["padded"].components["activations"] == \
        d["layers"] * d["heads"] * tokens * 1024 * 2
