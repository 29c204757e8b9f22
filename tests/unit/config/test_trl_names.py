"""A TRL user's command line: TRL's option names take effect, and a ``+key`` nothing reads is refused (exit 4)."""
from __future__ import annotations

import pytest

from orchestrator.app.compose import compose_config
from orchestrator.core.errors import ConfigError
from orchestrator.core.exitcodes import CONFIG_ERROR

TRL_LINE = ["train.per_device_train_batch_size=4", "+train.warmup_ratio=0.25", "train.lr_scheduler_type=cosine",
            "train.num_train_epochs=2", "train.max_length=32", "+train.gradient_accumulation_steps=2", "train.bf16=false",
            "train.save_steps=7"]


def test_trls_names_take_effect_in_the_built_sft_config(tmp_path):
    from trl import SFTConfig

    from recipes import common

    cfg = compose_config(TRL_LINE)
    args = SFTConfig(**common.training_kwargs(cfg, str(tmp_path)))
    assert args.per_device_train_batch_size == 4 and args.gradient_accumulation_steps == 2
    assert args.get_warmup_steps(100) == 25, "warmup_ratio warms up a quarter of 100 steps"
    assert args.lr_scheduler_type == "cosine" and args.num_train_epochs == 2 and args.max_length == 32
    assert not args.bf16 and cfg.checkpoint.every_steps == 7
    # the worker composes the same overrides again: the same config
    assert compose_config(TRL_LINE, launch_checks=False) == cfg


def test_precision_and_recipe_options_under_trls_names():
    assert compose_config(["+train.bf16=true"], launch_checks=False).train.mixed_precision == "bf16"
    cfg = compose_config(["recipe=grpo", "train.num_generations=2", "+train.max_completion_length=6", "beta=0.04"])
    assert cfg.recipe.num_generations == 2 and cfg.recipe.max_completion_length == 6 and cfg.recipe.beta == 0.04
    assert compose_config(["recipe=dpo", "train.beta=0.3"]).recipe.dpo_beta == 0.3


def test_trls_names_written_bare_as_its_cli_has_them_are_the_training_options():
    cfg = compose_config(["learning_rate=1e-4", "per_device_train_batch_size=2", "bf16=true", "warmup_ratio=0.1",
                          "gradient_accumulation_steps=4"], launch_checks=False)
    assert (cfg.train.learning_rate, cfg.train.per_device_batch_size, cfg.train.mixed_precision,
            cfg.train.warmup_ratio, cfg.train.gradient_accumulation_steps) == (1e-4, 2, "bf16", 0.1, 4)


@pytest.mark.parametrize("overrides,needles", [
    (["+train.adam_beta1=0.9"], ["+train.adam_beta1=0.9", "nothing reads train.adam_beta1", "learning_rate, lr_scheduler"]),
    (["+num_examples=100"], ["nothing reads num_examples", "Did you mean data.num_examples"]),
    (["+recipe.num_generation=4", "recipe=grpo"], ["nothing reads recipe.num_generation", "recipe.num_generations"]),
    (["+data.hf_token=x"], ["nothing reads data.hf_token", "+run.notes.NAME=VALUE"]),
    (["train.warmup_ratio=1.5"], ["train.warmup_ratio=1.5 must be in [0, 1)"]),
    (["train.warmup_ratio=0.1", "train.warmup_steps=10"], ["both set the warm-up"]),
    (["train.bf16=maybe"], ["train.bf16=maybe", "true or false"]),
    # TRL's options the orchestrator sets itself: what to use instead
    (["train.output_dir=out"], ["train.output_dir", "storage.uri"]),
    (["+train.report_to=wandb"], ["nothing reads train.report_to", "tracking.enabled"]),
    (["save_strategy=steps"], ["save_strategy", "checkpoint.every"]),
])
def test_an_option_nothing_reads_is_refused_naming_it_and_the_fix(overrides, needles):
    with pytest.raises(ConfigError) as err:
        compose_config(overrides)
    message = str(err.value)
    assert err.value.exit_code == CONFIG_ERROR == 4 and "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_free_form_keys_are_still_added_where_the_schema_takes_any():
    cfg = compose_config(["+run.notes.ticket=ML-12", "+experiment=qwen-7b-qlora-spot"], launch_checks=False)
    assert cfg.run.notes.ticket == "ML-12" and cfg.train.mixed_precision == "bf16"


def test_an_unread_plus_key_exits_4_from_the_launcher_before_anything_runs(tmp_path, capsys):
    from orchestrator import launch

    runs = tmp_path / "runs"
    assert launch.main([f"storage.uri={runs}", "+train.adam_beta1=0.9"]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: +train.adam_beta1=0.9: nothing reads"), err
    assert not runs.exists()
