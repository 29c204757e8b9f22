"""What a job prints on its console: a short plan, no library chatter, checkpoint lines at most once a minute,
no raw dicts of the Trainer's logs in a log that is not a terminal; everything in the job's log file."""
from __future__ import annotations

import logging

import pytest
from omegaconf import OmegaConf

from orchestrator.config.schema import Config
from orchestrator.planning import plan


def _job(**compute):
    return OmegaConf.merge(OmegaConf.structured(Config), {
        "recipe": {"name": "sft"}, "model": {"name_or_path": "builtin:tiny-llama"},
        "compute": {"gpu_type": "a100-80gb", "gpus_per_node": 1, **compute}})


def test_the_launch_plan_is_five_lines_pointing_at_the_whole_one():
    whole = plan.plan_text(_job()).splitlines()
    short = plan.short_plan_text(_job()).splitlines()
    assert len(whole) > 20 and len(short) == 5, short
    assert short[0] == whole[0] and short[0].startswith("plan: ")
    assert short[1].startswith("fit: OK on a100-80gb")
    assert short[2].startswith("cost: ") and short[3].startswith("recommendation: ")
    assert "orchestrator plan" in short[4]


def test_a_plan_that_will_not_fit_keeps_its_warning_in_the_short_plan():
    short = plan.short_plan_text(_job(gpu_type="t4", memory_gb=0.001)).splitlines()
    assert any(line.startswith("WARNING: will NOT fit on t4") for line in short), short
