"""Shared by the planner's tests: model configs, a composed-like job, and ``orchestrator plan`` as a user runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from orchestrator.config.schema import Config

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
LLAMA_7B = json.loads((FIXTURES / "llama-7b-config.json").read_text())
LLAMA_70B = json.loads((FIXTURES / "llama-70b-config.json").read_text())


def job(**groups) -> OmegaConf:
    """A composed-like config: schema defaults plus the given group values."""
    base = {"recipe": {"name": "sft"}, "model": {"name_or_path": "some/model", "dtype": "bfloat16"},
            "compute": {"gpu_type": "a100-80gb", "gpus_per_node": 1}}
    for group, values in groups.items():
        base.setdefault(group, {}).update(values)
    return OmegaConf.merge(OmegaConf.structured(Config), base)


def full(**extra):
    return job(recipe={"name": "sft", "peft": "full"}, **extra)


def run_plan(*args: str) -> subprocess.CompletedProcess:
    """``orchestrator plan ARGS`` in a fresh interpreter, offline (the shipped presets' shapes)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "orchestrator", "plan", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
