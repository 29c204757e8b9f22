"""Shared by the tests: composing a job's config for a backend, and SkyPilot's own parser's venv."""
from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from orchestrator.app.compose import compose_config

USER_OVERRIDES = ["recipe=sft", "compute=h100-x8-spot", "distributed=ddp", "distributed.processes_per_node=8", "run.name=exp1", "storage.uri=s3://bucket/runs",
                  "storage.endpoint_url=http://minio:9000", "preemption.grace=30s"]


# scripts/test.sh builds .venv-skypilot (SkyPilot pins an older click than the project's stack needs)
SKYPILOT_PYTHON = os.environ.get("SKYPILOT_PYTHON", str(Path(__file__).resolve().parents[2] / ".venv-skypilot" / "bin" / "python"))


# the groups the auto settings derive from (orchestrator.config.defaults): a copy with one of them changed would keep
# the base's derived values, where the launcher derives them again
# (the base sets distributed.processes_per_node itself, so distributed.name derives nothing here)
DERIVING = ("compute.gpu_type=", "compute.gpus_per_node=", "model.name_or_path=", "model.dtype=", "recipe.name=",
            "recipe.peft=")


def compose(backend: str, *extra: str):
    """The composed config for ``backend`` plus ``extra`` overrides, and the override list.

    Composing costs about a second on a small machine, so the base config is
    composed once per backend with the real launcher code, and ``extra`` (plain
    ``key=value`` settings) is applied to a copy.
    """
    overrides = [*USER_OVERRIDES, f"backend={backend}", *extra]
    if any(item.startswith(DERIVING) for item in extra):  # the auto settings derive from these: compose for real
        return composed(tuple(overrides)), overrides
    cfg = copy.deepcopy(composed((*USER_OVERRIDES, f"backend={backend}")))
    for item in extra:
        key, _, value = item.partition("=")
        OmegaConf.update(cfg, key.lstrip("+"), yaml.safe_load(value), force_add=True)
    return cfg, overrides


@functools.lru_cache(maxsize=None)
def composed(overrides: tuple[str, ...]):
    return compose_config(list(overrides))
