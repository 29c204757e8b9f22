"""A bucket writer cannot make a job write outside its restore folder or run code.

A real job (plain LoRA, then 2-process DeepSpeed ZeRO-2) commits checkpoints to
the moto S3 server and is killed. Then, as someone who can write the bucket:
- the newest checkpoint's pickled files are replaced by pickles that run a
  command (``os.system`` through ``__reduce__``), with the manifest's sizes and
  hashes fixed to match;
- the one before gets two extra manifest entries, a path climbing out with
  ``..`` and an absolute path, with objects at those keys and matching hashes.
``orchestrator checkpoints --verify`` and the relaunched job must refuse both,
say why, write nothing outside, never run the command, and the job must finish
from the third-newest checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import jobs

RUN = "tampered"
COMMITS_BEFORE_KILL = 3
# Step-based checkpoints only, so the job is far from done when the third commit lands.
# 64 steps: the kill after 3 commits (step 12) must land before the job ends, with a loaded machine's
# polling of the bucket in between (at 32 steps a job under load once finished first)
COMMON = jobs.with_overrides(jobs.FAST, "checkpoint.every=1h", "checkpoint.every_steps=4", "train.max_steps=64")
MODES = {
    "lora": [],
    "zero2": ["distributed=zero2", "distributed.processes_per_node=2"],
}


class RunsCommand:
    """Pickles to ``os.system(command)``: whatever unpickles it without the weights-only guard runs it."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _evil_pickle(marker: Path) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"state": RunsCommand(f"touch {marker}")}, buf)
    return buf.getvalue()


def _committed_names(store) -> list[str]:
    keys = store.list(f"{RUN}/checkpoints/")
    return sorted(k.split("/")[2] for k in keys if k.endswith("/manifest.json"))


def _kill_after_commits(overrides: list[str], storage: jobs.Storage, tmp_path: Path) -> None:
    proc = jobs.start_job(overrides, tmp_path)
    try:
        def enough():
            if proc.poll() is not None:
                raise RuntimeError(f"the job ended (rc={proc.returncode}) before {COMMITS_BEFORE_KILL} commits:\n"
                                   + jobs.log_text(tmp_path)[-3000:])
            return len(jobs.committed_steps(storage, RUN)) >= COMMITS_BEFORE_KILL

        jobs.wait_for(enough, 600, f"{COMMITS_BEFORE_KILL} commits")
    finally:
        jobs.kill_group(proc)


def _entry(path: str, data: bytes) -> dict:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _rewrite(store, name: str, replace: dict[str, bytes]) -> None:
    """Put ``replace`` (path -> bytes) into checkpoint ``name`` and fix its manifest to match, as a bucket writer can."""
    prefix = f"{RUN}/checkpoints/{name}/"
    manifest = json.loads(store.get_bytes(prefix + "manifest.json"))
    files = {f["path"]: f for f in manifest["files"]}
    for path, data in replace.items():
        store.put_bytes(prefix + path, data)
        files[path] = _entry(path, data)
    manifest["files"] = list(files.values())
    manifest["total_bytes"] = sum(f["size"] for f in manifest["files"])
    store.put_bytes(prefix + "manifest.json", json.dumps(manifest).encode())


def _verify_cli(storage: jobs.Storage, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([jobs.PYTHON, "-m", "orchestrator", "checkpoints", f"{storage.uri}/{RUN}", "--verify",
                           "--endpoint-url", storage.endpoint_url],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=jobs.job_env(tmp_path))


@pytest.mark.e2e
@pytest.mark.parametrize("mode", list(MODES))
def test_a_tampered_bucket_runs_no_code_and_writes_nothing_outside(mode, s3_server, s3_bucket, tmp_path):
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    overrides = COMMON + MODES[mode] + storage.overrides() + [f"run.name={RUN}"]
    _kill_after_commits(overrides, storage, tmp_path)
    store = storage.store()
    names = _committed_names(store)
    assert len(names) >= 3, names
    poisoned, climbing, good = names[-1], names[-2], names[-3]

    marker = tmp_path / "the-command-ran"
    outside = tmp_path / "outside"
    outside.mkdir()
    pickled = [f["path"] for f in json.loads(store.get_bytes(f"{RUN}/checkpoints/{poisoned}/manifest.json"))["files"]
               if f["path"].endswith((".pt", ".pth", ".bin"))]
    assert any("optim" in p for p in pickled), pickled  # the premise: optimizer states are pickles
    _rewrite(store, poisoned, {path: _evil_pickle(marker) for path in pickled})
    # from <work>/<run>/<attempt>/restore/<name>/, forty '..' reach / and the rest leads into outside/
    climb = "../" * 40 + str(outside / "climbed.txt").lstrip("/")
    absolute = str(outside / "absolute.txt")
    _rewrite(store, climbing, {climb: b"written through a climbing path", absolute: b"written through an absolute path"})

    verify = _verify_cli(storage, tmp_path)
    rows = {line.split()[0]: line for line in verify.stdout.splitlines() if line.startswith("  0")}
    assert verify.returncode == 1, verify.stdout + verify.stderr[-3000:]
    assert "FAILED" in rows[poisoned] and "posix.system" in rows[poisoned], verify.stdout
    assert "FAILED" in rows[climbing] and "unsafe path" in rows[climbing], verify.stdout
    assert rows[good].rstrip().endswith("OK"), verify.stdout
    assert list(outside.iterdir()) == [] and not marker.exists(), "verify wrote outside or ran the command"

    result = jobs.run_job(overrides, tmp_path, timeout=900)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    assert list(outside.iterdir()) == [], "the restore wrote outside its folder"
    assert not marker.exists(), "a pickle from the bucket ran a command"
    refused = [line for line in log.splitlines() if f"checkpoint {poisoned} is unusable" in line]
    assert refused and "is refused: it needs posix.system" in refused[0], log[-5000:]
    unsafe = [line for line in log.splitlines() if f"checkpoint {climbing} is unusable" in line]
    assert unsafe and "unsafe path" in unsafe[0] and repr(climb) in unsafe[0], log[-5000:]
    assert f"restoring checkpoint {good}" in log, log[-5000:]
    ledger = jobs.ledger(storage, RUN)
    assert ledger["status"] == "completed"
    assert [a["exit_class"] for a in ledger["attempts"]][-1] == "completed"
