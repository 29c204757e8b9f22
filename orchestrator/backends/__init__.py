"""Backends: where the job's attempts run.

Each backend is a module with the same two functions:

- ``render(cfg, overrides) -> str``: the exact text that would be submitted
  (an sbatch script, a SkyPilot task YAML, a Kubernetes Job manifest). Pure:
  no files, no processes. ``backend.dry_run=true`` prints it.
- ``submit(cfg, overrides) -> str``: submit it and return the engine's job id.

``cfg`` is the composed job config and ``overrides`` the user's Hydra
overrides. Every remote job runs ``python -m orchestrator.worker
<overrides without backend.*>``: the worker composes the same config from the
same overrides, runs one attempt and exits with an ``exitcodes`` code, which
the engine keys on to requeue (75) or stop (3, 4, 5, 6).

The local backend (``local.py``) instead runs the supervisor in this process
and defines ``run(cfg, overrides) -> int`` (an exit code) besides ``render``.
"""
from __future__ import annotations

import importlib
import math
import shlex
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Optional, Sequence

from orchestrator.durations import parse_duration
from orchestrator.errors import ConfigError

BACKEND_NAMES = ("local", "slurm", "skypilot", "kubernetes")
WORKER_MODULE = "orchestrator.worker"
WORKER_PYTHON = "python"  # inside an image or a provisioned VM, the environment's own python


@dataclass(frozen=True)
class Backend:
    """One backend's entry points; see the module docstring for their contract."""

    name: str
    module: ModuleType
    render: Callable[[Any, Sequence[str]], str]
    submit: Optional[Callable[[Any, Sequence[str]], str]]
    run: Optional[Callable[[Any, Sequence[str]], int]]


def get_backend(name: str) -> Backend:
    """The backend called ``name``.

    Raises:
        ValueError: ``name`` is not one of BACKEND_NAMES (the message lists them).
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend {name!r} is unknown; choose one of: {', '.join(BACKEND_NAMES)}.")
    module = importlib.import_module(f"{__name__}.{name}")
    return Backend(
        name=name,
        module=module,
        render=module.render,
        submit=getattr(module, "submit", None),
        run=getattr(module, "run", None),
    )


def run_backend(cfg: Any, overrides: Sequence[str]) -> int:
    """Hand the job to ``cfg.backend.name``; returns the launcher's exit code.

    With ``backend.dry_run`` the text that would be submitted is printed and
    nothing runs. A blocking backend (local) returns its attempts' outcome; a
    remote one prints the job id and returns 0 once the engine accepted it.

    Raises:
        ConfigError: an unknown backend name.
    """
    try:
        backend = get_backend(cfg.backend.name)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.backend.dry_run:
        print(backend.render(cfg, list(overrides)), flush=True)
        return 0
    if backend.run is not None:
        return int(backend.run(cfg, list(overrides)))
    job_id = backend.submit(cfg, list(overrides))
    print(f"submitted {cfg.run.name!r} to {backend.name}: job {job_id}", flush=True)
    return 0


# -- helpers shared by the remote backends ------------------------------------


def _override_key(override: str) -> str:
    key = override.split("=", 1)[0]
    return key.lstrip("+~")


def worker_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides a remote worker needs: the user's, less ``backend`` and ``backend.*``.

    The worker always runs locally inside the job, so the launcher's choice of
    backend must not travel with it.
    """
    return [o for o in overrides if not (_override_key(o) == "backend" or _override_key(o).startswith("backend."))]


def worker_command(overrides: Sequence[str], python: str = WORKER_PYTHON) -> str:
    """The shell-quoted command that runs one attempt: ``python -m orchestrator.worker ...``."""
    return shlex.join([python, "-m", WORKER_MODULE, *worker_overrides(overrides)])


def grace_seconds(cfg: Any) -> int:
    """``preemption.grace`` in whole seconds (rounded up), as engines take it."""
    try:
        return int(math.ceil(parse_duration(cfg.preemption.grace, key="preemption.grace")))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def single_node(cfg: Any, backend: str) -> None:
    """Refuse multi-node jobs: each job starts one worker process, which trains on one node."""
    if int(cfg.compute.nodes) != 1:
        raise ConfigError(
            f"compute.nodes={cfg.compute.nodes}: the {backend} backend runs one node per job. "
            "Use compute.nodes=1 (more GPUs per node: compute.gpus_per_node)."
        )


def extra(cfg: Any, key: str, default: Any = None) -> Any:
    """``backend.extra[key]``, or ``default`` when unset."""
    value = (cfg.backend.get("extra") or {}).get(key)
    return default if value is None else value
