"""Every backend's job runs the locked versions, so that a resume is on the packages the job started on.

SkyPilot without an image installs the synced workdir on each VM a recovery lands on: its setup installs with
``-c constraints.txt`` and the same torch as scripts/setup.sh and the image (plain ``pip install -e .`` took the
newest torch, transformers, TRL and PEFT of the day). The image (Kubernetes, SkyPilot with ``backend.image``)
is built with the same constraints. Slurm runs the launcher's own interpreter on the shared filesystem.
The setup is run here by bash with a stand-in ``python`` that records what it is asked to install.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.backends import get_backend, skypilot
from orchestrator.core.errors import ConfigError
from tests.helpers.backends import compose
from tests.helpers.paths import REPO

ROOT = REPO
FAKE_PYTHON = """#!/bin/bash
# stands in for the VM's python {version}: answers the version check, records pip's arguments
case "$1" in
  -V) echo "Python {version}" ;;
  -c) python3 -c "import sys; sys.exit(({major}, {minor}) < (3, 11))" ;;
  -m) shift; echo "$*" >> "$FAKE_DIR/pip" ;;
esac
"""


def _run_setup(setup: str, tmp_path: Path, version: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / f"bin-{version}"
    bin_dir.mkdir()
    major, minor = version.split(".")[:2]
    (bin_dir / "python").write_text(FAKE_PYTHON.format(version=version, major=major, minor=minor))
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path)}
    return subprocess.run(["bash", "-c", setup], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)


def test_the_skypilot_setup_installs_the_workdir_with_the_locked_versions(tmp_path):
    cfg, overrides = compose("skypilot")  # no backend.image: the workdir is synced and installed on the VM
    task = yaml.safe_load(get_backend("skypilot").render(cfg, overrides))
    done = _run_setup(task["setup"], tmp_path, "3.11.9")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pip").read_text().split() == ["pip", "install", "-c", "constraints.txt",
                                                      f"torch=={skypilot.TORCH_VERSION}", "-e", "."]
    assert (Path(task["workdir"]) / "constraints.txt").is_file()


def test_the_skypilot_setup_stops_on_a_python_the_lock_cannot_install_on(tmp_path):
    cfg, overrides = compose("skypilot")
    done = _run_setup(yaml.safe_load(get_backend("skypilot").render(cfg, overrides))["setup"], tmp_path, "3.10.12")
    assert done.returncode == 1
    assert "need Python 3.11 or later, and this VM has Python 3.10.12" in done.stderr and "backend.image" in done.stderr
    assert not (tmp_path / "pip").exists(), "nothing installed unlocked"


def test_a_skypilot_submit_from_a_folder_without_the_lock_is_refused(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sky").write_text(f"#!/bin/bash\ntouch {tmp_path}/sky-called\n")
    (bin_dir / "sky").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    cfg, overrides = compose("skypilot", f"run.work_dir={tmp_path / 'work'}")
    with pytest.raises(ConfigError, match=r"has no constraints.txt: launch from the repository root, or set "
                                          r"backend.image"):
        get_backend("skypilot").submit(cfg, overrides)
    assert not (tmp_path / "sky-called").exists()


def test_the_torch_pin_is_the_same_for_the_vm_the_image_and_the_local_setup():
    dockerfile = (ROOT / "containers" / "Dockerfile").read_text()
    setup_sh = (ROOT / "scripts" / "setup.sh").read_text()
    assert re.search(r"^ARG TORCH_VERSION=(\S+)$", dockerfile, re.M).group(1) == skypilot.TORCH_VERSION
    assert set(re.findall(r'"torch==([^"]+)"', setup_sh)) == {skypilot.TORCH_VERSION}


def test_the_image_installs_every_package_under_the_constraints():
    text = (ROOT / "containers" / "Dockerfile").read_text()
    installs = re.findall(r"pip install ([^\n\\]*)", text)
    assert installs, text
    for args in installs:
        assert "-c /tmp/constraints.txt" in args or args.startswith("--no-deps"), args
    assert text.index("COPY constraints.txt") < text.index("pip install -c")


@pytest.mark.parametrize("image,warned", [("registry.example/orch:0.1", True),
                                          ("registry.example:5000/orch@sha256:" + "a" * 64, False)])
def test_an_image_a_recovery_may_pull_again_is_warned_about_unless_pinned_by_digest(image, warned, caplog):
    import logging

    from orchestrator.app.compose import compose_config

    with caplog.at_level(logging.WARNING, logger="orchestrator.app.image_pin"):
        compose_config(["backend=kubernetes", f"backend.image={image}", "storage.uri=s3://bucket/runs"])
    assert ("is not pinned by digest" in caplog.text) is warned, caplog.text
    if warned:
        assert "registry.example/orch@sha256:<digest>" in caplog.text
