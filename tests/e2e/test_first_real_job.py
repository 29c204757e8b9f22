"""docs/first-real-job.md, run as a user reads it: every shell command on the page, in order, from the repository
root, with what each step promises checked in its output.

Offline: the hub is not asked (HF_HUB_OFFLINE: the launch check warns and goes on), nor the clouds' price APIs
(ORCH_PRICES_OFFLINE); the SkyPilot step is a dry run. ``export`` lines set the variable for the commands after.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.pages import shell_commands
from tests.helpers.paths import REPO

ROOT = REPO
PAGE = ROOT / "docs" / "first-real-job.md"
TOKEN = "hf_pagetestnotasecret0123456789"


def _expect(command: str, out: str) -> None:
    """What the page says each command shows."""
    if command.startswith("bash scripts/run.sh"):
        assert "held-out accuracy before training" in out or "already complete" in out, out[-2000:]
    elif " plan " in f" {command} ":
        assert "recommendation:" in out and "prices: shipped catalog" in out
        assert "WARNING: these figures price 300 steps of the built-in arithmetic data" in out
    elif "--cfg job" in command:
        assert "learning_rate: 0.0002" in out and "gradient_checkpointing: true" in out
        assert "mixed_precision: bf16" in out and "name_or_path: meta-llama/Llama-3.1-8B" in out
    elif "backend=skypilot" in command:
        assert "# sky jobs launch -y --secret HF_TOKEN <this file>" in out
        assert "secrets:\n  HF_TOKEN: null" in out and 'pip install -c constraints.txt "torch==2.13.0" -e .' in out
        assert "recover_on_exit_codes:\n    - 75" in out and "use_spot: true" in out
        assert TOKEN not in out  # the token's value is in no rendered file
    else:
        raise AssertionError(f"the page shows a command this test does not know what to expect of: {command}")


@pytest.mark.e2e
def test_every_command_of_the_first_real_job_page_runs_and_shows_what_the_page_says(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ORCH_PRICES_OFFLINE": "1", "HOME": str(tmp_path)}
    env.pop("HF_TOKEN", None)
    commands = shell_commands(PAGE)
    assert len(commands) == 5, commands
    for command in commands:
        if command.startswith("export "):
            name, _, _value = command.removeprefix("export ").partition("=")
            env[name] = TOKEN  # the page's placeholder, as a user's token
            continue
        done = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"{command}\n{out[-3000:]}"
        _expect(command, out)
