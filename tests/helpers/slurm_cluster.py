"""Slurm clusters for end-to-end tests: ``ensure_slurm()`` (one node) and ``ensure_slurm_two_nodes()`` bring one up or fail the test."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SLURM_UP_SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "slurm-up.sh"
SLURM_UP_TIMEOUT_SECONDS = 600  # a first run installs packages with apt
# Releases a requeued job held by Slurm's requeue delay. Not "now": a start in the same second as the
# requeue gets a credential slurmd still counts as revoked, and Slurm kills the job as "non-startable batch
# job: Job credential revoked" (JobState=FAILED), seen in the two-node test under load.
RELEASE = "StartTime=now+3"


def ensure_slurm() -> None:
    """Run .ci/slurm-up.sh (idempotent: quick when the cluster already answers).

    Fails the calling test loudly, with the script's output, when the cluster
    cannot be brought up (not root, no apt, a daemon that will not start).
    Jobs can then be submitted with sbatch to the default partition "debug".
    Note that Slurm delays a requeued job by about two minutes (its
    EligibleTime); a test can skip that with
    ``scontrol update JobId=<id> StartTime=now+3`` (``RELEASE``).
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


SLURM_TWO_NODES_UP_SCRIPT = SLURM_UP_SCRIPT.with_name("slurm-two-nodes-up.sh")
SLURM_TWO_NODES_CONF = "/etc/slurm-two-nodes/slurm.conf"


def ensure_slurm_two_nodes() -> dict[str, str]:
    """Run .ci/slurm-two-nodes-up.sh (idempotent) and return the environment that reaches its cluster.

    The two-node cluster (nodes n1 and n2, partition "multi": two slurmd daemons on this host) is a
    cluster of its own beside the one-node one: pass the returned ``{"SLURM_CONF": ...}`` to sbatch,
    scontrol and the launcher. Fails the calling test, with the script's output, when it cannot come up.
    """
    if os.geteuid() != 0 and not shutil.which("sinfo"):
        pytest.fail(f"Slurm is not installed and {SLURM_TWO_NODES_UP_SCRIPT} must run as root to install it")
    try:
        done = subprocess.run(["bash", str(SLURM_TWO_NODES_UP_SCRIPT)], capture_output=True, text=True,
                              timeout=SLURM_UP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{SLURM_TWO_NODES_UP_SCRIPT} did not finish within {SLURM_UP_TIMEOUT_SECONDS}s:\n"
                    f"{err.stdout or ''}{err.stderr or ''}")
    if done.returncode != 0:
        pytest.fail(f"{SLURM_TWO_NODES_UP_SCRIPT} could not bring the two-node cluster up (exit {done.returncode}):\n"
                    f"{done.stdout}{done.stderr}")
    return {"SLURM_CONF": SLURM_TWO_NODES_CONF}
