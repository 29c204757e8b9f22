"""Each backend's own settings (``backend.extra.*``), typed and checked once, at launch.

``backend.extra`` stays a free-form group in the config so one config tree
serves every backend; what a backend reads from it is declared here, with its
type and default. An unknown key, or a value of the wrong type, is a config
error (exit 4) that names the backend's keys, not a silently ignored setting.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Any, Optional, Union, get_args, get_origin, get_type_hints

from orchestrator.errors import ConfigError

DEFAULT_K8S_SECRET_NAME = "spot-orchestrator"


@dataclass(frozen=True)
class LocalSettings:
    """The local backend reads nothing from ``backend.extra``."""


@dataclass(frozen=True)
class SlurmSettings:
    python: str = sys.executable  # the interpreter on the compute node (this launcher's suits a shared filesystem)
    output: Optional[str] = None  # the job's log file (Slurm patterns like %j); default <work_dir>/slurm/<run>-%j.out
    sbatch_args: tuple[str, ...] = ()  # more #SBATCH options (long form), e.g. ["--time=04:00:00", "--mem=64G"]


@dataclass(frozen=True)
class SkyPilotSettings:
    region: Optional[str] = None  # SkyPilot region
    disk_size: Optional[int] = None  # GB
    setup: Optional[str] = None  # a setup command replacing the default one
    # SkyPilot's file_mounts, {path on the VM: local path or bucket URI}; an input under a local source is
    # read on the VM at the mounted path
    file_mounts: Optional[dict] = None


@dataclass(frozen=True)
class KubernetesSettings:
    namespace: str = "default"
    secret_name: str = DEFAULT_K8S_SECRET_NAME  # the Secret the pod reads secret variables from
    service_account: Optional[str] = None  # for workload identity to the bucket
    cpu: Optional[str] = None  # resource request, e.g. "8"
    memory: Optional[str] = None  # request and limit, e.g. "64Gi"
    shm_size: Optional[str] = None  # cap on the memory-backed /dev/shm for checkpoint snapshots, e.g. "16Gi"
    image_paths: tuple[str, ...] = ()  # folders the image holds: an input path under one is read in the pod as is


SETTINGS = {"local": LocalSettings, "slurm": SlurmSettings, "skypilot": SkyPilotSettings,
            "kubernetes": KubernetesSettings}


def _coerce(key: str, value: Any, hint: Any):
    """``value`` as the field's type; raises ConfigError naming the key."""
    if get_origin(hint) is Union:  # Optional[X]
        if value is None:
            return None
        hint = next(a for a in get_args(hint) if a is not type(None))
    if hint is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ConfigError(f"backend.extra.{key} must map paths to paths, e.g. "
                              f"'+backend.extra.{key}={{/data: /home/me/datasets}}'; got {value!r}.")
        return dict(value)
    if get_origin(hint) is tuple:
        if isinstance(value, str) or not hasattr(value, "__iter__"):
            raise ConfigError(f"backend.extra.{key} must be a list, e.g. backend.extra.{key}=[...]; got {value!r}.")
        return tuple(str(v) for v in value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
            raise ConfigError(f"backend.extra.{key} must be a whole number; got {value!r}.")
        return int(value)
    if isinstance(value, (dict, list, tuple)):
        raise ConfigError(f"backend.extra.{key} must be a single value; got {value!r}.")
    return str(value)


def backend_settings(cfg: Any):
    """The typed settings of ``cfg.backend.name`` from ``cfg.backend.extra``. Raises ConfigError."""
    from omegaconf import OmegaConf

    name = str(cfg.backend.name)
    schema = SETTINGS[name]
    raw = cfg.backend.get("extra") or {}
    given = OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else dict(raw)
    fields = {f.name for f in dataclasses.fields(schema)}
    unknown = sorted(set(given) - fields)
    if unknown:
        known = ", ".join(sorted(fields)) or "none"
        raise ConfigError(f"backend.extra.{unknown[0]} is not a setting of backend={name} (its settings: {known}). "
                          "Remove it, or check the spelling (docs/scale-out.md lists each backend's settings).")
    hints = get_type_hints(schema)
    values = {key: _coerce(key, value, hints[key]) for key, value in given.items() if value is not None}
    return schema(**values)
