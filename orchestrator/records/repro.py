"""What a run ran on: code, packages, container, accelerator, host.

``collect_record`` is taken at the start of every attempt and stored with the
run; ``diff_records`` compares an attempt's record with the first attempt's and
names only the differences that can change results (code, package versions,
Python, torch, CUDA, container image, GPU model and count). Harmless ones
(hostname, platform string, driver, time) are not reported. The job config is
compared elsewhere (the checkpoint's resume check), so it is hashed here but not diffed.

Nothing here initialises CUDA when ``nvidia-smi`` is present: GPU names and the
driver come from it; torch is asked only when it is absent.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata as metadata
import json
import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any, Mapping, Optional

CONTAINER_IMAGE_ENV = "ORCH_CONTAINER_IMAGE"
# the commit of code that has no .git beside it: baked into the image at build time
# (containers/Dockerfile, --build-arg GIT_COMMIT=...) or set by the SkyPilot backend for a synced workdir
GIT_COMMIT_ENV = "ORCH_GIT_COMMIT"
GIT_DIRTY_ENV = "ORCH_GIT_DIRTY"
KEY_PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "deepspeed",
    "bitsandbytes",
    "datasets",
    "mlflow",
    "boto3",
    "hydra-core",
)
COMMAND_TIMEOUT_SECONDS = 10
# record key -> label, for the fields whose change can change results (packages are handled apart)
RESULT_CHANGING = {
    "git_commit": "code commit",
    "git_dirty": "uncommitted code changes",
    "python": "Python",
    "torch": "torch",
    "cuda": "CUDA (torch build)",
    "image": "container image",
    "gpu_model": "GPU model",
    "gpu_count": "GPU count",
    "model_input": "model (hub id@revision)",
    "data_input": "data (source@revision)",
}


def _run(args: list[str], cwd: Optional[Path] = None) -> Optional[str]:
    """stdout of a command, or None when it is missing, fails or hangs."""
    if shutil.which(args[0]) is None:
        return None
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(repo_dir: Optional[Path] = None) -> tuple[Optional[str], Optional[bool]]:
    """(commit, dirty) of the checkout holding this package.

    Without git or a repository (an image, a synced folder): ``$ORCH_GIT_COMMIT``
    and ``$ORCH_GIT_DIRTY`` ("true"/"false") when set, else (None, None).
    """
    repo_dir = repo_dir or Path(__file__).resolve().parents[2]
    commit = _run(["git", "rev-parse", "HEAD"], cwd=repo_dir)
    if not commit:
        baked = os.environ.get(GIT_COMMIT_ENV, "").strip() or None
        dirty = {"true": True, "false": False}.get(os.environ.get(GIT_DIRTY_ENV, "").strip().lower())
        return baked, (dirty if baked else None)
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo_dir)
    return commit, (bool(status) if status is not None else None)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def name_and_version(dist: metadata.Distribution) -> tuple[Optional[str], Optional[str]]:
    """``Name`` and ``Version`` from a distribution's metadata headers, read up to the first blank line: what
    ``dist.metadata["Name"]`` and ``dist.version`` say, without parsing the whole file as e-mail (its long
    description too): 0.22 s -> 0.015 s for this stack's 192 distributions, at every attempt's start."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version") and key not in found:
            found[key] = value.strip()
    return found.get("Name"), found.get("Version")


def package_versions() -> tuple[dict[str, Optional[str]], str, int]:
    """(key package -> version or None, sha256 over every installed ``name==version`` sorted, count)."""
    installed: dict[str, Optional[str]] = {}
    for dist in metadata.distributions():
        name, version = name_and_version(dist)
        if name:
            installed.setdefault(_canonical(name), version)
    listing = "\n".join(f"{name}=={version}" for name, version in sorted(installed.items()))
    digest = hashlib.sha256(listing.encode()).hexdigest()
    return {name: installed.get(_canonical(name)) for name in KEY_PACKAGES}, digest, len(installed)


