"""MLflow tracking against a real `mlflow server`: one run per job, no duplicate points, nothing lost
while the server is down, no secret in params, tags or artifacts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from mlflow import MlflowClient

from orchestrator.config.schema import TrackingConfig
from orchestrator.tracking.run import JobTracker
from orchestrator.core.redaction import redact, scrub_text
from tests.helpers.net import free_port
from tests.helpers.paths import REPO

FAKE_AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
URL_PASSWORD = "hunter2Pass"
HF_TOKEN = "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345"


@pytest.fixture
def cfg(mlflow_server, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return TrackingConfig(uri=mlflow_server.uri, experiment=f"test-{uuid.uuid4().hex[:8]}")


def _history(client, run_id, key):
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def _runs_of_job(client, cfg, job):
    experiment = client.get_experiment_by_name(cfg.experiment)
    return client.search_runs([experiment.experiment_id], filter_string=f"tags.job = '{job}'")


@pytest.mark.e2e
@pytest.mark.mlflow
@pytest.mark.mlflow
def test_all_attempts_of_a_job_share_one_run(cfg, mlflow_server):
    first = JobTracker(cfg, job_name="exp1", tags={"recipe": "sft"}, params={"train": {"max_steps": 20}})
    run_id = first.start()
    first.log_metrics({"loss": 1.0}, step=1)
    assert first.close("KILLED")

    by_ledger = JobTracker(cfg, job_name="exp1", params={"train": {"max_steps": 20}}, run_id=run_id)
    assert by_ledger.start() == run_id
    by_ledger.log_metrics({"loss": 0.9}, step=2)
    assert by_ledger.close("KILLED")

    # The ledger write of the run id was lost: the run is found by its job tag.
    by_tag = JobTracker(cfg, job_name="exp1", params={"train": {"max_steps": 20}}, run_id=None)
    assert by_tag.start() == run_id
    by_tag.log_metrics({"loss": 0.8}, step=3)
    assert by_tag.close("FINISHED")

    client = MlflowClient(mlflow_server.uri)
    runs = _runs_of_job(client, cfg, "exp1")
    assert [r.info.run_id for r in runs] == [run_id]
    assert runs[0].info.status == "FINISHED"
    assert _history(client, run_id, "loss") == [1, 2, 3]


@pytest.mark.e2e
@pytest.mark.mlflow
@pytest.mark.mlflow
def test_system_metrics_are_sampled_every_system_metrics_every(cfg, mlflow_server, monkeypatch):
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", raising=False)
    cfg.log_system_metrics, cfg.system_metrics_every = True, "1s"
    tracker = JobTracker(cfg, job_name="sysmetrics", params={})
    run_id = tracker.start()
    time.sleep(4.5)
    assert tracker.close("FINISHED")
    points = MlflowClient(mlflow_server.uri).get_metric_history(run_id, "system/cpu_utilization_percentage")
    # MLflow's own default (10 s) would have logged none in 4.5 s
    assert len(points) >= 2, [(p.step, p.timestamp) for p in points]


@pytest.mark.e2e
@pytest.mark.mlflow
def test_steps_replayed_after_a_resume_are_not_logged_twice(cfg, mlflow_server):
    first = JobTracker(cfg, job_name="exp-replay")
    run_id = first.start()
    for step in range(1, 11):
        first.log_metrics({"loss": 1.0 / step, "lr": 0.001}, step=step)
    first.log_metrics({"loss": 123.0}, step=10)  # the same step again in one lifetime
    assert first.close("KILLED")

    # Preempted at step 10, last checkpoint at 5: steps 6..10 are trained again.
    second = JobTracker(cfg, job_name="exp-replay")
    assert second.start() == run_id
    for step in range(6, 16):
        second.log_metrics({"loss": 1.0 / step, "lr": 0.001}, step=step)
    assert second.close()

    client = MlflowClient(mlflow_server.uri)
    assert _history(client, run_id, "loss") == list(range(1, 16))
    assert _history(client, run_id, "lr") == list(range(1, 16))
    values = {m.step: m.value for m in client.get_metric_history(run_id, "loss")}
    assert values[10] == pytest.approx(0.1)


@pytest.mark.e2e
@pytest.mark.mlflow
@pytest.mark.mlflow
def test_points_logged_while_the_server_is_down_arrive_once_it_is_back(cfg, mlflow_server):
    tracker = JobTracker(cfg, job_name="exp-outage")
    run_id = tracker.start()
    try:
        for step in range(1, 6):
            tracker.log_metrics({"loss": float(step)}, step=step)
        assert tracker.flush(30)

        mlflow_server.stop()
        began = time.monotonic()
        for step in range(6, 21):
            tracker.log_metrics({"loss": float(step)}, step=step)
        assert time.monotonic() - began < 0.5  # training did not wait for the dead server
        tracker.set_tags({"phase": "during-outage"})
        assert not tracker.flush(2)  # nothing can be delivered yet, and flush says so
    finally:
        mlflow_server.start()
    assert tracker.flush(120)
    assert tracker.close()

    client = MlflowClient(mlflow_server.uri)
    assert _history(client, run_id, "loss") == list(range(1, 21))  # every point, exactly once
    assert client.get_run(run_id).data.tags["phase"] == "during-outage"


@pytest.mark.e2e
@pytest.mark.mlflow
def test_planted_secrets_appear_nowhere_in_mlflow(cfg, mlflow_server, tmp_path):
    params = {
        "storage": {"uri": "s3://bucket/runs", "endpoint_url": f"https://minio:{URL_PASSWORD}@minio.local:9000"},
        "data": {"notes": f"exported with {FAKE_AWS_SECRET}"},
        "hub": {"hf_token": HF_TOKEN},
        "recipe": {"eval_generate_max_new_tokens": 8},  # a number, not a secret
        "run": {"git_commit": "0123456789abcdef0123456789abcdef01234567"},  # a hex digest, not a secret
    }
    tracker = JobTracker(cfg, job_name="exp-secrets", tags={"mlflow_auth": "Bearer abcdefgh", "recipe": "sft"}, params=params)
    run_id = tracker.start()
    tracker.log_dict_artifact(params, "config.json")
    tracker.log_text_artifact(
        f"download from https://minio:{URL_PASSWORD}@minio.local:9000 token={HF_TOKEN} key={FAKE_AWS_SECRET}\n", "logs/attempt-1.log"
    )
    assert tracker.close()

    client = MlflowClient(mlflow_server.uri)
    run = client.get_run(run_id)
    downloaded = Path(client.download_artifacts(run_id, "", str(tmp_path)))
    # Both artifacts made the trip through the server into S3 and back.
    assert json.loads((downloaded / "config.json").read_text())["storage"]["uri"] == "s3://bucket/runs"
    assert (downloaded / "logs" / "attempt-1.log").read_text() == "download from https://***@minio.local:9000 token=*** key=***\n"
    artifact_text = "".join(p.read_text() for p in downloaded.rglob("*") if p.is_file())
    everything = json.dumps(run.data.params) + json.dumps(run.data.tags) + artifact_text
    for secret in (FAKE_AWS_SECRET, URL_PASSWORD, HF_TOKEN, "Bearer abcdefgh"):
        assert secret not in everything, secret
    assert run.data.params["recipe.eval_generate_max_new_tokens"] == "8"
    assert run.data.params["storage.uri"] == "s3://bucket/runs"
    assert run.data.params["run.git_commit"] == params["run"]["git_commit"]
    assert run.data.params["hub.hf_token"] == "***"
    assert run.data.tags["recipe"] == "sft"


def test_redact_and_scrub_text_units():
    cleaned = redact({"AWS_SECRET_ACCESS_KEY": "x", "apiKey": "y", "password": 5, "use_auth": True, "max_new_tokens": 8, "tokenizer": "gpt2"})
    assert cleaned == {"AWS_SECRET_ACCESS_KEY": "***", "apiKey": "***", "password": "***", "use_auth": True, "max_new_tokens": 8, "tokenizer": "gpt2"}
    assert redact(["postgresql://me:pw@db/x"]) == ["postgresql://***@db/x"]
    assert scrub_text("id AKIAABCDEFGHIJKLMNOP and mysecretvalue", ["mysecretvalue"]) == "id *** and ***"
    assert scrub_text(f"aws_secret_access_key={FAKE_AWS_SECRET}") == "aws_secret_access_key=***"


@pytest.mark.e2e
def test_redact_covers_webhook_paths_token_queries_and_secrets_in_lists():
    slack = "https://hooks.slack.com/services/T0AAAA/B0BBBB/SLACKPATHSECRET42"
    found: set = set()
    cleaned = redact({
        "budget": {"webhook_url": slack, "alert_thresholds": [0.5, 1.0]},
        "data": {"source_url": "https://data.example/x.jsonl?v=2&token=QUERYTOKEN77&X-Amz-Signature=SIGVALUE99"},
        "extra": {"auth_headers": ["Bearer LISTBEARER11", "Bearer LISTBEARER12"],
                  "env": [{"name": "HF_TOKEN", "value": "hf_ENVLISTVALUE"}, {"name": "LOG_LEVEL", "value": "info"}],
                  "launcher_args": ["--hf_token=ARGLISTSECRET", "--max_new_tokens=8"]},
        "tracking": {"uri": "http://mlflow.internal:5000"},
    }, found)
    assert cleaned["budget"]["webhook_url"] == "https://hooks.slack.com/***"
    assert cleaned["budget"]["alert_thresholds"] == [0.5, 1.0]
    assert cleaned["data"]["source_url"] == "https://data.example/x.jsonl?v=2&token=***&X-Amz-Signature=***"
    assert cleaned["extra"]["auth_headers"] == ["***", "***"]
    assert cleaned["extra"]["env"] == [{"name": "HF_TOKEN", "value": "***"}, {"name": "LOG_LEVEL", "value": "info"}]
    assert cleaned["extra"]["launcher_args"] == ["--hf_token=***", "--max_new_tokens=8"]
    assert cleaned["tracking"]["uri"] == "http://mlflow.internal:5000"
    # everything replaced is remembered, so free text (logs, artifacts) is scrubbed of it too
    text = f"posting to {slack}; fetched QUERYTOKEN77 with LISTBEARER11, hf_ENVLISTVALUE and ARGLISTSECRET"
    scrubbed = scrub_text(text, found)
    for secret in ("SLACKPATHSECRET42", "QUERYTOKEN77", "LISTBEARER11", "hf_ENVLISTVALUE", "ARGLISTSECRET"):
        assert secret not in scrubbed, (secret, scrubbed)
    # a webhook URL or a token query found in free text alone, without the config, goes too
    assert scrub_text(f"alert to {slack} failed") == "alert to https://hooks.slack.com/*** failed"
    assert scrub_text("budget.webhook_url=http://127.0.0.1:9/services/A/B/C ok") == "budget.webhook_url=http://127.0.0.1:9/*** ok"
    assert scrub_text("GET https://x.example/a?access_token=ABCDEFGH&page=2") == "GET https://x.example/a?access_token=***&page=2"
    # references to environment variables are not secrets and stay readable
    assert redact({"webhook_url": "${oc.env:SLACK_URL}"}) == {"webhook_url": "${oc.env:SLACK_URL}"}
    assert scrub_text("budget.webhook_url=${oc.env:SLACK_URL}") == "budget.webhook_url=${oc.env:SLACK_URL}"


def test_disabled_tracking_is_a_no_op():
    tracker = JobTracker(TrackingConfig(enabled=False), job_name="x")
    assert tracker.start() is None
    tracker.log_metrics({"loss": 1.0}, step=1)
    assert tracker.flush(1) and tracker.close()


def test_unreachable_server_at_start_fails_fast_with_the_fix(monkeypatch):
    
    from orchestrator.tracking.run import TrackingUnavailable

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    port = free_port()  # a port nobody listens on
    began = time.monotonic()
    with pytest.raises(TrackingUnavailable) as err:
        JobTracker(TrackingConfig(uri=f"http://me:{URL_PASSWORD}@127.0.0.1:{port}"), job_name="x").start()
    assert time.monotonic() - began < 30  # MLflow's default retries would take minutes
    assert "tracking.enabled=false" in str(err.value) and URL_PASSWORD not in str(err.value)


CI_MARKERS = ("PYTEST_CURRENT_TEST", "GITHUB_ACTIONS", "CI", "CIRCLECI", "GITLAB_CI", "JENKINS_URL", "TRAVIS", "TF_BUILD",
              "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN", "BUILDKITE", "TEAMCITY_VERSION", "CLOUD_RUN_EXECUTION",
              "DO_NOT_TRACK", "DISABLE_TELEMETRY", "MLFLOW_DISABLE_TELEMETRY", "HF_HUB_DISABLE_TELEMETRY",
              "HF_HUB_OFFLINE")


def _fresh_python(code: str, cwd: Path, **env_overrides: str) -> str:
    """Run ``code`` in a new interpreter without any telemetry switch or CI marker (MLflow stays quiet by
    itself under pytest or CI, which would make these tests unable to fail); returns its stdout + stderr."""
    env = {k: v for k, v in os.environ.items() if k not in CI_MARKERS}
    env["PYTHONPATH"] = str(REPO)
    env.update(env_overrides)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    return out.stdout + out.stderr


@pytest.mark.e2e
@pytest.mark.mlflow
@pytest.mark.parametrize("user_setting,expect_client", [(None, False), ("false", True)])
def test_a_tracked_job_sends_no_usage_telemetry_unless_the_user_opts_in(mlflow_server, tmp_path, user_setting,
                                                                         expect_client):
    """MLflow 3 phones home from a background thread unless told not to; a job does not, unless the user set
    MLFLOW_DISABLE_TELEMETRY=false. MLflow decides at its first import, so this runs in a fresh process."""
    code = f"""
