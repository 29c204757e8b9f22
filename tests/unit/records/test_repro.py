"""The environment record of an attempt, and which differences between two records matter."""
from __future__ import annotations

import pytest
import copy

from orchestrator.records import repro

FIELDS = {"git_commit", "git_dirty", "packages", "packages_sha256", "packages_count", "image", "python", "torch",
          "cuda", "driver", "gpu_model", "gpu_count", "hostname", "platform", "config_sha256", "created_at"}


def test_record_has_every_field(monkeypatch):
    monkeypatch.setenv(repro.CONTAINER_IMAGE_ENV, "ghcr.io/acme/train:1.2")
    record = repro.collect_record({"backend": {"image": None}, "run": {"name": "a"}})
    assert FIELDS <= set(record)
    assert set(record["packages"]) == set(repro.KEY_PACKAGES)
    assert record["packages"]["torch"] == record["torch"]
    assert len(record["packages_sha256"]) == 64 and record["packages_count"] > 10
    assert record["image"] == "ghcr.io/acme/train:1.2"
    assert record["python"].count(".") == 2 and record["hostname"]
    assert repro.collect_record({"backend": {"image": "img:2"}})["image"] == "img:2"
    assert repro.collect_record({}, image="explicit:3")["image"] == "explicit:3"


def test_record_without_git_says_none(tmp_path):
    assert repro.git_state(tmp_path) == (None, None)


def _record() -> dict:
    return {"git_commit": "abc", "git_dirty": False, "image": "img:1", "python": "3.11.7",
            "torch": "2.4.0", "cuda": "12.4", "driver": "550.54", "gpu_model": "NVIDIA H100 80GB HBM3",
            "gpu_count": 8, "hostname": "node-a", "platform": "Linux",
            "packages": {"torch": "2.4.0", "transformers": "4.46.0", "trl": "0.12.0"},
            "packages_sha256": "1" * 64}


def test_diff_flags_torch_and_gpu_changes_but_not_the_hostname():
    first = _record()
    current = copy.deepcopy(first)
    current["hostname"] = "node-b"
    current["driver"] = "560.1"
    assert repro.diff_records(first, current) == []
    current.update(torch="2.5.1", gpu_model="NVIDIA A100-SXM4-80GB")
    current["packages"]["torch"] = "2.5.1"
    current["packages_sha256"] = "2" * 64
    diffs = repro.diff_records(first, current)
    assert any("torch: 2.4.0 -> 2.5.1" in d for d in diffs)
    assert any("GPU model" in d and "A100" in d for d in diffs)
    assert not any("node-" in d for d in diffs)
    assert len(diffs) == 2  # torch is not repeated under packages, nor as a hash change


def test_diff_names_changed_packages_and_gpu_count_and_ignores_missing_git():
    first = _record()
    current = copy.deepcopy(first)
    current["packages"]["trl"] = "0.13.0"
    current["gpu_count"] = 4
    current["git_commit"] = None  # an image without git: unknown, not a change
    diffs = repro.diff_records(first, current)
    assert "package trl 0.12.0 -> 0.13.0" in diffs
    assert "GPU count: 8 -> 4" in diffs
    assert not any("commit" in d for d in diffs)
    other = copy.deepcopy(first)
    other["packages_sha256"] = "3" * 64
    assert repro.diff_records(first, other) == ["other installed packages changed (sha256 111111111111 -> 333333333333)"]


@pytest.mark.e2e
def test_code_without_git_records_the_commit_baked_into_the_image(tmp_path):
    """An image's /app has no .git: the commit comes from ORCH_GIT_COMMIT (containers/Dockerfile's GIT_COMMIT)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    app = tmp_path / "app"  # the project as the image holds it: no .git anywhere above it
    shutil.copytree(Path(repro.__file__).resolve().parents[1], app / "orchestrator",
                    ignore=shutil.ignore_patterns("__pycache__"))
    probe = "import json; from orchestrator.records.repro import collect_record; r = collect_record({}); " \
            "print(json.dumps([r['git_commit'], r['git_dirty']]))"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_GIT", "GIT_"))}
    env.update(PYTHONPATH=str(app), GIT_CEILING_DIRECTORIES=str(tmp_path))
    bare = subprocess.run([sys.executable, "-c", probe], cwd=app, env=env, capture_output=True, text=True, timeout=120)
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert bare.stdout.strip().splitlines()[-1] == "[null, null]"
    env[repro.GIT_COMMIT_ENV] = "0123456789abcdef0123456789abcdef01234567"
    baked = subprocess.run([sys.executable, "-c", probe], cwd=app, env=env, capture_output=True, text=True, timeout=120)
    assert baked.returncode == 0, baked.stderr[-2000:]
    assert baked.stdout.strip().splitlines()[-1] == '["0123456789abcdef0123456789abcdef01234567", null]'


def test_the_dockerfile_bakes_the_build_commit_where_repro_reads_it():
    """No Docker engine here: check the Dockerfile's last stage turns --build-arg GIT_COMMIT into ORCH_GIT_COMMIT."""
    from pathlib import Path

    text = (Path(repro.__file__).resolve().parents[2] / "containers" / "Dockerfile").read_text()
    lines = [line.strip() for line in text.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]
    stage = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")):]
    assert any(line.startswith("ARG GIT_COMMIT") for line in stage), stage
    assert f"ENV {repro.GIT_COMMIT_ENV}=${{GIT_COMMIT}}" in stage
    assert "LABEL org.opencontainers.image.revision=${GIT_COMMIT}" in stage
    # set before the project is copied in, so the layer with the code carries it
    assert stage.index(f"ENV {repro.GIT_COMMIT_ENV}=${{GIT_COMMIT}}") < next(
        i for i, line in enumerate(stage) if line.startswith("COPY orchestrator"))


def test_the_header_reader_says_what_importlibs_metadata_parser_says_for_every_installed_distribution():
    """``name_and_version`` reads only the headers (the attempt's start pays for it): for each distribution of
    this environment, long descriptions and all, it must agree with ``dist.metadata["Name"]`` and ``dist.version``."""
    from importlib import metadata

    from orchestrator.records.repro import name_and_version

    checked = 0
    for dist in metadata.distributions():
        expected = (dist.metadata["Name"] if dist.metadata else None, dist.version if dist.metadata else None)
        assert name_and_version(dist)[0] == expected[0], dist
        if expected[0]:
            assert name_and_version(dist)[1] == expected[1], expected[0]
            checked += 1
    assert checked > 100  # torch, transformers, TRL and the rest: the whole stack was compared
