"""Values that passed the launch and crashed every attempt after it (issue 42, item 8), now found at launch (exit 4)
or read as the documented form means. Composed and checked in-process, as the launcher does."""
from __future__ import annotations

import pytest

from orchestrator.app.compose import compose_config
from orchestrator.core.errors import ConfigError


@pytest.mark.parametrize("overrides, needle", [
    (["recipe=grpo", "recipe.temperature=-1"], "recipe.temperature=-1: must be more than 0"),
    (["recipe=grpo", "recipe.temperature=0"], "recipe.temperature=0: must be more than 0"),
    # an optional list escaped the finite check, and a NaN weight silently dropped its reward
    (["recipe=grpo", "recipe.reward_weights=[nan,1.0]"], "recipe.reward_weights[0]=nan"),
    # 4x it is the ranks' collective timeout: a timedelta no process group holds
    (["distributed=ddp", "distributed.heartbeat_timeout=100000000000000000000000h"],
     "distributed.heartbeat_timeout='100000000000000000000000h' is more than 24 h"),
])
def test_a_value_that_crashed_every_attempt_is_refused_at_launch(overrides, needle):
    with pytest.raises(ConfigError) as err:
        compose_config(overrides)
    assert needle in str(err.value)


def test_a_folder_in_eval_tasks_means_every_task_in_it():
    """The documented form ``eval.tasks=[<folder>]`` passed the launch and crashed every attempt with the harness's
    "No tasks specified": the folder's tasks are the tasks now."""
    from pathlib import Path

    from orchestrator.evaluation import spec

    folder = Path(spec.__file__).parent / "tasks" / "tiny_arith"
    cfg = compose_config([f"eval.tasks=[{folder}]"])
    assert sorted(spec.resolve(cfg.eval).names) == ["tiny_arith_gen", "tiny_arith_mc"]


def test_a_folder_without_a_task_is_refused_naming_it(tmp_path):
    (tmp_path / "shared.yaml").write_text("output_type: multiple_choice\n")  # settings for include:, no task
    with pytest.raises(ConfigError, match="holds no task YAML"):
        compose_config([f"eval.tasks=[{tmp_path}]"])
