"""Checkpoint integrity: a corrupt, partial or foreign checkpoint is never restored.

Each job runs as a user runs it (``python -m orchestrator.launch``). A job is
killed after it committed several checkpoints, the newest one is damaged in
storage (a flipped byte, a truncated file, a deleted manifest), and the launch
command is run again: it must name the bad checkpoint and why, resume from the
previous one, and end with weights byte-identical to an uninterrupted run.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import jobs

RUN = "victim"
# Checkpoints committed before the job is killed: the newest is damaged, the one before must be restored.
COMMITS_BEFORE_KILL = 3


def _interrupt_after_commits(storage: jobs.Storage, workdir: Path, overrides: list[str]) -> None:
    proc = jobs.start_job(jobs.FAST + storage.overrides() + overrides + [f"run.name={RUN}"], workdir)
    try:
        jobs.wait_for(lambda: _poll(proc, storage) >= COMMITS_BEFORE_KILL, 300, f"{COMMITS_BEFORE_KILL} commits")
    finally:
        jobs.kill_group(proc)


def _poll(proc: subprocess.Popen, storage: jobs.Storage) -> int:
    if proc.poll() is not None:
        raise RuntimeError(f"the job ended (rc={proc.returncode}) before {COMMITS_BEFORE_KILL} commits")
    return len(jobs.committed_steps(storage, RUN))


def _uninterrupted(workdir: Path) -> dict:
    """A resumed job that nothing interrupts: no floor under its steps."""
    return jobs.job_env(workdir, {"ORCH_STEP_DELAY_SECONDS": "0"})


def _committed_names(storage: jobs.Storage) -> list[str]:
    keys = storage.store().list(f"{RUN}/checkpoints/")
    return sorted({k.split("/")[2] for k in keys if k.endswith("/manifest.json")},
                  key=lambda n: tuple(int(x) for x in n.split("-")))


@pytest.fixture(scope="module")
def clean_digest(references) -> str:
    """Final weights of the uninterrupted job every resumed job must reproduce."""
    return references.digest(jobs.FAST)


@pytest.fixture(scope="module")
def interrupted_root(tmp_path_factory) -> Path:
    """A local storage folder holding a job killed after several commits (copy it before changing it)."""
    tmp = tmp_path_factory.mktemp("interrupted")
    _interrupt_after_commits(jobs.Storage(str(tmp / "runs")), tmp, [])
    return tmp / "runs"


@pytest.fixture
def local_copy(interrupted_root, tmp_path) -> jobs.Storage:
    shutil.copytree(interrupted_root, tmp_path / "runs")
    return jobs.Storage(str(tmp_path / "runs"))


def _flip_byte(store, key: str) -> None:
    data = bytearray(store.get_bytes(key))
    data[len(data) // 2] ^= 0x01
    store.put_bytes(key, bytes(data))


def _corrupt(storage: jobs.Storage, name: str, how: str) -> str:
    """Damage checkpoint ``name`` in storage; returns the reason the log must give."""
    store = storage.store()
    prefix = f"{RUN}/checkpoints/{name}/"
    if how == "flipped_byte":
        _flip_byte(store, prefix + "adapter_model.safetensors")
        return "file adapter_model.safetensors does not match its SHA-256"
    if how == "truncated":
        data = store.get_bytes(prefix + "optimizer.pt")
        store.put_bytes(prefix + "optimizer.pt", data[: len(data) // 2])
        return f"file optimizer.pt has {len(data) // 2} bytes, the manifest says {len(data)} (truncated?)"
    if how == "no_manifest":
        store.delete(prefix + "manifest.json")
        return "has no manifest"
    raise ValueError(how)


def _resume_and_check(storage: jobs.Storage, workdir: Path, how: str, clean_digest: str) -> None:
    names = _committed_names(storage)
    assert len(names) >= 2, names
    newest, previous = names[-1], names[-2]
    reason = _corrupt(storage, newest, how)

    result = jobs.run_job(jobs.FAST + storage.overrides() + [f"run.name={RUN}"], workdir, env=_uninterrupted(workdir))
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert f"restoring checkpoint {previous}" in log, log[-4000:]
    bad_lines = [line for line in log.splitlines() if newest in line and reason in line]
    assert bad_lines, f"no log line names {newest} with the reason {reason!r}:\n{log[-4000:]}"
    assert f"restoring checkpoint {newest}" not in log
    assert jobs.ledger(storage, RUN)["status"] == "completed"
    assert jobs.final_digest(storage, RUN) == clean_digest, f"weights after the {how} fallback differ from the clean run"


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["flipped_byte", "truncated", "no_manifest"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(how, local_copy, tmp_path, clean_digest):
    _resume_and_check(local_copy, tmp_path, how, clean_digest)


def _checkpoints_cli(run_uri: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([jobs.PYTHON, "-m", "orchestrator", "checkpoints", run_uri, "--verify", *extra],
                          capture_output=True, text=True, timeout=300, env=jobs.job_env(Path(".")))


@pytest.mark.e2e
def test_on_s3_a_flipped_byte_is_flagged_by_verify_and_skipped_on_resume(s3_server, s3_bucket, tmp_path, clean_digest):
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    _interrupt_after_commits(storage, tmp_path, [])
    names = _committed_names(storage)

    # the CLI against the S3 server: all good, then one flipped byte in the newest
    good = _checkpoints_cli(f"{s3_bucket}/{RUN}", "--endpoint-url", s3_server.endpoint_url)
    assert good.returncode == 0, good.stdout + good.stderr
    rows_ok = [line for line in good.stdout.splitlines() if line.split()[:1] in ([n] for n in names)
               and line.rstrip().endswith(" OK")]
    assert len(rows_ok) == len(names), good.stdout
    _flip_byte(storage.store(), f"{RUN}/checkpoints/{names[-1]}/adapter_model.safetensors")
    bad = _checkpoints_cli(f"{s3_bucket}/{RUN}", "--endpoint-url", s3_server.endpoint_url)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    flagged = [line for line in bad.stdout.splitlines() if names[-1] in line and "FAILED" in line]
    assert flagged and "adapter_model.safetensors" in flagged[0], bad.stdout

    # the byte is already flipped: resume must skip it (reason text as in the local case)
    newest, previous = names[-1], names[-2]
    result = jobs.run_job(jobs.FAST + storage.overrides() + [f"run.name={RUN}"], tmp_path, env=_uninterrupted(tmp_path))
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert f"restoring checkpoint {previous}" in log, log[-4000:]
    assert any(newest in line and "does not match its SHA-256" in line for line in log.splitlines()), log[-4000:]
    assert jobs.final_digest(storage, RUN) == clean_digest


@pytest.mark.e2e
def test_verify_passes_on_good_checkpoints_and_names_the_flipped_file(local_copy):
    run_uri = f"{local_copy.uri}/{RUN}"
    names = _committed_names(local_copy)
    good = _checkpoints_cli(run_uri)
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"{len(names)} of {len(names)} checkpoints verified OK" in good.stdout, good.stdout

    _flip_byte(local_copy.store(), f"{RUN}/checkpoints/{names[0]}/optimizer.pt")
    bad = _checkpoints_cli(run_uri)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    lines = {line.split()[0]: line for line in bad.stdout.splitlines() if line.startswith("  0")}
    assert "FAILED" in lines[names[0]] and "optimizer.pt" in lines[names[0]], bad.stdout
    assert all(lines[n].rstrip().endswith("OK") for n in names[1:]), bad.stdout


@pytest.mark.e2e
def test_a_changed_trajectory_field_is_refused_unless_allowed(local_copy, tmp_path):
    common = jobs.FAST + local_copy.overrides() + [f"run.name={RUN}", "train.learning_rate=0.001"]
    refused = jobs.run_job(common, tmp_path)
    text = refused.stdout + refused.stderr
    assert refused.returncode == 4, text[-4000:]
    assert "train.learning_rate" in text and "checkpoint.allow_config_change=true" in text, text[-4000:]
    assert "restoring checkpoint" not in text

    allowed = jobs.run_job(common + ["checkpoint.allow_config_change=true"], tmp_path)
    text = allowed.stdout + allowed.stderr
    assert allowed.returncode == 0, text[-4000:]
    assert "restoring checkpoint" in text
    assert "resuming despite a changed config field" in text and "train.learning_rate" in text
    assert jobs.ledger(local_copy, RUN)["status"] == "completed"


def _checkpoint_uploads(client, bucket: str) -> list[dict]:
    uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return [u for u in uploads if "/checkpoints/" in u["Key"]]


@pytest.mark.e2e
def test_a_kill_during_a_multipart_upload_leaves_no_checkpoint_and_no_orphans(s3_server, s3_bucket, tmp_path):
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    client = s3_server.client()
    bucket = s3_bucket[len("s3://"):].split("/")[0]
    # full fine-tune, 4 x 256: model.safetensors ~18 MB and optimizer.pt ~36 MB, above the 5 MB threshold
    overrides = jobs.FAST + storage.overrides() + [
        "run.name=upload", "recipe.peft=full", "model.hidden_size=256", "model.num_layers=4",
        "storage.multipart_threshold_mb=5", "train.max_steps=30",
    ]
    proc = jobs.start_job(overrides, tmp_path)
    try:
        def in_flight():
            if proc.poll() is not None:
                raise RuntimeError(f"the job ended (rc={proc.returncode}) before a multipart upload was seen")
            return _checkpoint_uploads(client, bucket)

        uploads = jobs.wait_for(in_flight, 300, "a multipart checkpoint upload", interval=0.02)
    finally:
        jobs.kill_group(proc)

    orphan = uploads[0]["Key"].split("/checkpoints/")[1].split("/")[0]
    store = storage.store()
    sizes = {k: store.size(k) for k in store.list(f"upload/checkpoints/{orphan}/")}
    assert not any(k.endswith("/manifest.json") for k in sizes), sizes
    assert orphan not in {k.split("/")[2] for k in store.list("upload/checkpoints/") if k.endswith("manifest.json")}
    stale_ids = {u["UploadId"] for u in _checkpoint_uploads(client, bucket)}
    assert stale_ids, "the killed upload left no incomplete multipart upload behind"
    # the files that finished before the big one: orphans without a manifest
    assert sizes, f"no partial files of {orphan} were uploaded before the kill"

    proc = jobs.start_job(overrides, tmp_path, log_name="rerun.log")
    try:
        jobs.wait_for(lambda: f"checkpoint {orphan} has no manifest" in jobs.log_text(tmp_path, "rerun.log")
                      or proc.poll() is not None, 300, "the next attempt's start-up clean-up")
        # right after the clean-up, before this attempt uploads anything of its own
        left = {u["UploadId"] for u in _checkpoint_uploads(client, bucket)}
        assert not (left & stale_ids), "the killed attempt's multipart upload was not aborted"
        assert store.list(f"upload/checkpoints/{orphan}/") == [], "the orphan files were not removed"
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            jobs.kill_group(proc)
    log = jobs.log_text(tmp_path, "rerun.log")
    assert rc == 0, log[-4000:]
    assert f"checkpoint {orphan} has no manifest" in log
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert jobs.ledger(storage, "upload")["status"] == "completed"
    # the premise: this model's checkpoint files really are above the 5 MB multipart threshold
    newest = sorted(k for k in store.list("upload/checkpoints/") if k.endswith("/manifest.json"))[-1]
    sizes = {f["path"]: f["size"] for f in json.loads(store.get_bytes(newest))["files"]}
    assert sizes["optimizer.pt"] > 5 * 1024**2 and sizes["model.safetensors"] > 5 * 1024**2, sizes
