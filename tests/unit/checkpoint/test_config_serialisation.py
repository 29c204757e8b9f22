"""Checkpoints written before the typed config still resume: the fingerprint and ``config.yaml`` serialise as before.

``tests/fixtures/config_serialisation.json`` holds, for a few composed jobs, what the code wrote before the config's
choices became ``Enum`` fields (commit aa57e94): the trajectory fingerprint stored in every checkpoint's manifest,
the ``config.yaml`` beside the final weights, and the overrides the backends hand the worker. A checkpoint of such a
job must pass the resume check of today's code, and today's code must write the same bytes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.attempt.resolved import resolve
from orchestrator.checkpoint.fingerprint import check_resumable, trajectory_config
from orchestrator.app.compose import compose_config
from tests.helpers.paths import FIXTURES

FIXTURE = FIXTURES / "config_serialisation.json"

JOBS = {
    "default": [],
    "dpo": ["recipe=dpo", "recipe.precompute_ref_log_probs=true"],
    "qlora-bf16": ["recipe=qlora", "train.mixed_precision=bf16"],
    "grpo": ["recipe=grpo"],
    "sft-packed-full": ["recipe.peft=full", "train.packing=true", "train.packing_strategy=wrapped",
                        "checkpoint.final=best", "train.eval_steps=10", "tracking.progress=lines", "preemption.provider=none"],
    "ddp-mix": ["distributed=ddp", "distributed.processes_per_node=2", "model.dtype=bfloat16",
                "data.source=mix", "data.mix=[{source: synthetic, seed: 1}, {source: synthetic, seed: 2, weight: 3}]"],
}


def serialised(overrides: list[str]) -> dict:
    """What a job of these overrides writes that a later attempt or a reader compares against."""
    cfg = compose_config(overrides + ["storage.uri=/runs", "run.work_dir=/work"])
    resolved = resolve(cfg)  # what the attempt writes: config.yaml and MLflow's params, from one resolved dict
    return {"trajectory": json.loads(json.dumps(trajectory_config(cfg), sort_keys=True)),
            "config_yaml": resolved.yaml,
            "params": json.loads(json.dumps(resolved.plain, sort_keys=True))}


def _stored() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_checkpoint_written_before_the_typed_config_resumes(job):
    stored = _stored()[job]
    cfg = compose_config(JOBS[job] + ["storage.uri=/runs", "run.work_dir=/work"])
    manifest = {"step": 20, "fence": 1, "meta": {"trajectory": stored["trajectory"], "dataset_fingerprint": "d" * 64}}
    check_resumable(manifest, trajectory_config(cfg), "d" * 64, cfg)  # raises ConfigError naming a changed field


def _as_before(now, before):
    """``now`` cut to the keys ``before`` has (keys added since, by new features, are not a serialisation change)."""
    if isinstance(now, dict) and isinstance(before, dict):
        return {k: _as_before(now[k], before[k]) if k in now else "<missing>" for k in before}
    return now


@pytest.mark.parametrize("job", sorted(JOBS))
def test_the_fingerprint_and_config_yaml_serialise_as_before(job):
    """Every key the old code wrote serialises to the same value (a choice as its plain string, not an Enum tag)."""
    now, before = serialised(JOBS[job]), _stored()[job]
    assert "!!python" not in now["config_yaml"]
    now_yaml, before_yaml = yaml.safe_load(now["config_yaml"]), yaml.safe_load(before["config_yaml"])
    assert _as_before(now_yaml, before_yaml) == before_yaml
    assert _as_before(now["trajectory"], before["trajectory"]) == before["trajectory"]
    assert _as_before(now["params"], before["params"]) == before["params"]


if __name__ == "__main__":  # regenerate the fixture (only when the serialisation is meant to change)
    FIXTURE.write_text(json.dumps({name: serialised(o) for name, o in JOBS.items()}, indent=1, sort_keys=True) + "\n")
