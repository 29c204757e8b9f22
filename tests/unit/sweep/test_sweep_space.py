"""The sweep's search space: Hydra's override grammar (as the Optuna sweeper reads it) into Optuna distributions."""
from __future__ import annotations

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from orchestrator.config.compose import split_sweep_overrides
from orchestrator.core.errors import ConfigError
from orchestrator.sweep.space import SearchSpace


def space_of(*overrides: str) -> tuple[list[str], SearchSpace]:
    fixed, specs = split_sweep_overrides(list(overrides))
    return fixed, SearchSpace.from_specs(specs)


def test_each_form_of_the_optuna_sweepers_syntax_becomes_its_distribution():
    fixed, space = space_of("train.max_steps=12", "train.learning_rate=tag(log, interval(1e-5,1e-3))",
                            "train.warmup_steps=int(interval(0,10))", "recipe.lora_r=choice(8,16,32)",
                            "recipe.lora_alpha=16,32", "train.seed=range(1,4)")
    assert fixed == ["train.max_steps=12"]
    d = space.distributions()
    assert d["train.learning_rate"] == FloatDistribution(1e-5, 1e-3, log=True)
    assert d["train.warmup_steps"] == IntDistribution(0, 10)
    assert d["recipe.lora_r"] == CategoricalDistribution([8, 16, 32])
    assert d["recipe.lora_alpha"] == CategoricalDistribution([16, 32])
    assert d["train.seed"] == CategoricalDistribution([1, 2, 3])


def test_a_grid_is_every_combination_and_an_interval_has_none():
    _, space = space_of("train.learning_rate=1e-4,2e-4,5e-4", "recipe.lora_r=8,16")
    assert space.grid_size() == 6
    _, space = space_of("train.learning_rate=interval(1e-5,1e-3)")
    with pytest.raises(ConfigError, match="has no grid.*sweep.sampler=random"):
        space.grid()


@pytest.mark.parametrize("bad,needle", [
    ("train.learning_rate=interval(1e-5,", "does not parse"),
    ("train.learning_rate=interval(1e-3,1e-5)", "empty search space"),
    ("train.learning_rate=tag(log, interval(0,1))", "positive low end"),
])
def test_a_search_space_that_does_not_parse_is_one_config_error_with_the_syntax(bad, needle):
    with pytest.raises(ConfigError, match=needle):
        space_of(bad)


def test_the_difference_of_two_spaces_names_each_changed_key():
    _, old = space_of("train.learning_rate=interval(1e-5,1e-3)", "recipe.lora_r=8,16")
    _, new = space_of("train.learning_rate=interval(1e-5,1e-2)", "train.seed=1,2")
    assert new.difference(old) == ["recipe.lora_r: choice(8,16) -> (absent)",
                                   "train.learning_rate: interval(1e-05,0.001) -> interval(1e-05,0.01)",
                                   "train.seed: (absent) -> choice(1,2)"]
    assert SearchSpace.from_specs(old.to_json()).difference(old) == []  # what the state stores reads back equal
