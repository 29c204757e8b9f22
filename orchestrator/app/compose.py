"""The launch's config: composed (``orchestrator.config.compose``) and checked by every launch check
(``orchestrator.app.checks``): what ``launch``, ``orchestrator plan`` and ``orchestrator eval`` read."""

from __future__ import annotations

from omegaconf import DictConfig

from orchestrator.app.checks import validate
from orchestrator.config.compose import check_resolvable, composed


def compose_config(overrides: list[str], *, launch_checks: bool = True) -> DictConfig:
    """Compose and validate the job config. Raises ConfigError with the fix in the message.

    ``launch_checks=False`` (the worker, which runs the overrides the launcher already validated):
    only what can differ on the attempt's machine is checked again, that every value resolves
    (environment variables, a choice's too); the rest of the validation happens once, at launch.
    """
    cfg = composed(overrides)
    if launch_checks:
        validate(cfg)
    else:
        check_resolvable(cfg)
    return cfg
