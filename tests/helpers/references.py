"""Uninterrupted reference runs, built once per test run and shared by every test that compares against one.

A reference is keyed by the checkpoint fingerprint of its config (the fields that
shape the training trajectory, ``orchestrator.checkpoint.fingerprint.trajectory_config``):
two tests whose jobs differ only in storage, run name, checkpoint interval or
tracking compare against the same run. Under pytest-xdist the workers share the
cache folder; a file lock per key makes the first worker build it and the others
wait for its digest.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.helpers import jobs

# Not part of the trajectory: a reference may run with its own values of these.
_PER_JOB_KEYS = ("storage.uri", "storage.endpoint_url", "run.name")


def trajectory_key(overrides: list[str]) -> str:
    """SHA-256 (first 16 hex digits) of the trajectory fields the overrides compose to."""
    from orchestrator.checkpoint.fingerprint import trajectory_config
    from orchestrator.app.compose import compose_config

    composable = [o for o in overrides if o.partition("=")[0] not in _PER_JOB_KEYS]
    cfg = compose_config(composable + ["run.name=reference"])
    return hashlib.sha256(json.dumps(trajectory_config(cfg), sort_keys=True, default=str).encode()).hexdigest()[:16]


class References:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def digest(self, overrides: list[str], *, timeout: float = 900) -> str:
        """The final-weights digest of an uninterrupted run of ``overrides`` (run on first request)."""
        key = trajectory_key(overrides)
        folder = self.root / key
        folder.mkdir(exist_ok=True)
        done = folder / "digest"
        with open(folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if done.exists():
                return done.read_text()
            storage = jobs.Storage(str(folder / "runs"))
            base = [o for o in overrides if o.partition("=")[0] not in _PER_JOB_KEYS]
            # never interrupted, so no floor under the step time
            env = jobs.job_env(folder, {"ORCH_STEP_DELAY_SECONDS": "0"})
            result = jobs.run_job(base + storage.overrides() + ["run.name=reference"], folder, env=env, timeout=timeout)
            assert result.returncode == 0, (f"reference run {key} failed:\n" + result.stdout[-3000:]
                                            + result.stderr[-3000:])
            digest = jobs.final_digest(storage, "reference")
            done.write_text(digest)
            return digest


@pytest.fixture(scope="session")
def references(tmp_path_factory) -> References:
    base = tmp_path_factory.getbasetemp()
    # xdist workers each get basetemp/popen-gwN; their parent is the run's own, shared by all workers
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return References(root / "references")
