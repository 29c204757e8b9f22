"""A real model gets what a TRL user would choose, the built-in tiny model keeps the CPU demo's settings.

``train.learning_rate``, ``train.gradient_checkpointing``, ``train.mixed_precision`` and
``distributed.processes_per_node`` default to auto (``orchestrator.config.defaults``): composed in-process, as the
launcher and the worker compose, and built into TRL's own config where the Trainer reads them.
"""
from __future__ import annotations

import pytest

from orchestrator.app.compose import compose_config

REAL = ["model=llama-3.1-8b", "model.name_or_path=/models/llama-3.1-8b"]  # a local copy: no hub asked


def _settings(overrides):
    cfg = compose_config(overrides, launch_checks=False)
    return (cfg.train.learning_rate, cfg.train.gradient_checkpointing, str(cfg.train.mixed_precision),
            cfg.distributed.processes_per_node)


def test_the_cpu_demo_keeps_its_settings():
    assert _settings([]) == (5e-3, False, "no", 1)
    assert _settings(["distributed=zero2"]) == (5e-3, False, "no", 2)  # the CPU demonstration of ZeRO: 2 processes


@pytest.mark.parametrize("overrides, expected", [
    (["recipe=qlora", "compute=l40s-spot"], (2e-4, True, "bf16", 1)),  # QLoRA adapters on a bf16 GPU
    (["recipe=sft", "compute=a100-80gb-spot"], (2e-4, True, "bf16", 1)),  # LoRA SFT
    (["recipe=sft", "recipe.peft=full", "compute=h100-x8-spot", "distributed=zero3"], (2e-5, True, "bf16", 8)),
    (["recipe=dpo", "compute=a10g-spot"], (5e-6, True, "bf16", 1)),
    (["recipe=grpo", "recipe.peft=full", "compute=h100-spot"], (1e-6, True, "bf16", 1)),
    (["recipe=sft", "compute=t4-spot", "model.dtype=float32"], (2e-4, True, "fp16", 1)),  # no bf16 on a T4
])
def test_a_real_model_gets_trls_choices_for_its_recipe_adapters_and_gpu(overrides, expected):
    assert _settings(REAL + overrides) == expected


def test_what_the_user_gives_wins_and_reaches_trls_config(tmp_path):
    from trl import SFTConfig

    from recipes import common

    cfg = compose_config(REAL + ["recipe=sft", "compute=cpu"], launch_checks=False)
    args = SFTConfig(**common.training_kwargs(cfg, str(tmp_path)))
    assert args.learning_rate == 2e-4 and args.gradient_checkpointing  # what a TRL user would set, in TRL's config
    given = compose_config(REAL + ["train.learning_rate=1e-5", "train.gradient_checkpointing=false",
                                   "train.mixed_precision=no", "compute=a100-80gb-spot"], launch_checks=False)
    assert (given.train.learning_rate, given.train.gradient_checkpointing, str(given.train.mixed_precision)) == \
        (1e-5, False, "no")


def test_the_plan_says_when_it_prices_the_demos_placeholder_data(monkeypatch, tmp_path):
    """``plan model=llama-3.1-8b ...`` priced 300 steps of the built-in arithmetic data as "~$0.01 for the run",
    silently: it says so now, and the demo's own plan and a job with its own data do not."""
    from orchestrator.planning.plan import plan_text

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the shipped preset's shape, no hub
    real = compose_config(["model=llama-3.1-8b", "recipe=qlora", "compute=l40s-spot"], launch_checks=False)
    assert "WARNING: these figures price 300 steps of the built-in arithmetic data" in plan_text(real)
    assert "WARNING" not in plan_text(compose_config([], launch_checks=False))
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    own = compose_config(["model=llama-3.1-8b", "recipe=qlora", "compute=l40s-spot", "data=jsonl",
                          f"data.path={tmp_path / 'train.jsonl'}"], launch_checks=False)
    assert "built-in arithmetic data" not in plan_text(own)
