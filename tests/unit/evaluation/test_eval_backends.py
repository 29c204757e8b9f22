"""``orchestrator eval <uri>/<run> backend=slurm|skypilot|kubernetes``: the eval job rendered by the training
backends' own code, running ``python -m orchestrator eval <uri>/<run> ...`` instead of the worker, with secrets by
name only, requeue on preemption (exit 75) and the machine of ``compute=``."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import textwrap

import pytest
import yaml

from orchestrator.cli import evaluate as eval_command
from orchestrator.evaluation import job
from tests.helpers.backends import SKYPILOT_PYTHON

RUN_URI = "s3://bucket/runs/exp1"
OVERRIDES = ["eval.tasks=[tiny_arith_mc]", "eval.limit=50", "compute=t4-spot", "storage.endpoint_url=http://minio:9000"]
EVAL_ARGV = ["-m", "orchestrator", "eval", RUN_URI]
WEBHOOK_SECRET = "XoxbEVALPATH0123456789"
WEBHOOK = f"budget.webhook_url=https://hooks.slack.com/services/T0AAAA/B0BBBB/{WEBHOOK_SECRET}"


def _dry_run(capsys, backend: str, *extra: str) -> tuple[int, str, str]:
    code = eval_command.main([RUN_URI, *OVERRIDES, f"backend={backend}", "backend.dry_run=true", *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def _slurm_eval_argv(script: str) -> list[str]:
    line = next(line for line in script.splitlines() if " -m orchestrator eval " in line and not line.startswith("#"))
    argv = shlex.split(line)
    assert argv[-1] == "&", line
    return argv[:-1]


def test_slurm_renders_the_eval_command_with_the_run_uri_and_requeue(capsys):
    code, script, err = _dry_run(capsys, "slurm", "backend.partition=spot")
    assert code == 0, err
    argv = _slurm_eval_argv(script)
    assert argv[1:5] == EVAL_ARGV
    assert argv[5:] == OVERRIDES  # the job's overrides, less backend.*
    assert "orchestrator.worker" not in script
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --job-name=exp1-eval" in header and "#SBATCH --requeue" in header
    assert "#SBATCH --partition=spot" in header
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script and "  75)" in script
    assert f"# submitted by: python -m orchestrator eval {RUN_URI} backend=slurm" in script


@pytest.mark.parametrize("rc, requeued", [(2, False), (4, False), (3, False), (0, False), (75, True), (1, True)])
def test_the_slurm_eval_script_requeues_a_preemption_or_crash_but_never_a_user_error(capsys, tmp_path, rc, requeued):
    """The rendered script itself, run by bash: its eval command (a stand-in interpreter exiting ``rc``) ends
    with a user error (2: the URI or store, 4: the config, 3: a cap), and the job ends; 75 or a crash requeues."""
    fake_python, calls = tmp_path / "python", tmp_path / "scontrol.calls"
    fake_python.write_text(f"#!/bin/bash\necho \"$@\" > {tmp_path}/argv\nexit {rc}\n")
    (tmp_path / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {calls}\n')
    for tool in (fake_python, tmp_path / "scontrol"):
        tool.chmod(0o755)
    code, script, err = _dry_run(capsys, "slurm", f"+backend.extra.python={fake_python}")
    assert code == 0, err
    (tmp_path / "eval.sbatch").write_text(script)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": "0"}
    done = subprocess.run(["bash", str(tmp_path / "eval.sbatch")], env=env, capture_output=True, text=True, timeout=60)
    assert (tmp_path / "argv").read_text().split()[:4] == EVAL_ARGV  # the eval command ran
    assert done.returncode == rc, done.stderr
    assert calls.exists() == requeued, done.stderr
    if requeued:
        assert calls.read_text() == "requeue 41\n"
    else:
        assert f"exited {rc} (final); not requeued" in done.stderr, done.stderr


def test_kubernetes_eval_job_fails_at_once_on_a_user_error(capsys):
    code, text, err = _dry_run(capsys, "kubernetes", "backend.image=registry.example/orch:1")
    assert code == 0, err
    rules = yaml.safe_load(text)["spec"]["podFailurePolicy"]["rules"]
    (fail_job,) = [r for r in rules if r["action"] == "FailJob"]
    assert {2, 3, 4} <= set(fail_job["onExitCodes"]["values"]) and 75 not in fail_job["onExitCodes"]["values"]


def test_slurm_submit_hands_the_eval_jobs_secrets_to_sbatch_in_its_environment(capsys, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = f'#!/bin/bash\nenv > {tmp_path}/sbatch.env\ncp "$2" {tmp_path}/job.sbatch\necho 77\n'
    (bin_dir / "sbatch").write_text(fake)
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    code = eval_command.main([RUN_URI, *OVERRIDES, "backend=slurm", f"run.work_dir={tmp_path / 'work'}", WEBHOOK])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "submitted 'exp1-eval' to slurm: job 77" in out.out
    script = (tmp_path / "job.sbatch").read_text()
    assert WEBHOOK_SECRET not in script and _slurm_eval_argv(script)[1:5] == EVAL_ARGV
    env = dict(line.split("=", 1) for line in (tmp_path / "sbatch.env").read_text().splitlines() if "=" in line)
    assert env["ORCH_SECRET_BUDGET_WEBHOOK_URL"].endswith(WEBHOOK_SECRET)


def test_kubernetes_eval_job_validates_against_the_official_model(capsys):
    from kubernetes.client import ApiClient

    code, text, err = _dry_run(capsys, "kubernetes", "backend.image=registry.example/orch:1", "compute.cloud=gcp")
    assert code == 0, err
    manifest = yaml.safe_load(text)
    api = ApiClient()
    kjob = api.deserialize(json.dumps(manifest), "V1Job", None)
    assert api.sanitize_for_serialization(kjob) == manifest
    assert kjob.metadata.name == "exp1-eval"  # not the training Job's name: applying it leaves that Job alone
    container = kjob.spec.template.spec.containers[0]
    assert container.command == ["python", *EVAL_ARGV]
    assert container.args == [*OVERRIDES, "compute.cloud=gcp"]
    rules = kjob.spec.pod_failure_policy.rules
    assert (rules[0].action, rules[0].on_exit_codes.values) == ("Ignore", [75])
    assert kjob.spec.template.spec.node_selector == {"cloud.google.com/gke-spot": "true"}  # t4-spot: a spot node
    assert container.resources.limits["nvidia.com/gpu"] == "1"


def test_skypilot_eval_task_runs_the_eval_command_on_the_compute_it_names(capsys):
    code, text, err = _dry_run(capsys, "skypilot", "compute.cloud=aws")
    assert code == 0, err
    task = yaml.safe_load(text)
    assert task["name"] == "exp1-eval"
    assert shlex.split(task["run"]) == ["python", *EVAL_ARGV, *OVERRIDES, "compute.cloud=aws"]
    assert task["resources"]["use_spot"] is True and task["resources"]["accelerators"] == "T4:1"
    assert task["resources"]["job_recovery"]["recover_on_exit_codes"] == [75]


@pytest.mark.e2e
def test_skypilot_eval_task_loads_with_skypilots_own_parser(capsys, tmp_path):
    code, text, err = _dry_run(capsys, "skypilot", "compute.cloud=aws")
    assert code == 0, err
    path = tmp_path / "eval.yaml"
    path.write_text(text)
    check = textwrap.dedent("""\
        import json, sys, yaml, sky
        task = sky.Task.from_yaml_config(yaml.safe_load(open(sys.argv[1])))
        (res,) = list(task.resources)
        print(json.dumps({"run": task.run, "name": task.name, "spot": res.use_spot,
                          "accelerators": res.accelerators, "recovery": res.job_recovery}))
        """)
    done = subprocess.run([SKYPILOT_PYTHON, "-c", check, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert shlex.split(parsed["run"]) == ["python", *EVAL_ARGV, *OVERRIDES, "compute.cloud=aws"]
    assert parsed["name"] == "exp1-eval" and parsed["spot"] is True and parsed["accelerators"] == {"T4": 1}
    assert parsed["recovery"]["recover_on_exit_codes"] == [75]


@pytest.mark.parametrize("backend", ["slurm", "skypilot"])
def test_eval_job_text_holds_no_secret_value(capsys, backend):
    code, text, err = _dry_run(capsys, backend, WEBHOOK)
    assert code == 0, err
    assert WEBHOOK_SECRET not in text
    argv = _slurm_eval_argv(text) if backend == "slurm" else shlex.split(yaml.safe_load(text)["run"])
    assert argv[1:5] == EVAL_ARGV
    assert "budget.webhook_url='${oc.env:ORCH_SECRET_BUDGET_WEBHOOK_URL}'" in argv  # read from the environment


@pytest.mark.parametrize("extra,expected", [
    (["backend=kubernetes", "backend.image=registry.example/orch:1", WEBHOOK], "Kubernetes Secret"),
    (["backend=slurm", "+backend.extra.sbatch_args=[time]"], "list of long sbatch options"),
    (["backend=slurm", "+backend.extra.sbatch_args=['--export=NONE']", WEBHOOK], "Drop --export or include ALL"),
])
def test_a_bad_backend_setting_exits_4_with_the_fix(capsys, extra, expected):
    code = eval_command.main([RUN_URI, *OVERRIDES, "backend.dry_run=true", *extra])
    err = capsys.readouterr().err
    assert code == 4, err
    assert expected in err and WEBHOOK_SECRET not in err


def test_a_preemption_signal_during_the_evaluation_exits_75_for_the_backend_to_requeue(monkeypatch, tmp_path):
    from orchestrator.evaluation import billing

    charged = []
    monkeypatch.setattr(billing.EvalBill, "_record", lambda self, spent, evaluated, status: charged.append(status))

    def preempted(*_args, **_kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal did not interrupt the evaluation")

    monkeypatch.setattr(job, "evaluate_run", preempted)
    assert eval_command.main([str(tmp_path / "runs" / "exp1"), "eval.tasks=[tiny_arith_mc]"]) == 75
    assert charged[-1] == "preempted"
    assert signal.getsignal(signal.SIGTERM) is not job._raise_preempted  # the handler is put back


def test_the_eval_job_passes_the_storage_group_as_overrides_its_command_opens_the_store_from(capsys):
    """Issue 42.5: the renders passed only ``--endpoint-url``; the remote command ignored region, profile, checksum
    and retry overrides. Every storage setting now travels as an override, and ``--endpoint-url`` (anywhere on the
    command line) as ``storage.endpoint_url``."""
    code = eval_command.main([RUN_URI, "--endpoint-url", "http://minio:9000", "eval.tasks=[tiny_arith_mc]",
                              "storage.region=eu-west-1", "storage.retry_for=10m", "backend=slurm",
                              "backend.dry_run=true", "backend.partition=spot"])
    out = capsys.readouterr()
    assert code == 0, out.err
    argv = _slurm_eval_argv(out.out)
    assert argv[1:5] == EVAL_ARGV and "--endpoint-url" not in argv
    assert {"storage.region=eu-west-1", "storage.retry_for=10m", "storage.endpoint_url=http://minio:9000"} <= set(argv)
    # and the remote command composes them into the store it opens
    from orchestrator.cli.evaluate import parse_args

    args = parse_args(argv[4:])
    assert args.run_uri == RUN_URI and "storage.region=eu-west-1" in args.overrides
