"""Where the Trainer's local snapshot goes (memory when it fits), and that killed attempts leave no memory behind."""
from __future__ import annotations

import pytest
import subprocess
import sys

import torch

from orchestrator.checkpoint import snapshot


def test_auto_uses_shared_memory_when_three_snapshots_fit(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    root, why = snapshot.choose_root("auto", run_name="job", token="pid1", work=tmp_path / "work",
                                     estimate_bytes=1 << 20, shm=shm)
    assert root == shm / "orchestrator" / "job" / "pid1"
    assert "holds 3 snapshots" in why


def test_auto_falls_back_to_disk_and_says_why(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    work = tmp_path / "work"
    huge = 1 << 60
    root, why = snapshot.choose_root("auto", run_name="job", token="t", work=work, estimate_bytes=huge, shm=shm)
    assert root == work and "MiB free" in why and "wanted" in why
    root, why = snapshot.choose_root("auto", run_name="job", token="t", work=work, estimate_bytes=1,
                                     shm=tmp_path / "missing")
    assert root == work and "not available" in why


def test_explicit_settings(tmp_path):
    work = tmp_path / "work"
    assert snapshot.choose_root("work", run_name="j", token="t", work=work, estimate_bytes=1)[0] == work
    root, _ = snapshot.choose_root(str(tmp_path / "fast"), run_name="j", token="t", work=work, estimate_bytes=1)
    assert root == (tmp_path / "fast" / "j" / "t").resolve()


def test_estimate_counts_saved_weights_and_adam_moments():
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10))
    for p in model[0].parameters():
        p.requires_grad_(False)
    n = 110  # parameters per layer
    assert snapshot.estimate_snapshot_bytes(model, full_model=True) == 2 * n * 4 + n * 8
    assert snapshot.estimate_snapshot_bytes(model, full_model=False) == n * 4 + n * 8


@pytest.mark.e2e
def test_orphans_of_dead_attempts_are_removed_live_ones_kept(tmp_path):
    parent = tmp_path / "orchestrator" / "job"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for name, pid in (("dead", dead.pid), ("live", live.pid)):
            (parent / name).mkdir(parents=True)
            (parent / name / snapshot.OWNER_FILE).write_text(str(pid))
            (parent / name / "optimizer.pt").write_bytes(b"x" * 1000)
        snapshot.claim(parent / "mine")
        (parent / "foreign").mkdir()  # no owner file: not ours to remove

        removed = snapshot.remove_orphans(parent)

        assert removed == [parent / "dead"]
        assert sorted(p.name for p in parent.iterdir()) == ["foreign", "live", "mine"]
    finally:
        live.kill()
        live.wait()


def test_release_removes_the_root_and_the_emptied_job_folder(tmp_path):
    a, b = tmp_path / "job" / "a", tmp_path / "job" / "b"
    snapshot.claim(a)
    snapshot.claim(b)
    snapshot.release(a)
    assert not a.exists() and b.exists()
    snapshot.release(b)
    assert not (tmp_path / "job").exists()
