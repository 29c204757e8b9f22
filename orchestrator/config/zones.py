"""``compute.zones`` and ``compute.zone_cooldown``: where a job may run, read once.

``compute.zones`` is unset (the backend's default: one zone, the cloud's or the cluster's choice), ``auto`` (every
zone that offers the GPU type: the zones with a fetched price, ``orchestrator prices refresh``), or a list of zone
names (``[us-east-1a,us-west-2b]``): the zones the placement policy (``orchestrator.policy.placement``) ranks for
each attempt. ``compute.zone_cooldown`` is how long a zone that just preempted the job is avoided while another
has capacity.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Union

from orchestrator.core.durations import parse_duration
from orchestrator.core.errors import ConfigError

AUTO = "auto"
CPU_TYPES = ("none", "cpu")
# a cloud zone or region (us-east-1a, europe-west4-b, eastus-1) or a cluster's zone label: lower-case words and digits
ZONE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

Zones = Union[tuple[str, ...], str, None]  # the names, AUTO, or None (the backend's default)


def configured_zones(value: Any) -> Zones:
    """``compute.zones`` as given: None, ``AUTO``, or the tuple of names in the user's order. ConfigError else."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() == AUTO:
            return AUTO
        value = [part.strip() for part in value.split(",")]  # compute.zones=us-east-1a,us-east-1b from a shell
    if not isinstance(value, Sequence) or isinstance(value, (bytes, bytearray)):
        raise ConfigError(
            f"compute.zones={value!r} must be a list of zone names or auto; set e.g. "
            "compute.zones=[us-east-1a,us-west-2b] or compute.zones=auto."
        )
    names = [str(name).strip() for name in value]
    bad = [name for name in names if not ZONE_NAME.match(name)]
    if bad:
        raise ConfigError(
            f"compute.zones has {', '.join(repr(n) for n in bad)}: a zone is lower-case letters, "
            "digits and '-' (us-east-1a, europe-west4-b); set e.g. compute.zones=[us-east-1a,us-west-2b]."
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"compute.zones={names} names a zone twice; list each zone once.")
    if not names:
        return None
    return tuple(names)


def zone_cooldown_seconds(value: Any) -> float:
    """``compute.zone_cooldown`` in seconds (``10m``, ``0``: never avoided)."""
    try:
        return parse_duration(value, key="compute.zone_cooldown")
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_zones(cfg: Any) -> None:
    """The launch check of ``compute.zones`` and ``compute.zone_cooldown`` (exit 4)."""
    zones = configured_zones(cfg.compute.zones)
    zone_cooldown_seconds(cfg.compute.zone_cooldown)
    if zones is not None and str(cfg.compute.gpu_type or "none").lower() in CPU_TYPES:
        raise ConfigError(
            f"compute.zones={cfg.compute.zones} places a GPU job, but compute.gpu_type="
            f"{cfg.compute.gpu_type}: pick a GPU preset (compute=a100-spot) or drop compute.zones."
        )
