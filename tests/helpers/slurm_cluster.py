"""A one-node Slurm cluster for end-to-end tests: ``ensure_slurm()`` brings it up or fails the test."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SLURM_UP_SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "slurm-up.sh"
SLURM_UP_TIMEOUT_SECONDS = 600  # a first run installs packages with apt


def ensure_slurm() -> None:
    """Run .ci/slurm-up.sh (idempotent: quick when the cluster already answers).

    Fails the calling test loudly, with the script's output, when the cluster
    cannot be brought up (not root, no apt, a daemon that will not start).
    Jobs can then be submitted with sbatch to the default partition "debug".
    Note that Slurm delays a requeued job by about two minutes (its
    EligibleTime); a test can skip that with
    ``scontrol update JobId=<id> StartTime=now``.
    """
    if os.geteuid() != 0 and not shutil.which("sinfo"):
        pytest.fail(f"Slurm is not installed and {SLURM_UP_SCRIPT} must run as root to install it")
    try:
        done = subprocess.run(
            ["bash", str(SLURM_UP_SCRIPT)], capture_output=True, text=True, timeout=SLURM_UP_TIMEOUT_SECONDS
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{SLURM_UP_SCRIPT} did not finish within {SLURM_UP_TIMEOUT_SECONDS}s:\n{err.stdout or ''}{err.stderr or ''}")
    if done.returncode != 0:
        pytest.fail(f"{SLURM_UP_SCRIPT} could not bring Slurm up (exit {done.returncode}):\n{done.stdout}{done.stderr}")
