"""The hub inputs of a job, and the hub as huggingface_hub would reach it now: what the launch checks, the pins
and the backends (which forward ``HF_TOKEN`` to a job that reads from the hub) all ask the same way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

_TRUE = ("1", "on", "yes", "true")


def hub_inputs(cfg: Any) -> list[tuple[str, str, str, Optional[str]]]:
    """(override key, repo type, repo id, revision) of each hub input the job downloads."""
    out = []
    name = str(cfg.model.name_or_path)
    if not name.startswith(("builtin:", "/", "./", "../", "~", "s3://")) and not Path(name).expanduser().exists():
        out.append(("model.revision", "model", name, cfg.model.revision))
    if cfg.data.source == "hub" and cfg.data.path:
        out.append(("data.revision", "dataset", str(cfg.data.path), cfg.data.revision))
    return out


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as set now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