from orchestrator.config.schema import TrackingConfig
from orchestrator.tracking.run import JobTracker
tracker = JobTracker(TrackingConfig(uri={mlflow_server.uri!r}, experiment="telemetry"), job_name="t")
tracker.start()
from mlflow.telemetry.client import get_telemetry_client
from mlflow.telemetry.utils import is_telemetry_disabled
print("CLIENT", get_telemetry_client() is not None, "DISABLED", is_telemetry_disabled())
tracker.close("FINISHED")
"""
    setting = {} if user_setting is None else {"MLFLOW_DISABLE_TELEMETRY": user_setting}
    out = _fresh_python(code, tmp_path, **setting)
    if expect_client:
        # MLflow's own verdict; its client may already be gone again here (offline, its config fetch
        # fails and it drops the client), so the client's presence is only checked in the default case
        assert "DISABLED False" in out, out[-4000:]
    else:
        assert "CLIENT False DISABLED True" in out, out[-4000:]


FIRST_IMPORT = {  # what imports the training stack first: a fresh worker, or a supervisor that forks its attempts
    "worker": "import orchestrator.worker\n",
    "forking_supervisor": ("from orchestrator.app.compose import compose_config\n"
                           "from orchestrator.process.training_stack import import_stack\n"
                           "import_stack(compose_config([]))\n"),
}


@pytest.mark.e2e
@pytest.mark.parametrize("first", sorted(FIRST_IMPORT))
@pytest.mark.parametrize("user_setting,expect_disabled", [(None, True), ("0", False)])
def test_a_worker_turns_off_the_hub_telemetry_trl_sends_unless_the_user_set_it(tmp_path, user_setting,
                                                                                expect_disabled, first):
    """TRL reports every trainer it builds to the Hugging Face Hub from a background thread; huggingface_hub
    reads HF_HUB_DISABLE_TELEMETRY once, when imported. Importing the worker, or the stack a supervisor imports
    before it forks its attempts, must have turned it off first."""
    code = (FIRST_IMPORT[first] +
            "from huggingface_hub import constants\n"
            "print('DISABLED', constants.HF_HUB_DISABLE_TELEMETRY)\n")
    setting = {} if user_setting is None else {"HF_HUB_DISABLE_TELEMETRY": user_setting}
    out = _fresh_python(code, tmp_path, **setting)
    assert f"DISABLED {expect_disabled}" in out, out[-4000:]


def test_an_explicit_tracking_uri_wins_over_mlflow_tracking_uri_in_the_environment(monkeypatch, tmp_path):
    from orchestrator.tracking.run import resolve_tracking_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://left-in-the-shell:5000")
    assert resolve_tracking_uri(TrackingConfig(uri="http://the-configured-server:5000")) == "http://the-configured-server:5000"
    assert resolve_tracking_uri(TrackingConfig(uri=None)) == "http://left-in-the-shell:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(tmp_path)
    assert resolve_tracking_uri(TrackingConfig(uri=None)) == f"sqlite:///{tmp_path}/.cache/mlflow/mlflow.db"
