"""Backends: what each would submit, checked by the engines' own parsers where we have them.

- Slurm: the sbatch header, and the script body run by bash with a stand-in
  ``scontrol`` and worker (signal forwarding, requeue decisions). The full
  Slurm end-to-end test lives elsewhere (it needs the worker).
- SkyPilot: the task YAML loads with ``sky.Task.from_yaml_config``. SkyPilot
  pins click and uvicorn below what this project's venv holds, so it lives in
  its own venv: ``$SKYPILOT_PYTHON`` or ``.venv-skypilot`` (built by scripts/test.sh).
- Kubernetes: the manifest round-trips through the official client's V1Job
  model unchanged (a misspelled or misplaced field would be dropped).
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.app.compose import compose_config
from orchestrator.backends import (
    get_backend,
    run_backend,
    worker_command,
    worker_invocation,
    worker_overrides,
)
from orchestrator.core import exitcodes
from orchestrator.core.errors import ConfigError
from tests.helpers.backends import SKYPILOT_PYTHON, USER_OVERRIDES, compose, composed


@pytest.mark.slurm
def test_variants_compose_the_same_way_as_the_launcher():
    cfg, overrides = compose("slurm", "backend.partition=gpu", "compute.gpus_per_node=0", "preemption.grace=2m")
    assert cfg == compose_config(overrides)


# -- shared -------------------------------------------------------------------


@pytest.mark.slurm
def test_unknown_backend_names_the_valid_ones():
    with pytest.raises(ValueError, match="local, slurm, skypilot, kubernetes"):
        get_backend("nomad")


@pytest.mark.slurm
def test_worker_command_drops_backend_overrides_only():
    overrides = ["recipe=dpo", "backend=slurm", "backend.partition=gpu", "+backend.extra.x=1", "run.name=a b"]
    assert worker_overrides(overrides) == ["recipe=dpo", "run.name=a b"]
    assert worker_command(overrides) == "python -m orchestrator.worker recipe=dpo 'run.name=a b'"


@pytest.mark.parametrize("backend", ["slurm", "skypilot", "kubernetes"])
def test_dry_run_prints_what_would_be_submitted(backend, capsys):
    cfg, overrides = compose(backend, "backend.dry_run=true", "backend.image=registry.example/orch:1")
    assert run_backend(cfg, overrides) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == get_backend(backend).render(cfg, overrides).strip()
    assert "-m orchestrator.worker" in printed or "orchestrator.worker" in printed
    assert "backend" not in printed.split("orchestrator.worker", 1)[1].split("\n")[0]  # no backend.* for the worker


@pytest.mark.parametrize("backend", ["slurm", "skypilot", "kubernetes"])
def test_nodes_billed_but_not_started_are_refused_with_the_fix(backend):
    cfg, overrides = compose(backend, "compute.nodes=2", "backend.image=x")
    with pytest.raises(ConfigError, match="compute.nodes=2 but distributed.nodes=1.*compute.nodes=2 distributed.nodes=2"):
        get_backend(backend).render(cfg, overrides)


# -- slurm ----------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slurm
def test_sbatch_header():
    cfg, overrides = compose("slurm", "backend.partition=gpu")
    script = get_backend("slurm").render(cfg, overrides)
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --requeue" in header
    assert "#SBATCH --signal=B:USR1@30" in header
    assert "#SBATCH --job-name=exp1" in header
    assert "#SBATCH --open-mode=append" in header
    assert "#SBATCH --partition=gpu" in header
    assert "#SBATCH --gpus-per-node=8" in header
    assert any(line.startswith("#SBATCH --output=") and line.endswith("exp1-%j.out") for line in header)
    assert "scontrol requeue \"$SLURM_JOB_ID\"" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


@pytest.mark.slurm
def test_sbatch_without_gpus_asks_for_none():
    cfg, overrides = compose("slurm", "compute.gpus_per_node=0", "preemption.grace=2m")
    script = get_backend("slurm").render(cfg, overrides)
    assert "--gpus" not in script and "--partition" not in script
    assert "#SBATCH --signal=B:USR1@120" in script


FAKE_WORKER = textwrap.dedent(
    """\
    #!/bin/bash
    # stands in for python: $1 $2 are "-m orchestrator.worker"; behaviour from $FAKE_WORKER_MODE
    echo "worker args: $*" > "$FAKE_DIR/args"
    case "$FAKE_WORKER_MODE" in
      wait-for-signal)
        trap 'echo "$1" > /dev/null; echo USR1 >> "$FAKE_DIR/signals"; exit 75' USR1
        echo started > "$FAKE_DIR/started"
        for i in $(seq 200); do sleep 0.05; done; exit 0 ;;
      *) exit "$FAKE_WORKER_MODE" ;;
    esac
    """
)


@pytest.fixture
def fake_slurm(tmp_path):
    """Runs a rendered sbatch script with bash, a fake worker and a recording scontrol."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/scontrol\n')
    (bin_dir / "worker").write_text(FAKE_WORKER)
    for f in bin_dir.iterdir():
        f.chmod(0o755)

    def start(mode: str, restart_count: int = 0, extra: tuple = ()) -> subprocess.Popen:
        overrides = [*USER_OVERRIDES, "backend=slurm", f"+backend.extra.python={bin_dir / 'worker'}",
                     "requeue.max_failures=2", "requeue.max_preemptions=3", *extra]
        cfg = composed(tuple(overrides))
        script = tmp_path / "job.sbatch"
        script.write_text(get_backend("slurm").render(cfg, overrides))
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
               "SLURM_RESTART_COUNT": str(restart_count), "FAKE_WORKER_MODE": mode, "FAKE_DIR": str(tmp_path)}
        return subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=tmp_path)

    def requeued() -> bool:
        return (tmp_path / "scontrol").exists() and "requeue 4242" in (tmp_path / "scontrol").read_text()

    start.requeued = requeued
    start.dir = tmp_path
    return start