def accelerator() -> dict[str, Any]:
    """torch and CUDA versions, driver, GPU model (the first GPU's name) and count."""
    out: dict[str, Any] = {"torch": None, "cuda": None, "driver": None, "gpu_model": None, "gpu_count": 0}
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if smi:
        rows = [[part.strip() for part in line.split(",")] for line in smi.splitlines() if line.strip()]
        out.update(gpu_model=rows[0][0], driver=rows[0][-1], gpu_count=len(rows))
    try:
        import torch
    except ImportError:
        return out
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    if not smi and torch.cuda.is_available():
        out.update(gpu_model=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if smi and visible is not None:  # nvidia-smi lists every GPU; the job sees only these
        out["gpu_count"] = len([v for v in visible.split(",") if v.strip()])
    return out


def collect_record(cfg_resolved: Mapping[str, Any], *, image: Optional[str] = None) -> dict[str, Any]:
    """A JSON-able record of what this attempt runs on.

    ``cfg_resolved`` is the resolved job config as a plain dict (hashed, and its
    ``backend.image`` used when ``image`` is not given; then ``$ORCH_CONTAINER_IMAGE``).
    Keys: created_at, git_commit, git_dirty, packages (key package -> version),
    packages_sha256, packages_count, image, python, torch, cuda, driver,
    gpu_model, gpu_count, hostname, platform, config_sha256, model_input, data_input,
    chat_template (``inputs_record``). Unknown values are None.
    """
    commit, dirty = git_state()
    packages, digest, count = package_versions()
    backend = cfg_resolved.get("backend") if isinstance(cfg_resolved, Mapping) else None
    image = image or (backend or {}).get("image") or os.environ.get(CONTAINER_IMAGE_ENV) or None
    record = {
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "packages": packages,
        "packages_sha256": digest,
        "packages_count": count,
        "image": image,
        "python": platform.python_version(),
        **accelerator(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "config_sha256": hashlib.sha256(json.dumps(cfg_resolved, sort_keys=True, default=str).encode()).hexdigest(),
        **inputs_record(cfg_resolved),
    }
    return record


def inputs_record(cfg_resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The model and data the job trains on, each as ``name@revision`` (the launcher pins hub revisions to
    commits: ``orchestrator.app.hub_pins``); a mix lists its sources with their weights."""
    model = cfg_resolved.get("model") or {} if isinstance(cfg_resolved, Mapping) else {}
    data = cfg_resolved.get("data") or {} if isinstance(cfg_resolved, Mapping) else {}

    def named(src: Mapping[str, Any]) -> Optional[str]:
        if src.get("source") == "synthetic":
            return f"synthetic:seed={src.get('seed')},n={src.get('num_examples')}"
        if not src.get("path"):
            return None
        return f"{src.get('source')}:{src.get('path')}" + (f"@{src['revision']}" if src.get("revision") else "")

    if data.get("source") == "mix":
        data_input: Optional[str] = " + ".join(f"{named(s)} x{s.get('weight')}" for s in data.get("mix") or [])
    else:
        data_input = named(data)
    name = model.get("name_or_path")
    revision = model.get("revision")
    return {
        "model_input": f"{name}@{revision}" if name and revision else name,
        "data_input": data_input,
        "chat_template": data.get("chat_template"),
    }


def diff_records(first: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Differences between two records that can change results, one sentence each.

    Package changes name each key package ("torch 2.4.0 -> 2.5.1"); a change
    only among the other installed packages is reported once by its hash. A git
    commit missing on either side (no git in the image) is not a difference.
    Hostname, platform, driver and time are ignored.
    """
    out = []
    for key, label in RESULT_CHANGING.items():
        before, after = first.get(key), current.get(key)
        if key.startswith("git_") and (before is None or after is None):
            continue
        if before != after:
            out.append(f"{label}: {before} -> {after}")
    old_pkgs, new_pkgs = first.get("packages") or {}, current.get("packages") or {}
    changed = [
        f"{name} {old_pkgs.get(name)} -> {new_pkgs.get(name)}"
        for name in sorted(set(old_pkgs) | set(new_pkgs))
        if name != "torch" and old_pkgs.get(name) != new_pkgs.get(name)
    ]
    out += [f"package {text}" for text in changed]
    old_hash, new_hash = first.get("packages_sha256"), current.get("packages_sha256")
    if (
        not changed
        and old_pkgs.get("torch") == new_pkgs.get("torch")
        and old_hash
        and new_hash
        and old_hash != new_hash
    ):
        out.append(f"other installed packages changed (sha256 {old_hash[:12]} -> {new_hash[:12]})")
    return out
