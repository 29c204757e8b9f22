"""HF_TOKEN reaches every backend's job as a secret, by name: its value is in no rendered or submitted file.

A job that reads a hub model gets the launcher's ``HF_TOKEN`` (a gated Llama needs it in every attempt):
Slurm exports it by name (``#SBATCH --export=ALL,HF_TOKEN``) from sbatch's environment, SkyPilot lists it under
``secrets:`` with no value and is launched with ``--secret HF_TOKEN``, Kubernetes reads it from a Secret
(``secretKeyRef``, the Secret's name ``backend.extra.secret_name``). Each backend's tool is a stand-in on PATH
that records the file it was handed and the environment it was given.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.backends import get_backend
from tests.helpers.backends import SKYPILOT_PYTHON, compose

TOKEN = "hf_sekrit"
HUB_MODEL = "model.name_or_path=meta-llama/Llama-3.1-8B"


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """sbatch, sky and kubectl stand-ins: each copies the file it is given to <tmp>/<tool>.file and writes its
    arguments and the HF_TOKEN it sees to <tmp>/<tool>.json."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, answer in (("sbatch", "77"), ("sky", "ok"), ("kubectl", "job.batch/exp1 created")):
        (bin_dir / tool).write_text(
            "#!/bin/bash\n"
            f'cp "${{@: -1}}" {tmp_path}/{tool}.file\n'
            f"python3 -c 'import json, os, sys; json.dump({{\"argv\": sys.argv[1:], \"token\": os.environ.get(\"HF_TOKEN\")}}, "
            f"open(\"{tmp_path}/{tool}.json\", \"w\"))' \"$@\"\n"
            f"echo {answer}\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("HF_TOKEN", TOKEN)

    def submitted(tool: str) -> tuple[str, dict]:
        return (tmp_path / f"{tool}.file").read_text(), json.loads((tmp_path / f"{tool}.json").read_text())

    return submitted


def _submit(backend: str, tmp_path: Path, *extra: str) -> str:
    cfg, overrides = compose(backend, HUB_MODEL, f"run.work_dir={tmp_path / 'work'}", *extra)
    rendered = get_backend(backend).render(cfg, overrides)
    get_backend(backend).submit(cfg, overrides)
    return rendered


def test_slurm_exports_hf_token_by_name_and_the_job_receives_it(tools, tmp_path):
    worker = tmp_path / "worker"  # stands in for python on the compute node: records the token it got
    worker.write_text(f'#!/bin/bash\necho "$HF_TOKEN" > {tmp_path}/worker-token\n')
    worker.chmod(0o755)
    rendered = _submit("slurm", tmp_path, f"+backend.extra.python={worker}")
    script, sbatch = tools("sbatch")
    assert TOKEN not in rendered and TOKEN not in script
    assert "#SBATCH --export=ALL,HF_TOKEN" in script.splitlines()
    assert sbatch["token"] == TOKEN  # sbatch's environment, which --export hands to the job
    # the job: the script run with the environment sbatch exported
    done = subprocess.run(["bash", "-c", script], env={**os.environ, "SLURM_JOB_ID": "77"}, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "worker-token").read_text().strip() == TOKEN


def test_skypilot_passes_hf_token_as_a_secret_by_name(tools, tmp_path):
    rendered = _submit("skypilot", tmp_path)
    task_text, sky = tools("sky")
    assert TOKEN not in rendered and TOKEN not in task_text
    task = yaml.safe_load(task_text)
    assert task["secrets"] == {"HF_TOKEN": None}
    assert "HF_TOKEN" not in task["envs"]
    argv = sky["argv"]
    assert argv[argv.index("--secret") + 1] == "HF_TOKEN" and sky["token"] == TOKEN  # --secret NAME reads it here
    # SkyPilot's own parser reads the task back (scripts/test.sh builds .venv-skypilot): a missing venv fails, as the
    # other SkyPilot parser tests do, rather than skip
    assert Path(SKYPILOT_PYTHON).exists(), f"no SkyPilot venv at {SKYPILOT_PYTHON}: run bash scripts/test.sh once"
    path = tmp_path / "task.yaml"
    path.write_text(task_text)
    check = ("import json, sys, yaml, sky\n"
             "t = sky.Task.from_yaml_config(yaml.safe_load(open(sys.argv[1])), secrets_overrides=[('HF_TOKEN', sys.argv[2])])\n"
             "print(json.dumps({k: v.get_secret_value() for k, v in t.secrets.items()}))\n")  # pydantic SecretStr
    done = subprocess.run([SKYPILOT_PYTHON, "-c", check, str(path), TOKEN], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"HF_TOKEN": TOKEN}


@pytest.mark.parametrize("nodes", [1, 2])
def test_kubernetes_reads_hf_token_from_the_named_secret(tools, tmp_path, nodes):
    extra = ["backend.image=registry.example/orch:1", "compute.cloud=gcp", "+backend.extra.secret_name=hub-secrets"]
    if nodes > 1:
        extra += [f"compute.nodes={nodes}", f"distributed.nodes={nodes}"]
    rendered = _submit("kubernetes", tmp_path, *extra)
    manifest_text, kubectl = tools("kubectl")
    assert TOKEN not in rendered and TOKEN not in manifest_text
    manifest = yaml.safe_load(manifest_text)
    if nodes == 1:
        pods = [manifest["spec"]["template"]["spec"]]
    else:
        pods = [next(j for j in manifest["spec"]["replicatedJobs"] if j["name"] == "nodes")["template"]["spec"]
                ["template"]["spec"]]
    env = {e["name"]: e for e in pods[0]["containers"][0]["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN",
                               "valueFrom": {"secretKeyRef": {"name": "hub-secrets", "key": "HF_TOKEN"}}}


@pytest.mark.parametrize("backend", ["slurm", "skypilot", "kubernetes"])
def test_a_job_that_reads_nothing_from_the_hub_is_not_handed_the_token(backend, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    cfg, overrides = compose(backend, "backend.image=registry.example/orch:1", "compute.cloud=aws")  # model=tiny
    text = get_backend(backend).render(cfg, overrides)
    assert "HF_TOKEN" not in text and TOKEN not in text
