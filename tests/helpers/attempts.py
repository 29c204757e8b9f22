"""Shared by the tests: an attempt's config, its final weights' digest, and a crash after step 12."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.app.compose import compose_config
from orchestrator.attempt.build import build_attempt
from orchestrator.core.exitcodes import ExitClass

IN_PROCESS = ["train.max_steps=16", "train.logging_steps=4", "data.num_examples=120", "checkpoint.every=off",
              "checkpoint.every_steps=5", "preemption.provider=none", "tracking.enabled=false",
              "recipe.lora_dropout=0.1"]


def weights_digest(store, run: str) -> str:
    manifest = json.loads(store.get_bytes(f"{run}/final/manifest.json"))
    h = hashlib.sha256()
    for entry in sorted(manifest["files"], key=lambda e: e["path"]):
        if entry["path"].endswith(".safetensors"):
            h.update(store.get_bytes(f"{run}/final/{entry['path']}"))
    return h.hexdigest()


def attempt_cfg(tmp_path: Path, run: str, *extra: str):
    return compose_config(IN_PROCESS + [f"storage.uri={tmp_path / 'runs'}", f"run.name={run}",
                                        f"run.work_dir={tmp_path / 'work'}", *extra])


def crash_after_step_12(tmp_path: Path, run: str) -> None:
    """Attempt 1 of ``run`` crashes after step 12 (its newest checkpoint: step 10) and records it."""
    crashing = build_attempt(attempt_cfg(tmp_path, run), environ={"ORCH_FAULT_AFTER_STEPS": "12"})
    with pytest.raises(RuntimeError, match="injected fault"):
        crashing.run()
    crashing.fail(ExitClass.CRASHED)
