"""``compute.zones`` for the backends: the zones a submission is placed in, in the placement policy's order, and the
variable that tells the attempt which zone it runs in.

``zone_order`` asks ``orchestrator.planning.zone_order.ranked_zones`` (the policy: least expected dollars per
useful hour first, a zone that just preempted the job avoided) and each backend renders that order its own way:
SkyPilot as ``resources.ordered``, Kubernetes as weighted preferred node affinities on ``ZONE_LABEL``, Slurm as a
list of partitions (``backend.extra.zone_partitions``). ``ZONE_ENV`` (``ORCH_ZONE``) carries the attempt's zone
where the backend knows it (empty where it does not).
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, NamedTuple, Optional

from orchestrator.config.zones import AUTO, configured_zones
from orchestrator.core.env import ZONE_ENV  # noqa: F401 - the backends' import: the attempt's zone (attempt.zone reads it)
from orchestrator.core.errors import ConfigError

log = logging.getLogger(__name__)

ZONE_LABEL = "topology.kubernetes.io/zone"  # the well-known node label of a node's zone
MAX_WEIGHT, MIN_WEIGHT = 100, 1  # a preferred node affinity term's weight: 1..100
PARTITION_NAME = re.compile(r"^[^\s,'\"]+$")  # one Slurm partition: a comma would make it a list


class Placement(NamedTuple):
    zone: str
    region: Optional[str] = None


def zone_order(cfg: Any) -> list[Placement]:
    """The zones this submission may run in, best first; [] when ``compute.zones`` is unset (the backend's default).

    The ranking reads the job's ledger (its preemptions per zone); when the store cannot be read it is the
    configured order (``auto``: none), with a warning: a launch is not held up by an outage of the bucket.
    """
    zones = configured_zones(cfg.compute.zones)
    if zones is None:
        return []
    from orchestrator.planning.zone_order import ranked_zones
    from orchestrator.storage import store_from_config
    from orchestrator.storage.base import TransientStorageError

    try:
        ranked = ranked_zones(cfg, store_from_config(cfg.storage, retry=False))
    except (TransientStorageError, OSError) as err:
        log.warning(
            "compute.zones: could not read the job's history from %s (%s); placing in the configured order",
            cfg.storage.uri,
            err,
        )
        return [] if zones == AUTO else [Placement(zone) for zone in zones]
    return [Placement(z.zone, z.region) for z in ranked]


def affinity_weights(count: int) -> list[int]:
    """``count`` weights from 100 down to 1, evenly spread and strictly descending (ties past 100 zones)."""
    if count <= 1:
        return [MAX_WEIGHT] * count
    step = (MAX_WEIGHT - MIN_WEIGHT) / (count - 1)
    return [max(MIN_WEIGHT, math.floor(MAX_WEIGHT - i * step + 0.5)) for i in range(count)]


def zone_partitions(cfg: Any, zones: list[Placement]) -> list[str]:
    """Slurm: the partitions of ``zones``, in their order (a partition two zones share once), from
    ``backend.extra.zone_partitions``. ConfigError naming the fix for a zone without one."""
    from orchestrator.backends.settings import backend_settings

    mapping = backend_settings(cfg).zone_partitions or {}
    missing = [z.zone for z in zones if z.zone not in mapping]
    if missing:
        known = ", ".join(f"{k}: {v}" for k, v in mapping.items()) or "none"
        raise ConfigError(
            f"compute.zones places the job in {', '.join(missing)}, but backend=slurm has no partition for "
            f"{'it' if len(missing) == 1 else 'them'} (backend.extra.zone_partitions: {known}). Map each zone to "
            f"the partition of its nodes, e.g. '+backend.extra.zone_partitions={{{missing[0]}: spot-a}}', or drop "
            "the zone from compute.zones."
        )
    return list(dict.fromkeys(mapping[z.zone] for z in zones))


def check_zone_settings(cfg: Any) -> None:
    """The launch check of the backends' zone settings (exit 4): Slurm's ``zone_partitions`` (a partition for every
    listed zone, one partition name each; ``auto`` lists cloud zones no partition names), SkyPilot's
    ``region`` beside ``compute.zones`` (each zone names its place)."""
    from orchestrator.backends.settings import backend_settings

    name = str(cfg.backend.name)
    try:
        zones = configured_zones(cfg.compute.zones)
        settings = backend_settings(cfg)
    except ConfigError:
        return  # the checks of compute.zones and of the backend's settings report it
    if zones is None or name not in ("slurm", "skypilot"):
        return
    if name == "skypilot" and settings.region:
        raise ConfigError(
            f"backend.extra.region={settings.region} and compute.zones={cfg.compute.zones} both place "
            "the job: drop backend.extra.region (each zone names where it runs), or drop compute.zones."
        )
    if name != "slurm":
        return
    bad = [f"{k}: {v}" for k, v in (settings.zone_partitions or {}).items() if not PARTITION_NAME.match(str(v))]
    if bad:
        raise ConfigError(
            f"backend.extra.zone_partitions has {', '.join(bad)}: each zone maps to one partition "
            "name (no commas or spaces), e.g. {us-east-1a: spot-a}."
        )
    if zones == AUTO:
        raise ConfigError(
            "compute.zones=auto lists the cloud zones with a fetched price, which backend=slurm has no "
            "partitions for: list the zones your partitions are in, e.g. compute.zones=[us-east-1a,"
            "us-east-1b] with '+backend.extra.zone_partitions={us-east-1a: spot-a, us-east-1b: spot-b}'."
        )
    zone_partitions(cfg, [Placement(zone) for zone in zones])
