"""``checkpoint.every=auto`` on a real job: an explicit ``compute.preemptions_per_hour`` is used on any capacity.

A Slurm partition with ``PreemptMode=REQUEUE`` or a shared machine preempts jobs priced on-demand; when the user
says how often, the interval follows it (``orchestrator.policy.interval``), on ``compute=cpu`` (on-demand) too.
"""
from __future__ import annotations

import re

import pytest

from tests.helpers import jobs


@pytest.mark.e2e
def test_an_explicit_preemption_rate_sets_the_auto_interval_on_on_demand_capacity(tmp_path):
    """Also: the two start-up figures every start prints have one name each."""
    storage = jobs.Storage(str(tmp_path / "runs"))
    # 600 preemptions an hour: M = 6 s, so T = sqrt(2 C M) is a couple of seconds (held at min_every=1s at least)
    overrides = jobs.with_overrides(jobs.FAST + storage.overrides(), "run.name=auto", "compute=cpu",
                                    "checkpoint.every=auto", "compute.preemptions_per_hour=600",
                                    "checkpoint.min_every=1s", "train.max_steps=80")
    done = jobs.run_job(overrides, tmp_path, env=jobs.job_env(tmp_path, {"ORCH_STEP_DELAY_SECONDS": "0.1"}))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert "prior from compute.preemptions_per_hour" in log, log[-3000:]
    # two start-up figures, one name each: the restart split's from process start, the cost meter's from its start
    assert len(re.findall(r"start to first step", log)) == 1 and "process start to first step" in log, log[-3000:]
    assert len(re.findall(r"metered start-up: [0-9.]+s", log)) == 1, log[-3000:]
    chosen = jobs.ledger(storage, "auto")["attempts"][-1]["extra"]["checkpoint_interval"]
    assert chosen["preemptions_per_hour"] == 600.0 and chosen["checkpoint_interval_s"] < 10.0
    # 80 steps at >= 0.1 s each is >= 8 s of training: an interval of a few seconds commits several checkpoints
    # (not none, as an hour's interval does); retention keeps keep_last of them, the ledger counts all
    assert jobs.ledger(storage, "auto")["checkpoints_committed"] >= 3, log[-3000:]
