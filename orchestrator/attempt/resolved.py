"""The job config as plain data, made once per attempt by ``orchestrator.attempt.build``.

Hydra composes the config into a ``DictConfig``; what an attempt writes of it (MLflow's params, the repro record's
hash and inputs, ``config.yaml`` beside the final weights and in MLflow) comes from one resolved dict, and its
redacted copy, made here, so they cannot drift apart. The parts that only read settings get the typed view
(``orchestrator.config.typed.JobConfig``: the groups as the schemas' dataclasses, the durations parsed); the
``DictConfig`` stays with what needs OmegaConf or the whole config (the trajectory fingerprint, the recipes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf


@dataclass(frozen=True)
class ResolvedConfig:
    """``plain``: the resolved config (MLflow's params, redacted by the tracker; the repro record); ``redacted``:
    the same with its secrets replaced (``orchestrator.core.redaction.redact``); ``yaml``: ``redacted`` as the
    ``config.yaml`` the final weights and the MLflow run carry. Shared by the parts: read, never changed."""

    plain: dict
    redacted: dict
    yaml: str


def resolve(cfg: Any) -> ResolvedConfig:
    from orchestrator.core.redaction import redact

    plain: Any = OmegaConf.to_container(cfg, resolve=True)
    redacted = redact(plain)
    return ResolvedConfig(plain=plain, redacted=redacted, yaml=OmegaConf.to_yaml(redacted))
