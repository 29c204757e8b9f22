"""The launcher composes the job config once: the default folders and the pinned hub revisions go into the
composed config and into the overrides handed to the backend alike, and the config is validated once."""
from __future__ import annotations

import hydra
import pytest
from omegaconf import OmegaConf

from orchestrator import launch
from orchestrator.app.compose import compose_config
from orchestrator.core.errors import ConfigError

SHAS = {"model": "a" * 40, "dataset": "b" * 40}
HUB_JOB = ["model=qwen2.5-0.5b", "model.revision=main", "data=hub", "data.path=org/set"]


@pytest.fixture
def composes(monkeypatch, tmp_path):
    """How many times Hydra composes; the hub online, answered by ``SHAS``; launched from ``tmp_path``."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.chdir(tmp_path)
    calls = []
    real = hydra.compose

    def counted(*args, **kwargs):
        calls.append(kwargs.get("overrides"))
        return real(*args, **kwargs)

    monkeypatch.setattr(hydra, "compose", counted)
    return calls


def test_the_launcher_composes_once_and_hands_the_backend_the_same_overrides(composes, tmp_path):
    cfg, overrides = launch.compose_for_launch(list(HUB_JOB), resolve=lambda kind, repo, rev: SHAS[kind])
    assert len(composes) == 1, composes
    assert overrides == ["model=qwen2.5-0.5b", "data=hub", "data.path=org/set",
                         f"storage.uri={tmp_path}/.cache/runs", f"run.work_dir={tmp_path}/.cache/work",
                         "model.revision=" + "a" * 40, "data.revision=" + "b" * 40]
    assert cfg.model.revision == "a" * 40 and cfg.data.revision == "b" * 40
    assert cfg.storage.uri == f"{tmp_path}/.cache/runs" and cfg.run.work_dir == f"{tmp_path}/.cache/work"
    # what the worker composes from those overrides is the config the launcher validated and planned
    assert OmegaConf.to_container(compose_config(overrides), resolve=True) == OmegaConf.to_container(cfg, resolve=True)


def test_a_bad_config_is_still_refused_at_launch(composes):
    with pytest.raises(ConfigError, match="run.name"):
        launch.compose_for_launch(["run.name=bad name!"], resolve=lambda *a: "c" * 40)
    assert len(composes) == 1


def test_a_pinned_commit_that_reads_as_a_number_stays_the_commit(composes):
    # "1e111..." is a float to YAML: the launcher's additions are merged as the strings given
    commit = "1e" + "1" * 38
    cfg, overrides = launch.compose_for_launch(list(HUB_JOB), resolve=lambda kind, repo, rev: commit)
    assert cfg.model.revision == commit and cfg.data.revision == commit
    assert f"model.revision={commit}" in overrides


def test_a_primed_config_is_composed_once_for_each_forked_child_and_still_checked_in_it(composes, monkeypatch):
    """What a supervisor does before it forks its attempts (``config.compose.prime``): each forked child takes the
    composed config without composing, the parent keeps it for the next child, and the child's own environment is
    still checked (an unset variable the config reads is refused in the child)."""
    import os

    from orchestrator.config.compose import prime

    job = ["run.name=primed", "storage.uri=${oc.env:PRIMED_BUCKET}"]
    prime(job)
    assert len(composes) == 1
    read, write = os.pipe()
    for bucket in ("s3://first", None):
        pid = os.fork()
        if pid == 0:  # a forked attempt: composes nothing, resolves against its own environment
            os.close(read)
            if bucket:
                os.environ["PRIMED_BUCKET"] = bucket
            else:
                os.environ.pop("PRIMED_BUCKET", None)
            try:
                answer = f"{compose_config(job, launch_checks=False).storage.uri} {len(composes)}"
            except ConfigError as err:
                answer = f"refused {len(composes)} {err}"
            os.write(write, (answer + "\n").encode())
            os._exit(0)
        os.waitpid(pid, 0)
    os.close(write)
    with os.fdopen(read) as answers:
        first, second = answers.read().splitlines()
    assert first == "s3://first 1"
    assert second.startswith("refused 1 ") and "PRIMED_BUCKET" in second
    # the parent's copy is the next child's; once taken here, the next compose composes again
    monkeypatch.setenv("PRIMED_BUCKET", "s3://here")
    assert compose_config(job, launch_checks=False).storage.uri == "s3://here" and len(composes) == 1
    compose_config(job, launch_checks=False)
    assert len(composes) == 2