@pytest.mark.e2e
@pytest.mark.slurm
def test_sbatch_script_forwards_usr1_and_requeues_on_preemption(fake_slurm):
    job = fake_slurm("wait-for-signal")
    until = time.monotonic() + 10
    while not (fake_slurm.dir / "started").exists() and time.monotonic() < until:
        time.sleep(0.02)
    job.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@30 does before the time limit
    out, _ = job.communicate(timeout=10)
    assert (fake_slurm.dir / "signals").read_text().strip() == "USR1", out
    assert job.returncode == exitcodes.PREEMPTED, out
    assert fake_slurm.requeued(), out
    assert "run.name=exp1" in (fake_slurm.dir / "args").read_text()
    assert "backend" not in (fake_slurm.dir / "args").read_text()


@pytest.mark.e2e
@pytest.mark.slurm
@pytest.mark.parametrize("code", [exitcodes.COMPLETED, exitcodes.BUDGET_EXHAUSTED, exitcodes.CONFIG_ERROR,
                                  exitcodes.CAPS_REACHED, exitcodes.FENCED])
def test_sbatch_script_does_not_requeue_final_exits(fake_slurm, code):
    job = fake_slurm(str(code))
    job.communicate(timeout=10)
    assert job.returncode == code and not fake_slurm.requeued()


@pytest.mark.e2e
@pytest.mark.slurm
@pytest.mark.parametrize("code", [1, exitcodes.OUT_OF_MEMORY, 128 + 9])
def test_sbatch_script_requeues_crashes_and_killed_workers(fake_slurm, code):
    job = fake_slurm(str(code))
    job.communicate(timeout=10)
    assert job.returncode == code and fake_slurm.requeued()


@pytest.mark.e2e
@pytest.mark.slurm
def test_sbatch_script_stops_requeueing_after_its_own_bound(fake_slurm):
    job = fake_slurm("1", restart_count=5)  # max_failures + max_preemptions = 5
    out, _ = job.communicate(timeout=10)
    assert not fake_slurm.requeued() and "not requeued" in out


# -- skypilot -------------------------------------------------------------------


def test_skypilot_task_fields():
    cfg, overrides = compose("skypilot", "requeue.max_failures=4", "compute.cloud=aws")
    task = yaml.safe_load(get_backend("skypilot").render(cfg, overrides))
    resources = task["resources"]
    assert resources["use_spot"] is True
    assert resources["accelerators"] == "H100:8"
    assert resources["cloud"] == "aws"
    assert resources["job_recovery"] == {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 4,
                                         "recover_on_exit_codes": [75]}
    # nothing reads STORAGE_* variables: the worker takes storage.* from its overrides
    assert not any(k.startswith("STORAGE_") for k in task["envs"]), task["envs"]
    assert not any("SECRET" in k or "KEY" in k for k in task["envs"])
    assert task["run"].startswith("python -m orchestrator.worker ") and "backend" not in task["run"]
    assert task["setup"]


