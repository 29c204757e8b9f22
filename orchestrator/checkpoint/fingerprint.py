"""Fingerprints of a training trajectory, and the check that a checkpoint belongs to it.

A checkpoint records the config fields that shape the trajectory and a hash of
the training data; resuming under other values would not continue the same run,
so it is refused with the differences and the override that allows it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from omegaconf import OmegaConf

from orchestrator.core.errors import ConfigError
from orchestrator.core.ranks import configured_world_size

log = logging.getLogger(__name__)

# Fields that do not shape the training trajectory; every other one is fingerprinted.
# Worker and process counts only change how fast batches are made, not which (the sampler stays in the main
# process), so a job may resume with other values.
_NON_TRAJECTORY = {
    "train": {"logging_steps", "eval_at_end", "trial_steps", "pause_at_step", "dataloader_num_workers"},
    "data": {"max_eval_examples", "num_proc", "prepared_cache"},
    "recipe": {"eval_generate_max_new_tokens"},
    "model": {"trust_remote_code"},
}


def _stored_form(key: str, value):
    """``value``, or its SHA-256 when it holds a secret: manifests live in the bucket, and a change still shows."""
    from orchestrator.core.redaction import redact

    if redact({key: value}) == {key: value}:
        return value
    return "sha256:" + hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def trajectory_config(cfg) -> dict:
    """The config fields that shape the training trajectory, flattened (secret values as their SHA-256); a choice
    as its string, as before the choices were ``Enum`` fields (checkpoints of then still resume)."""
    out = {}
    for group in ("recipe", "model", "data", "train"):
        fields: Any = OmegaConf.to_container(cfg[group], resolve=True, enum_to_str=True)
        for key, value in fields.items():
            if key not in _NON_TRAJECTORY.get(group, set()) and not (group == "model" and key == "preset"):
                out[f"{group}.{key}"] = _stored_form(key, value)
    out["distributed.name"] = str(cfg.distributed.name)
    out["distributed.world_size"] = configured_world_size(cfg)
    out.update(topology(cfg))
    return out


def topology(cfg) -> dict:
    """Nodes and processes per node: the same world size spread otherwise ranks its processes otherwise."""
    one = cfg.distributed.name == "none"
    return {
        "distributed.nodes": 1 if one else int(cfg.distributed.nodes),
        "distributed.processes_per_node": 1 if one else int(cfg.distributed.processes_per_node),
    }


_TOPOLOGY_DEFAULTS = {"distributed.nodes": 1}  # manifests written before the topology was recorded


def check_resumable(manifest: dict, trajectory: dict, dataset_fp: str, cfg) -> None:
    """Refuse a checkpoint of another trajectory, naming what changed and how to go on anyway."""
    meta = manifest.get("meta", {})
    name = f"{manifest['step']:09d}-{manifest['fence']:04d}"
    old = meta.get("trajectory", {})
    if "distributed.world_size" in old and "distributed.nodes" not in old:  # written before topology was kept
        old = dict(
            old,
            **_TOPOLOGY_DEFAULTS,
            **{"distributed.processes_per_node": trajectory.get("distributed.processes_per_node")},
        )
    changed = [
        f"{k}: {old.get(k)!r} -> {trajectory.get(k)!r}"
        for k in sorted(set(old) | set(trajectory))
        if old.get(k) != trajectory.get(k)
    ]
    old_world, new_world = old.get("distributed.world_size"), trajectory.get("distributed.world_size")
    old_shape = (old.get("distributed.nodes"), old.get("distributed.processes_per_node"))
    new_shape = (trajectory.get("distributed.nodes"), trajectory.get("distributed.processes_per_node"))
    if old_world == new_world and old_shape != new_shape and not cfg.checkpoint.allow_config_change:
        raise ConfigError(
            f"checkpoint {name} of job {cfg.run.name!r} was written by {old_shape[0]} node(s) x {old_shape[1]} "
            f"process(es); this attempt has {new_shape[0]} x {new_shape[1]}. Resume with distributed.nodes="
            f"{old_shape[0]} distributed.processes_per_node={old_shape[1]} (and compute.nodes={old_shape[0]}), or set "
            "checkpoint.allow_config_change=true to continue from the saved state (no longer bit-exact)."
        )
    if old_world is not None and old_world != new_world and not cfg.checkpoint.allow_config_change:
        raise ConfigError(
            f"checkpoint {name} of job {cfg.run.name!r} was written by {old_world} training processes; this "
            f"attempt has {new_world}. Per-rank RNG streams and the data order cannot be mapped exactly onto "
            f"another world size. Run with {old_world} processes (distributed.processes_per_node x "
            "distributed.nodes), or set checkpoint.allow_config_change=true to continue from the saved weights "
            "and optimizer state (LoRA adapters and unsharded optimizers load; the run is then no longer bit-exact)."
        )
    if changed and not cfg.checkpoint.allow_config_change:
        raise ConfigError(
            f"checkpoint {name} of job {cfg.run.name!r} was written with another config ({'; '.join(changed)}). "
            "Resuming would not continue the same run. Start a new job with another run.name, or set "
            "checkpoint.allow_config_change=true to resume anyway."
        )
    if meta.get("dataset_fingerprint") not in (None, dataset_fp) and not cfg.checkpoint.allow_data_change:
        raise ConfigError(
            f"the training data changed since checkpoint {name} of job {cfg.run.name!r} "
            f"(fingerprint {meta['dataset_fingerprint'][:12]} -> {dataset_fp[:12]}). Start a new job with another "
            "run.name, or set checkpoint.allow_data_change=true to resume on the new data."
        )
    for msg in changed:
        log.warning("resuming despite a changed config field (checkpoint.allow_config_change=true): %s", msg)
