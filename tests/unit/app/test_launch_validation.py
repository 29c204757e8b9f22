"""Settings that an attempt's own objects would refuse are refused at launch instead: exit 4, one line, no traceback.

The requeue policy, the preemption handler and the store check their settings when they are built
(the supervisor builds the first and the last in the launcher, the worker all three in every attempt).
A bad value found there was a traceback in the launcher, or an attempt crash that an engine requeues;
``orchestrator.app.checks.validate`` finds each one before anything runs. So does a GPU count that does
not match the training processes (GPUs billed and never used).

In-process (``tests/helpers/launcher.py``): the launcher's own ``main``, no new Python per case.
"""
from __future__ import annotations

import pytest

from orchestrator.app.compose import compose_config
from orchestrator.core.errors import ConfigError
from tests.helpers import jobs
from tests.helpers.launcher import launch

FAST = [o for o in jobs.FAST if not o.startswith("requeue.")] + ["requeue.max_failures=1"]


@pytest.mark.parametrize(
    "bad,needles",
    [
        # RequeuePolicy
        ("requeue.max_preemptions=-1", ["requeue.max_preemptions=-1", "at least 0"]),
        ("requeue.max_failures=-2", ["requeue.max_failures=-2", "at least 0"]),
        ("requeue.backoff_base_seconds=-1", ["requeue.backoff_base_seconds=-1.0", "at least 0"]),
        ("requeue.backoff_max_seconds=-5", ["requeue.backoff_max_seconds=-5.0", "at least 0"]),
        ("requeue.crash_loop_threshold=0", ["requeue.crash_loop_threshold=0", "requeue.crash_loop_threshold=3"]),
        # PreemptionHandler
        ("preemption.poll_seconds=0", ["preemption.poll_seconds=0", "preemption.poll_seconds=5"]),
        # store_from_config
        ("storage.uri=gs://bucket/runs", ["storage.uri", "gs://bucket/runs", "s3://bucket/prefix"]),
        ("storage.uri=file://", ["storage.uri", "names no folder"]),
        ("storage.uri=s3://", ["storage.uri", "names no bucket"]),
        ("storage.multipart_threshold_mb=0", ["storage.multipart_threshold_mb=0", "storage.multipart_threshold_mb=64"]),
        # from_pretrained's attention kernel (orchestrator.config.train_options), which a CPU job cannot run
        ("model.attn_implementation=flash_attention_2", ["flash_attention_2 runs on CUDA GPUs only",
                                                         "model.attn_implementation=sdpa"]),
        # price_for, the worker's first step
        ("compute=h100-spot compute.gpu_type=b200", ["compute.gpu_type='b200' is not in the price catalog", "compute.price_per_hour"]),
    ],
)
def test_a_setting_an_attempt_would_refuse_exits_4_at_launch(bad, needles, tmp_path, monkeypatch, capsys):
    storage = [] if bad.startswith("storage.uri=") else [f"storage.uri={tmp_path / 'runs'}"]
    done = launch(FAST + storage + ["run.name=refused", *bad.split()], tmp_path, monkeypatch, capsys)
    jobs.assert_refused_at_launch(done, needles, tmp_path / "runs")


@pytest.mark.parametrize(
    "args,needles",
    [
        # eight GPUs billed, one process trains
        (["compute=h100-x8-spot"], ["compute=h100-x8-spot bills 8 GPUs", "distributed=none starts 1 training process",
                                    "distributed.processes_per_node=8", "compute.allow_idle_gpus=true"]),
        # two processes, one GPU (asked for: the default is one process per GPU, config/defaults.py)
        (["compute=h100-spot", "distributed=ddp", "distributed.processes_per_node=2"],
         ["bills 1 GPUs", "starts 2 training processes",
                                                    "distributed.processes_per_node=1"]),
    ],
)
def test_gpus_billed_but_not_trained_on_are_refused_at_launch(args, needles, tmp_path, monkeypatch, capsys):
    done = launch(FAST + [f"storage.uri={tmp_path / 'runs'}", "backend.dry_run=true", *args], tmp_path, monkeypatch,
                  capsys)
    assert done.returncode == 4, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_gpu_counts_that_match_or_are_deliberate_compose():
    assert compose_config(["compute=h100-x8-spot", "distributed=zero3", "distributed.processes_per_node=8"])
    assert compose_config(["compute=h100-spot"])  # one GPU, distributed=none
    assert compose_config(["compute=h100-x8-spot", "compute.allow_idle_gpus=true"]).compute.allow_idle_gpus
    assert compose_config(["compute=cpu", "distributed=ddp"])  # CPU presets have no GPUs to match
    with pytest.raises(ConfigError, match="compute.nodes=2"):
        compose_config(["compute=h100-x8-spot", "compute.nodes=2", "distributed=ddp",
                        "distributed.processes_per_node=8"])