@pytest.mark.e2e
def test_skypilot_yaml_loads_with_skypilots_own_parser(tmp_path):
    variants = {
        "h100x8-aws": ["compute.cloud=aws"],
        "cpu-any": ["compute.gpus_per_node=0", "compute.spot=false"],
        "image-gcp": ["backend.image=registry.example/orch:1", "compute.cloud=gcp", "+backend.extra.region=us-central1"],
        "mounts": [f"+backend.extra.file_mounts={{/mnt/data: {tmp_path}, /mnt/bucket: s3://bucket/data}}"],
    }
    paths = {}
    for name, extra in variants.items():
        cfg, overrides = compose("skypilot", *extra)
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(get_backend("skypilot").render(cfg, overrides))
    check = textwrap.dedent(
        """\
        import json, sys, yaml, sky
        out = {}
        for name, path in json.loads(sys.argv[1]).items():
            task = sky.Task.from_yaml_config(yaml.safe_load(open(path)))
            (res,) = list(task.resources)
            out[name] = {"spot": res.use_spot, "accelerators": res.accelerators, "recovery": res.job_recovery,
                         "cloud": str(res.cloud) if res.cloud else None, "run": task.run, "envs": task.envs,
                         "file_mounts": task.file_mounts}
        print(json.dumps(out))
        """
    )
    done = subprocess.run([SKYPILOT_PYTHON, "-c", check, json.dumps({k: str(v) for k, v in paths.items()})],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert parsed["h100x8-aws"]["spot"] is True
    assert parsed["h100x8-aws"]["accelerators"] == {"H100": 8}
    assert parsed["h100x8-aws"]["cloud"].lower() == "aws"
    assert parsed["h100x8-aws"]["recovery"]["recover_on_exit_codes"] == [75]
    assert parsed["cpu-any"]["accelerators"] is None and parsed["cpu-any"]["spot"] is False
    assert parsed["image-gcp"]["run"].startswith("python -m orchestrator.worker")
    assert parsed["image-gcp"]["envs"]["ORCH_CONTAINER_IMAGE"] == "registry.example/orch:1"
    assert parsed["mounts"]["file_mounts"] == {"/mnt/data": str(tmp_path), "/mnt/bucket": "s3://bucket/data"}


# -- kubernetes -------------------------------------------------------------------


def test_kubernetes_requires_an_image():
    cfg, overrides = compose("kubernetes")
    with pytest.raises(ConfigError, match="backend.image"):
        get_backend("kubernetes").render(cfg, overrides)


@pytest.mark.parametrize(
    "cloud,label",
    [("gcp", ("cloud.google.com/gke-spot", "true")), ("aws", ("eks.amazonaws.com/capacityType", "SPOT")),
     ("azure", ("kubernetes.azure.com/scalesetpriority", "spot"))],
)
def test_kubernetes_job_validates_against_the_official_model(cloud, label):
    from kubernetes.client import ApiClient

    cfg, overrides = compose("kubernetes", "backend.image=registry.example/orch:1", f"compute.cloud={cloud}",
                             "requeue.max_failures=3", "requeue.max_preemptions=20")
    manifest = yaml.safe_load(get_backend("kubernetes").render(cfg, overrides))

    api = ApiClient()
    job = api.deserialize(json.dumps(manifest), "V1Job", None)  # raises on a wrong type or a missing field
    assert api.sanitize_for_serialization(job) == manifest  # nothing unknown was dropped

    spec = job.spec
    assert spec.backoff_limit == 23
    rules = spec.pod_failure_policy.rules
    assert (rules[0].action, rules[0].on_exit_codes.values) == ("Ignore", [75])
    assert (rules[1].action, sorted(rules[1].on_exit_codes.values)) == ("FailJob", [3, 4, 5, 6])
    assert rules[2].action == "Ignore" and rules[2].on_pod_conditions[0].type == "DisruptionTarget"
    pod = spec.template.spec
    assert pod.restart_policy == "Never"
    assert pod.termination_grace_period_seconds >= 30
    assert pod.node_selector == {label[0]: label[1]}
    container = pod.containers[0]
    assert container.image == "registry.example/orch:1"
    assert container.resources.limits["nvidia.com/gpu"] == "8"
    assert container.command == ["python", "-m", "orchestrator.worker"]
    assert "run.name=exp1" in container.args and not any(a.startswith("backend") for a in container.args)
    assert job.metadata.name == "exp1"
    # checkpoint snapshots go to memory: /dev/shm is an in-memory emptyDir, not the pod's default 64 MiB
    shm = [v for v in pod.volumes if v.name == container.volume_mounts[0].name][0]
    assert container.volume_mounts[0].mount_path == "/dev/shm" and shm.empty_dir.medium == "Memory"
    assert not any(e.name.startswith("STORAGE_") for e in container.env), container.env


# -- secrets, quoting and the reproducibility record, for every remote backend -----------------------

SLACK_PATH_SECRET = "XoxbSLACKPATH0123456789"
QUERY_TOKEN = "QRYTOKEN0123456789"
LIST_SECRET = "LISTSECRET0123456789"
SECRET_OVERRIDES = [
    f"budget.webhook_url=https://hooks.slack.com/services/T0AAAA/B0BBBB/{SLACK_PATH_SECRET}",
    f"+run.notes.source_url='https://data.example/train.jsonl?v=2&token={QUERY_TOKEN}'",
    f"+run.notes.auth_headers=['Bearer {LIST_SECRET}']",
]
# values a shell or a YAML reader would take apart if they were pasted in, not quoted
NASTY = "a b \"c\" 'd' $(touch PWNED) `touch PWNED2` ; #e: {f}"
NOTE = "+run.notes.note='" + NASTY.replace("'", "\\'") + "'"  # as a Hydra override: a quoted string


def _render(backend: str, *extra: str) -> str:
    overrides = [*USER_OVERRIDES, f"backend={backend}", *extra]
    cfg = composed(tuple(overrides))
    return get_backend(backend).render(cfg, overrides)


def _slurm_worker_argv(script: str) -> list[str]:
    line = next(line for line in script.splitlines() if "-m orchestrator.worker" in line)
    argv = shlex.split(line)
    assert argv[-1] == "&", line
    return argv[:-1]


@pytest.mark.slurm
def test_worker_invocation_passes_secrets_by_variable_name(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_x")  # the launcher resolves the config, so a named variable must be set
    overrides = [*USER_OVERRIDES, "backend=slurm", *SECRET_OVERRIDES, "+run.notes.hf_token=${oc.env:HF_TOKEN}"]
    cfg = composed(tuple(overrides))
    inv = worker_invocation(cfg, overrides)
    text = " ".join(inv.overrides)
    for secret in (SLACK_PATH_SECRET, QUERY_TOKEN, LIST_SECRET):
        assert secret not in text
    assert "budget.webhook_url='${oc.env:ORCH_SECRET_BUDGET_WEBHOOK_URL}'" in inv.overrides
    assert inv.secret_values["ORCH_SECRET_BUDGET_WEBHOOK_URL"].endswith(SLACK_PATH_SECRET)
    assert QUERY_TOKEN in inv.secret_values["ORCH_SECRET_RUN_NOTES_SOURCE_URL"]
    assert json.loads(inv.secret_values["ORCH_SECRET_RUN_NOTES_AUTH_HEADERS"]) == [f"Bearer {LIST_SECRET}"]
    assert inv.secret_names == ["ORCH_SECRET_BUDGET_WEBHOOK_URL", "ORCH_SECRET_RUN_NOTES_SOURCE_URL",
                                "ORCH_SECRET_RUN_NOTES_AUTH_HEADERS", "HF_TOKEN"]
    assert "run.name=exp1" in inv.overrides and "storage.uri=s3://bucket/runs" in inv.overrides

    # the worker composes exactly the values the user gave, reading them from the environment
    env = {**inv.secret_values, "HF_TOKEN": "hf_x"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        worker_cfg = compose_config(inv.overrides)
        assert worker_cfg.budget.webhook_url == cfg.budget.webhook_url
        assert worker_cfg.run.notes.source_url == cfg.run.notes.source_url
        assert list(worker_cfg.run.notes.auth_headers) == [f"Bearer {LIST_SECRET}"]


@pytest.mark.slurm
@pytest.mark.parametrize("backend", ["slurm", "skypilot"])
def test_slurm_and_skypilot_text_holds_no_secret(backend):
    text = _render(backend, *SECRET_OVERRIDES)
    for secret in (SLACK_PATH_SECRET, QUERY_TOKEN, LIST_SECRET, "hooks.slack.com"):
        assert secret not in text, (secret, text)
    assert "ORCH_SECRET_BUDGET_WEBHOOK_URL" in text


@pytest.mark.e2e
def test_skypilot_passes_secrets_as_skypilot_secrets(tmp_path):
    overrides = [*USER_OVERRIDES, "backend=skypilot", *SECRET_OVERRIDES]
    cfg = composed(tuple(overrides))
    task = yaml.safe_load(get_backend("skypilot").render(cfg, overrides))
    names = worker_invocation(cfg, overrides).secret_names
    assert task["secrets"] == {name: None for name in names}
    # SkyPilot's own parser takes the values from --secret at launch; they never touch the file
    path = tmp_path / "task.yaml"
    path.write_text(get_backend("skypilot").render(cfg, overrides))
    check = ("import json, sys, yaml, sky\n"
             "t = sky.Task.from_yaml_config(yaml.safe_load(open(sys.argv[1])), secrets_overrides=[(n, 'v-' + n) for n in json.loads(sys.argv[2])])\n"
             "print(json.dumps(sorted(t.secrets)))\n")
    done = subprocess.run([SKYPILOT_PYTHON, "-c", check, str(path), json.dumps(names)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == sorted(names)


def test_kubernetes_refuses_a_literal_secret_with_the_fix():
    with pytest.raises(ConfigError, match=r"budget.webhook_url.*kubectl create secret generic spot-orchestrator"):
        _render("kubernetes", "backend.image=registry.example/orch:1", SECRET_OVERRIDES[0])


def test_kubernetes_reads_secrets_from_a_secret_by_name(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    text = _render("kubernetes", "backend.image=registry.example/orch:1", "budget.webhook_url_env=SLACK_WEBHOOK_URL",
                   "+run.notes.hf_token=${oc.env:HF_TOKEN}", "+backend.extra.secret_name=train-secrets")
    env = {e["name"]: e for e in yaml.safe_load(text)["spec"]["template"]["spec"]["containers"][0]["env"]}
    for name in ("SLACK_WEBHOOK_URL", "HF_TOKEN"):
        assert env[name]["valueFrom"] == {"secretKeyRef": {"name": "train-secrets", "key": name}}
    assert "budget.webhook_url_env=SLACK_WEBHOOK_URL" in text


@pytest.mark.slurm
def test_slurm_submit_hands_secrets_to_sbatch_in_its_environment(tmp_path, monkeypatch):
    """The script holds only variable names; sbatch (which exports its environment to the job) gets the values."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/bash\nenv > {tmp_path}/sbatch.env\ncp "$2" {tmp_path}/job.sbatch\necho 77\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    overrides = [*USER_OVERRIDES, "backend=slurm", f"run.work_dir={tmp_path / 'work'}", *SECRET_OVERRIDES]
    cfg = compose_config(overrides)
    assert get_backend("slurm").submit(cfg, overrides) == "77"
    script = (tmp_path / "job.sbatch").read_text()
    for secret in (SLACK_PATH_SECRET, QUERY_TOKEN, LIST_SECRET):
        assert secret not in script
    env = dict(line.split("=", 1) for line in (tmp_path / "sbatch.env").read_text().splitlines() if "=" in line)
    assert env["ORCH_SECRET_BUDGET_WEBHOOK_URL"].endswith(SLACK_PATH_SECRET)
    assert QUERY_TOKEN in env["ORCH_SECRET_RUN_NOTES_SOURCE_URL"]


@pytest.mark.e2e
@pytest.mark.slurm
def test_sbatch_script_stops_with_exit_4_when_a_secret_did_not_reach_the_job(tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(_render("slurm", SECRET_OVERRIDES[0], f"+backend.extra.python={tmp_path / 'never-run'}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_SECRET_")}
    done = subprocess.run(["bash", str(script)], env={**env, "SLURM_JOB_ID": "1"}, capture_output=True, text=True,
                          timeout=30, cwd=tmp_path)
    assert done.returncode == exitcodes.CONFIG_ERROR, done.stderr
    assert "ORCH_SECRET_BUDGET_WEBHOOK_URL is not set" in done.stderr


@pytest.mark.e2e
@pytest.mark.slurm
def test_sbatch_quotes_every_interpolated_value(fake_slurm, tmp_path):
    out = tmp_path / "logs dir" / "o-%j.out"
    overrides = [NOTE, f"+backend.extra.output={out}",
                 "+backend.extra.sbatch_args=['--comment=two words']"]
    script = _render("slurm", *overrides)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    options = [line[len("#SBATCH "):] for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert all(len(shlex.split(opt)) == 1 for opt in options), options  # sbatch reads each as one option
    assert f"--output={out}" in [shlex.split(opt)[0] for opt in options]
    assert "--comment=two words" in [shlex.split(opt)[0] for opt in options]
    argv = _slurm_worker_argv(script)
    assert argv[1:3] == ["-m", "orchestrator.worker"] and NOTE in argv
    # and bash, running it, hands the worker the value untouched and runs nothing from it
    job = fake_slurm("0", extra=(NOTE,))
    job.communicate(timeout=10)
    assert NOTE in (fake_slurm.dir / "args").read_text()
    assert not list(fake_slurm.dir.glob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))


def test_kubernetes_and_skypilot_serialise_values_with_yaml(tmp_path):
    note = NOTE
    pod = yaml.safe_load(_render("kubernetes", "backend.image=registry.example/orch:1", note))
    assert note in pod["spec"]["template"]["spec"]["containers"][0]["args"]
    task = yaml.safe_load(_render("skypilot", note))
    run = shlex.split(task["run"])  # SkyPilot runs it with bash
    assert run[:3] == ["python", "-m", "orchestrator.worker"] and note in run


@pytest.mark.slurm
@pytest.mark.parametrize("backend", ["slurm", "skypilot", "kubernetes"])
def test_generated_text_carries_the_image_for_the_repro_record(backend):
    text = _render(backend, "backend.image=registry.example/orch:1.2")
    if backend == "slurm":
        assert "export ORCH_CONTAINER_IMAGE=registry.example/orch:1.2" in text
    elif backend == "skypilot":
        assert yaml.safe_load(text)["envs"]["ORCH_CONTAINER_IMAGE"] == "registry.example/orch:1.2"
    else:
        env = yaml.safe_load(text)["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "ORCH_CONTAINER_IMAGE", "value": "registry.example/orch:1.2"} in env


@pytest.mark.e2e
def test_skypilot_without_an_image_carries_the_launch_commit():
    """The synced workdir has no .git: the task carries the commit it was launched from."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    envs = yaml.safe_load(_render("skypilot"))["envs"]
    assert envs["ORCH_GIT_COMMIT"] == head
    assert envs["ORCH_GIT_DIRTY"] in ("true", "false")
    assert "ORCH_GIT_COMMIT" not in yaml.safe_load(_render("skypilot", "backend.image=registry.example/orch:1"))["envs"]


def test_backend_settings_are_typed_and_an_unknown_one_is_refused_at_launch(tmp_path, monkeypatch, capsys):
    from tests.helpers.launcher import launch

    from orchestrator.backends.settings import (
        KubernetesSettings,
        SlurmSettings,
        backend_settings,
    )

    cfg = compose_config(["backend=slurm", "+backend.extra.sbatch_args=['--time=01:00:00']", "+backend.extra.output=/x/%j"])
    assert backend_settings(cfg) == SlurmSettings(output="/x/%j", sbatch_args=("--time=01:00:00",))
    k8s = backend_settings(compose_config(["backend=kubernetes", "storage.uri=s3://b/runs", "backend.image=img",
                                           "+backend.extra.namespace=training"]))
    assert isinstance(k8s, KubernetesSettings) and k8s.namespace == "training" and k8s.secret_name == "spot-orchestrator"
    for bad, needle in ((["backend=slurm", "+backend.extra.partiton=gpu"], "not a setting of backend=slurm"),
                        (["backend=skypilot", "storage.uri=s3://b/runs", "+backend.extra.disk_size=big"], "whole number"),
                        (["backend=slurm", "+backend.extra.sbatch_args=one-option"], "must be a list")):
        done = launch([*bad, "backend.dry_run=true"], tmp_path, monkeypatch, capsys)
        assert done.returncode == 4 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr
