"""Each backend's own settings (``backend.extra.*``), typed and checked once, at launch.

``backend.extra`` stays a free-form group in the config so one config tree
serves every backend; what a backend reads from it is declared here, as a
structured schema per backend that OmegaConf merges ``backend.extra`` into. An
unknown key, or a value of the wrong type, is a config error (exit 4) that
names the backend's keys, not a silently ignored setting.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Any, Optional

from orchestrator.core.errors import ConfigError

DEFAULT_K8S_SECRET_NAME = "spot-orchestrator"


@dataclass(frozen=True)
class _Settings:
    def __post_init__(self):  # OmegaConf hands a tuple field over as a list: keep the settings immutable
        for f in dataclasses.fields(self):
            if isinstance(getattr(self, f.name), list):
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))


@dataclass(frozen=True)
class LocalSettings(_Settings):
    """The local backend reads nothing from ``backend.extra``."""


@dataclass(frozen=True)
class SlurmSettings(_Settings):
    python: str = sys.executable  # the interpreter on the compute node (this launcher's suits a shared filesystem)
    output: Optional[str] = None  # the job's log file (Slurm patterns like %j); default <work_dir>/slurm/<run>-%j.out
    sbatch_args: tuple[str, ...] = ()  # more #SBATCH options (long form), e.g. ["--time=04:00:00", "--mem=64G"]
    # compute.zones: the partition of each zone's nodes, {us-east-1a: spot-a, ...}; the job asks for the listed
    # zones' partitions in the placement's order (--partition=spot-a,spot-b)
    zone_partitions: Optional[dict[str, str]] = None


@dataclass(frozen=True)
class SkyPilotSettings(_Settings):
    region: Optional[str] = None  # SkyPilot region
    disk_size: Optional[int] = None  # GB
    setup: Optional[str] = None  # a setup command replacing the default one
    # SkyPilot's file_mounts, {path on the VM: local path or bucket URI}; an input under a local source is
    # read on the VM at the mounted path
    file_mounts: Optional[dict[str, str]] = None


@dataclass(frozen=True)
class KubernetesSettings(_Settings):
    namespace: str = "default"
    secret_name: str = DEFAULT_K8S_SECRET_NAME  # the Secret the pod reads secret variables from
    service_account: Optional[str] = None  # for workload identity to the bucket
    cpu: Optional[str] = None  # resource request, e.g. "8"
    memory: Optional[str] = None  # request and limit, e.g. "64Gi"
    shm_size: Optional[str] = None  # cap on the memory-backed /dev/shm for checkpoint snapshots, e.g. "16Gi"
    image_paths: tuple[str, ...] = ()  # folders the image holds: an input path under one is read in the pod as is


SETTINGS = {
    "local": LocalSettings,
    "slurm": SlurmSettings,
    "skypilot": SkyPilotSettings,
    "kubernetes": KubernetesSettings,
}


def _type_error(key: str, hint: str, value: Any) -> ConfigError:
    """What a value of the wrong type for ``backend.extra.<key>`` (declared as ``hint``) should have been."""
    if hint.startswith("Optional[dict") and key == "zone_partitions":
        return ConfigError(
            f"backend.extra.{key} must map zones to partitions, e.g. "
            f"'+backend.extra.{key}={{us-east-1a: spot-a, us-east-1b: spot-b}}'; got {value!r}."
        )
    if hint.startswith("Optional[dict"):
        return ConfigError(
            f"backend.extra.{key} must map paths to paths, e.g. "
            f"'+backend.extra.{key}={{/data: /home/me/datasets}}'; got {value!r}."
        )
    if hint.startswith("tuple"):
        return ConfigError(f"backend.extra.{key} must be a list, e.g. backend.extra.{key}=[...]; got {value!r}.")
    if "int" in hint:
        return ConfigError(f"backend.extra.{key} must be a whole number; got {value!r}.")
    return ConfigError(f"backend.extra.{key} must be a single value; got {value!r}.")


def backend_settings(cfg: Any):
    """The typed settings of ``cfg.backend.name`` from ``cfg.backend.extra``. Raises ConfigError."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, ValidationError

    name = str(cfg.backend.name)
    schema = SETTINGS[name]
    given: Any = OmegaConf.to_container(cfg.backend.extra, resolve=True)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in given.items():  # a mapping holds paths: OmegaConf would turn a list in it into text
        if key in fields and isinstance(value, dict) and not all(isinstance(v, str) for v in value.values()):
            raise _type_error(key, str(fields[key].type), value)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), {k: v for k, v in given.items() if v is not None})
    except ConfigKeyError as err:
        known = ", ".join(sorted(fields)) or "none"
        raise ConfigError(
            f"backend.extra.{err.key} is not a setting of backend={name} (its settings: {known}). "
            "Remove it, or check the spelling (docs/scale-out.md lists each backend's settings)."
        ) from None
    except ValidationError as err:
        key = str(err.full_key or err.key).split(".")[0].split("[")[0]
        raise _type_error(key, str(fields[key].type) if key in fields else "", given.get(key)) from None
    return OmegaConf.to_object(merged)
