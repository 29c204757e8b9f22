"""What a path in a job's config means on the machine that runs its worker, per backend.

The launcher resolves every relative local path against the launch folder (``compose.absolutize``), which is
right where the worker shares that filesystem and wrong where it does not:

- ``local`` and ``slurm``: absolute paths, as resolved; checked to exist at launch (Slurm's login node and
  compute nodes share the filesystem).
- ``skypilot``: the launch folder is synced to the VM as the task's ``workdir`` (``~/sky_workdir``), where the
  worker runs. A path inside it is written relative to it (``./train.jsonl``); a path outside it, or one its
  ``.gitignore`` leaves out of the sync, is refused at launch with the fix.
- ``kubernetes``: the pod sees its image and object storage only. A local path is refused at launch unless it is
  under one of ``backend.extra.image_paths`` (folders the image holds; such a path is not checked here).
- every backend: an ``s3://`` input (``orchestrator.storage.inputs``) is read by the worker through the job's storage
  settings; the launcher checks that the bucket lists it.

``run.work_dir`` is local scratch: a remote worker picks its own (the default ``.cache/work`` under its working
directory) unless the job names an absolute folder outside the launch folder, which is then the remote one.
It is not part of the trajectory (``orchestrator.checkpoint.fingerprint``).
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any, Optional, Sequence, cast

from orchestrator.core.errors import ConfigError, UserError
from orchestrator.storage.inputs import is_remote

log = logging.getLogger(__name__)

REMOTE_BACKENDS = ("skypilot", "kubernetes")
MODEL_PATH_PREFIXES = ("/", "./", "../", "~")
# how a file reaches a remote worker, for the refusals' messages
OBJECT_STORAGE = "upload it to object storage and give its s3:// URI"


def _is_template_file(value: str) -> bool:
    return value.endswith((".jinja", ".j2")) or "/" in value


def input_paths(cfg: Any) -> list[tuple[str, str]]:
    """(config key, value) of each file or folder the job reads: data, mix sources, chat template, model."""
    out: list[tuple[str, str]] = []
    data = cfg.data
    if data.source == "jsonl" and data.path:
        out.append(("data.path", str(data.path)))
    if data.source == "mix":
        out += [
            (f"data.mix[{i}].path", str(src.path))
            for i, src in enumerate(data.mix or [])
            if src.source == "jsonl" and src.path
        ]
    if data.chat_template and _is_template_file(str(data.chat_template)):
        out.append(("data.chat_template", str(data.chat_template)))
    name = str(cfg.model.name_or_path)
    if is_remote(name) or name.startswith(MODEL_PATH_PREFIXES):
        out.append(("model.name_or_path", name))
    return out


def image_paths(cfg: Any) -> tuple[str, ...]:
    if cfg.backend.name != "kubernetes":
        return ()
    from orchestrator.backends.settings import backend_settings

    return backend_settings(cfg).image_paths


def _under(path: str | Path, folder: str | Path) -> bool:
    try:
        Path(path).expanduser().relative_to(Path(folder).expanduser())
        return True
    except ValueError:
        return False


def checked_here(cfg: Any, value: str) -> bool:
    """Whether the launcher can read ``value`` to check it: not in object storage, not inside the image."""
    return not is_remote(value) and not any(_under(value, p) for p in image_paths(cfg))


def _git_ignored(workdir: Path, path: Path) -> bool:
    """Whether SkyPilot's sync leaves ``path`` out: it follows ``.gitignore`` unless a ``.skyignore`` exists."""
    if (workdir / ".skyignore").exists():
        return False
    try:
        done = subprocess.run(
            ["git", "-C", str(workdir), "check-ignore", "-q", str(path)], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def file_mounts(cfg: Any) -> dict[str, Path]:
    """SkyPilot's local file mounts: {path on the VM: local folder or file}."""
    if cfg.backend.name != "skypilot":
        return {}
    from orchestrator.backends.settings import backend_settings

    mounts = backend_settings(cfg).file_mounts or {}
    return {remote: Path(local).expanduser().resolve() for remote, local in mounts.items() if "://" not in local}


def _mounted(value: str, mounts: dict[str, Path]) -> Optional[str]:
    """``value``'s path on the VM when it lies under a local file mount's source, else None."""
    path = Path(value).expanduser().resolve()
    for remote, local in mounts.items():
        if _under(path, local):
            rest = path.relative_to(local).as_posix()
            return remote if rest == "." else f"{remote.rstrip('/')}/{rest}"
    return None


def _skypilot_problem(key: str, value: str, workdir: Optional[Path], mounts: dict[str, Path]) -> Optional[str]:
    """Why the VM would not find ``value`` (``workdir`` None: with ``backend.image`` nothing is synced)."""
    path = Path(value).expanduser().resolve()
    if _mounted(value, mounts):
        return None
    if workdir is None:
        return (
            f"{key}={value!r} is a path on this machine, and with backend.image SkyPilot syncs no workdir, so "
            f"the worker cannot find it. Fix: mount its folder, '+backend.extra.file_mounts={{/data: "
            f"{path.parent}}}', and give the path under /data; or {OBJECT_STORAGE}."
        )
    if not _under(path, workdir):
        return (
            f"{key}={value!r} is outside the folder SkyPilot syncs to the VM ({workdir}), so the worker "
            f"cannot find it there. Fix: move it into the project folder; or mount its folder, "
            f"'+backend.extra.file_mounts={{/data: {path.parent}}}', and give the path under /data; or "
            f"{OBJECT_STORAGE}."
        )
    if _git_ignored(workdir, path):
        return (
            f"{key}={value!r} is left out of the sync to the VM by {workdir}/.gitignore, so the worker cannot "
            f"find it there. Fix: un-ignore it, add a .skyignore, mount it (backend.extra.file_mounts), or "
            f"{OBJECT_STORAGE}."
        )
    return None


def _kubernetes_problem(key: str, value: str) -> str:
    return (
        f"{key}={value!r} is a path on this machine, and a Kubernetes pod sees only its image and object "
        "storage. Fix: upload it (aws s3 cp / aws s3 sync) and give its s3:// URI, or build it into the image "
        "and name the image's folder in backend.extra.image_paths (e.g. "
        "'+backend.extra.image_paths=[/app/data]'), giving the path inside the image."
    )


def check_placement(cfg: Any) -> None:
    """Launch check: every input reaches the machine that runs the worker. Raises ConfigError naming them."""
    backend = str(cfg.backend.name)
    problems = []
    for key, value in input_paths(cfg):
        if is_remote(value):
            check_listed(cfg, key, value)
        elif backend == "skypilot":
            workdir = None if cfg.backend.image else Path.cwd().resolve()
            problems.append(_skypilot_problem(key, value, workdir, file_mounts(cfg)))
        elif backend == "kubernetes" and checked_here(cfg, value):
            problems.append(_kubernetes_problem(key, value))
    problems = [p for p in problems if p]
    if problems:
        raise ConfigError(" ".join(cast("list[str]", problems)))


def check_listed(cfg: Any, key: str, uri: str) -> None:
    """``uri`` names objects in the bucket. A missing object is a config error; a launcher that cannot reach
    the bucket (no credentials here, the VM's role has them) only warns: the worker checks again."""
    import tempfile

    from orchestrator.core.errors import DataError
    from orchestrator.storage.base import TransientStorageError
    from orchestrator.storage.inputs import InputFiles

    try:
        InputFiles(cfg.storage, Path(tempfile.gettempdir())).listing(uri)
    except DataError as err:
        raise ConfigError(f"{key}: {err}") from None
    except (UserError, OSError, TransientStorageError) as err:  # no credentials, no route to the bucket from here
        log.warning(
            "%s=%s could not be listed from here (%s); the worker reads it with its own credentials", key, uri, err
        )


def _on_vm(value: str, workdir: Path, mounts: dict[str, Path]) -> str:
    """A local input's path on the SkyPilot VM: under a file mount, or relative to the synced workdir."""
    return _mounted(value, mounts) or "./" + Path(value).expanduser().resolve().relative_to(workdir).as_posix()


def _mix_override(cfg: Any, workdir: Path, mounts: dict[str, Path]) -> str:
    """``data.mix=[...]`` with each local source's path relative to ``workdir``, in Hydra's override grammar."""
    from omegaconf import OmegaConf

    entries = []
    mix: Any = OmegaConf.to_container(cfg.data.mix, resolve=True)
    for src in mix:
        if src.get("source") == "jsonl" and src.get("path") and not is_remote(src["path"]):
            src["path"] = _on_vm(src["path"], workdir, mounts)
        fields = [f"{k}:{_hydra_value(v)}" for k, v in src.items()]
        entries.append("{" + ",".join(fields) + "}")
    return "data.mix=[" + ",".join(entries) + "]"


def _hydra_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def placed_overrides(cfg: Any, overrides: Sequence[str]) -> list[str]:
    """``overrides`` as the worker of ``cfg.backend.name`` must get them (see the module docstring).

    Raises:
        ConfigError: an input the worker cannot reach (``check_placement``).
    """
    backend = str(cfg.backend.name)
    if backend not in REMOTE_BACKENDS:
        return list(overrides)
    check_placement(cfg)
    launch = Path.cwd().resolve()
    out = [o for o in overrides if not (_key(o) == "run.work_dir" and _under(o.partition("=")[2], launch))]
    if backend != "skypilot":
        return out
    moved, mounts = {}, file_mounts(cfg)
    for key, value in input_paths(cfg):
        if not is_remote(value) and not key.startswith("data.mix["):
            moved[key] = f"{key}={_on_vm(value, launch, mounts)}"
    if any(key.startswith("data.mix[") and not is_remote(value) for key, value in input_paths(cfg)):
        moved["data.mix"] = _mix_override(cfg, launch, mounts)
    return [o for o in out if _key(o) not in moved] + list(moved.values())
