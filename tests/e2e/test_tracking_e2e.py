"""Cost, budget and MLflow end to end: real jobs (``python -m orchestrator.launch``) against a real
``mlflow server`` and S3 (moto) storage.

1. A job interrupted three times has one MLflow run, tagged attempts=4, whose final cost_usd is the
   ledger's, with no metric point logged twice.
2. A budget reached mid-run sends each alert once, stops with a committed checkpoint and exit 3, is
   not requeued, and a re-launch refuses to start.
3. Secrets planted in the config (a webhook path, a ?token= URL, secrets in lists) appear nowhere in MLflow,
   the job's log, its storage, or what the remote backends would submit.
4. The MLflow server stopped mid-run loses no metric point.
"""
from __future__ import annotations

import base64
import collections
import json
import random
import re
import signal
import time
import uuid
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.helpers import jobs
from tests.helpers.webhooks import WebhookReceiver

# 40 characters of [A-Za-z0-9/+] with upper, lower and digits: the shape of an AWS secret access key.
FAKE_SECRET = "Zx9fQ2rT7vLm3nB8kW4pY6sD1hJ5gC0aE2uI7oK3"
URL_PASSWORD = "hunter2pass"
SLACK_PATH_SECRET = "XoxbSLACKPATH0123456789"
QUERY_TOKEN = "QRYTOKEN0123456789"
LIST_SECRET = "LISTSECRET0123456789"
ARG_SECRET = "ARGSECRET0123456789"


@pytest.fixture
def receiver():
    r = WebhookReceiver()
    yield r
    r.close()


@pytest.fixture
def storage(s3_server, s3_bucket) -> jobs.Storage:
    return jobs.Storage(s3_bucket, s3_server.endpoint_url)


@pytest.fixture
def experiment() -> str:
    return f"e2e-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def client(mlflow_server) -> MlflowClient:
    return MlflowClient(tracking_uri=mlflow_server.uri)


def _overrides(storage: jobs.Storage, mlflow_server, experiment: str, run: str) -> list[str]:
    fast = [o for o in jobs.FAST if not o.startswith("tracking.")]
    return fast + storage.overrides() + [
        f"run.name={run}", "tracking.enabled=true", f"tracking.uri={mlflow_server.uri}",
        f"tracking.experiment={experiment}",
    ]


def _env(tmp_path: Path, **extra: str) -> dict:
    env = jobs.job_env(tmp_path, extra)
    env.pop("MLFLOW_TRACKING_URI", None)  # tracking.uri must be the one used
    return env


def _the_run(client: MlflowClient, experiment: str, job: str):
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.job = '{job}'")
    assert len(runs) == 1, f"expected exactly one MLflow run for job {job!r}, found {len(runs)}"
    return runs[0]


def _histories(client: MlflowClient, run) -> dict[str, list]:
    return {key: client.get_metric_history(run.info.run_id, key) for key in run.data.metrics}


def _assert_no_duplicate_points(histories: dict[str, list]) -> None:
    duplicated = {key: sorted(s for s, n in collections.Counter(m.step for m in points).items() if n > 1)
                  for key, points in histories.items()}
    duplicated = {k: v for k, v in duplicated.items() if v}
    assert not duplicated, f"metrics logged twice at the same step: {duplicated}"


def _last_point(points: list):
    return max(points, key=lambda m: (m.step, m.timestamp))


def _download_artifacts(client: MlflowClient, run_id: str, dest: Path) -> list[Path]:
    local = Path(client.download_artifacts(run_id, "", str(dest)))
    return [p for p in local.rglob("*") if p.is_file()]


@pytest.mark.e2e
@pytest.mark.mlflow
def test_interrupted_three_times_one_run_cost_matches_ledger_no_duplicate_points(
        storage, mlflow_server, client, experiment, tmp_path):
    run = "chaos"
    # 60 steps: enough that the third interruption (a random pause after the third fresh commit) lands mid-run
    overrides = jobs.with_overrides(_overrides(storage, mlflow_server, experiment, run), "train.max_steps=60") + [
        "tracking.log_system_metrics=true"]
    rc, log, _ = jobs.interrupt_then_finish(
        overrides, tmp_path, storage, run, random.Random("tracking-e2e"), [signal.SIGKILL, signal.SIGTERM, signal.SIGKILL],
        env=_env(tmp_path, MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL="1"))
    assert rc == 0, log[-4000:]
    ledger = jobs.ledger(storage, run)
    assert [a["exit_class"] for a in ledger["attempts"]] == ["vanished", "preempted", "vanished", "completed"]

    mlrun = _the_run(client, experiment, run)
    assert mlrun.data.tags["attempts"] == "4"
    assert mlrun.data.tags["status"] == "completed"
    # each attempt logs the training data; the run has it once
    assert [d.dataset.name for d in mlrun.inputs.dataset_inputs] == ["synthetic-arithmetic"]
    histories = _histories(client, mlrun)
    _assert_no_duplicate_points(histories)
    final_cost = _last_point(histories["cost_usd"]).value
    assert final_cost == pytest.approx(ledger["cost_usd"], rel=0.01), (final_cost, ledger["cost_usd"])
    assert _last_point(histories["ops/attempts"]).value == 4
    assert _last_point(histories["ops/preemptions"]).value == 3
    for key in ("cost/gpu_hours", "cost/usd_per_step", "cost/usd_per_million_tokens", "ops/tokens_per_second",
                "cost/lost_work_seconds", "cost/lost_work_usd", "ops/attempt_checkpoint_stall_s", "eval_accuracy",
                "loss", "score"):
        assert key in histories, f"metric {key!r} was not logged; logged: {sorted(histories)}"
    assert "cost/spot_savings_usd" not in histories  # compute=cpu is on-demand: no spot savings to show
    assert any(k.startswith("system/") for k in histories), "tracking.log_system_metrics=true logged no system/ metric"
    # every attempt measured its restart overhead, split by phase, into its ledger entry and the run
    restarts = [a["extra"].get("restart") or {} for a in ledger["attempts"]]
    assert all(r.get("total_s", 0) > 0 and "restore_s" in r and "model_load_s" in r for r in restarts), restarts
    assert len(histories["ops/restart_total_s"]) == 4, histories["ops/restart_total_s"]
    assert {f"ops/restart_{k}" for k in restarts[-1]} <= set(histories)

    files = {p.name: p for p in _download_artifacts(client, mlrun.info.run_id, tmp_path / "artifacts")}
    report = json.loads(files["cost_report.json"].read_text())
    assert [a["exit_class"] for a in report["attempts"]] == ["vanished", "preempted", "vanished", "completed"]
    assert report["totals"]["cost_usd"] == pytest.approx(ledger["cost_usd"], rel=1e-9)
    assert "lost work" in files["cost_report.txt"].read_text()
    assert f"name: {run}" in files["config.yaml"].read_text()


@pytest.mark.e2e
@pytest.mark.mlflow
def test_budget_alerts_once_each_stops_with_a_checkpoint_and_refuses_a_relaunch(
        storage, mlflow_server, client, experiment, receiver, tmp_path):
    run = "capped"
    # $1 at $90/h is 40 s of the attempt (set-up included): reached mid-run, long before 2000 steps.
    overrides = _overrides(storage, mlflow_server, experiment, run) + [
        "train.max_steps=2000", "checkpoint.every=off", "budget.max_usd=1.0", "compute.price_per_hour=90",
        f"budget.webhook_url={receiver.url}",
    ]
    env = _env(tmp_path)
    done = jobs.run_job(overrides, tmp_path, env=env, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 3, out[-4000:]
    assert "will not be requeued" in out

    ledger = jobs.ledger(storage, run)
    assert ledger["status"] == "budget_exhausted"
    assert [a["exit_class"] for a in ledger["attempts"]] == ["budget_exhausted"]
    stopped_at = ledger["attempts"][0]["step_end"]
    assert 0 < stopped_at < 2000
    assert jobs.committed_steps(storage, run) == [stopped_at], "no checkpoint committed at the budget stop"

    names = receiver.alert_names()
    assert names["budget_50"] == names["budget_80"] == names["budget_100"] == 1, names
    assert names["budget_projection"] <= 1, names
    assert set(names) <= {"budget_50", "budget_80", "budget_100", "budget_projection"}, names
    mlrun = _the_run(client, experiment, run)
    assert mlrun.data.tags["status"] == "budget_exhausted"
    assert "alert.budget_100" in mlrun.data.tags

    again = jobs.run_job(overrides, tmp_path, env=env, timeout=300)
    assert again.returncode == 3, (again.stdout + again.stderr)[-4000:]
    assert "budget spent" in again.stderr and "budget.max_usd" in again.stderr, again.stderr[-2000:]
    assert len(jobs.ledger(storage, run)["attempts"]) == 1
    assert receiver.alert_names() == names, "the refused re-launch sent alerts"


@pytest.mark.e2e
@pytest.mark.mlflow
@pytest.mark.slurm
def test_planted_secrets_appear_nowhere_in_mlflow_or_the_log(storage, mlflow_server, client, experiment, receiver,
                                                             tmp_path):
    """Secrets in the shapes that leaked: a Slack-style webhook path, a ?token= URL, a secret in a list."""
    run = "secrets"
    # a Slack-style webhook: the secret is the path (and here a password in the URL too)
    hook = f"http://alice:{URL_PASSWORD}@127.0.0.1:{receiver.port}/services/T0AAAA/B0BBBB/{SLACK_PATH_SECRET}"
    planted = [
        "+run.notes.aws_secret_access_key=${oc.env:FAKE_SECRET}",
        f"+run.notes.source_url='https://data.example/train.jsonl?v=2&token={QUERY_TOKEN}'",
        f"+run.notes.auth_headers=['Bearer {LIST_SECRET}']",
        f"+run.notes.launcher_args=['--hf_token={ARG_SECRET}','--max_new_tokens=8']",
        f"budget.webhook_url={hook}",
    ]
    overrides = _overrides(storage, mlflow_server, experiment, run) + planted + [
        "train.max_steps=10",
        # a budget far away, with a tiny first threshold, so the webhook (and its secrets) is used: $0.001, which
        # $1000/h spends in 3.6 ms, before the first step however fast the job (at $1/h it took 3.6 s of attempt,
        # and the 10 steps took about 3.2 s here: the alert came only when the machine was slower)
        "budget.max_usd=1000", "compute.price_per_hour=1000", "budget.alert_thresholds=[0.000001]",
    ]
    env = _env(tmp_path, FAKE_SECRET=FAKE_SECRET)
    done = jobs.run_job(overrides, tmp_path, env=env, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    # the secrets were live: the webhook got the password at the secret path, the config the key
    assert receiver.bodies, "the budget alert did not reach the webhook"
    assert base64.b64encode(f"alice:{URL_PASSWORD}".encode()).decode() in receiver.auth_headers[0]
    assert receiver.paths[0] == f"/services/T0AAAA/B0BBBB/{SLACK_PATH_SECRET}"

    mlrun = _the_run(client, experiment, run)
    assert mlrun.data.params["run.notes.aws_secret_access_key"] == "***"
    assert mlrun.data.params["budget.webhook_url"] == f"http://***@127.0.0.1:{receiver.port}/***"
    assert mlrun.data.params["run.notes.source_url"] == "https://data.example/train.jsonl?v=2&token=***"
    places = {f"param {k}": v for k, v in mlrun.data.params.items()}
    places.update({f"tag {k}": v for k, v in mlrun.data.tags.items()})
    files = _download_artifacts(client, mlrun.info.run_id, tmp_path / "artifacts")
    assert {"config.yaml", "cost_report.json", "cost_report.txt"} <= {p.name for p in files}
    assert not any("final_weights" in p.parts for p in files), "tracking.log_final_weights is off by default"
    places.update({f"artifact {p.name}": p.read_text(errors="replace") for p in files})
    places["job stdout/stderr"] = log
    # storage: the ledger, final/config.yaml, manifests, checkpoints: every object of the job
    store = storage.store()
    keys = store.list(f"{run}/")
    assert f"{run}/ledger.json" in keys and f"{run}/final/config.yaml" in keys
    places.update({f"storage {k}": store.get_bytes(k).decode(errors="replace") for k in keys})

    # what the remote backends would submit, printed by their dry runs
    for backend, extra, code in (("slurm", [], 0), ("skypilot", [], 0),
                                 ("kubernetes", ["backend.image=registry.example/orch:1"], 4)):
        dry = jobs.run_job(overrides + [f"backend={backend}", "backend.dry_run=true", *extra], tmp_path, env=env,
                           timeout=300)
        assert dry.returncode == code, (backend, (dry.stdout + dry.stderr)[-3000:])
        places[f"{backend} dry run"] = dry.stdout + dry.stderr
    assert "orchestrator.worker" in places["slurm dry run"] and "ORCH_SECRET_BUDGET_WEBHOOK_URL" in places["slurm dry run"]
    assert "secrets:" in places["skypilot dry run"]
    assert "kubectl create secret generic" in places["kubernetes dry run"]  # a literal secret is refused, with the fix

    for secret in (FAKE_SECRET, URL_PASSWORD, SLACK_PATH_SECRET, QUERY_TOKEN, LIST_SECRET, ARG_SECRET):
        leaks = [where for where, text in places.items() if secret in text]
        assert not leaks, f"secret {secret[:4]}... leaked into: {leaks}"


@pytest.mark.e2e
@pytest.mark.mlflow
def test_mlflow_server_down_mid_run_loses_no_point(storage, mlflow_server, client, experiment, tmp_path):
    run = "outage"
    max_steps, every = 60, 5
    overrides = _overrides(storage, mlflow_server, experiment, run) + [
        f"train.max_steps={max_steps}", f"train.logging_steps={every}", "tracking.job_metrics_every=2s"]
    proc = jobs.start_job(overrides, tmp_path, env=_env(tmp_path))
    try:
        jobs.wait_for_new_checkpoint(storage, run, proc, 0)
        mlflow_server.stop()
        time.sleep(5)
    finally:
        mlflow_server.start()
    try:
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = jobs.log_text(tmp_path)
    assert rc == 0, log[-4000:]
    assert "MLflow unreachable" in log, "the job never noticed the outage; the test proved nothing"

    mlrun = _the_run(client, experiment, run)
    histories = _histories(client, mlrun)
    _assert_no_duplicate_points(histories)
    assert sorted(m.step for m in histories["loss"]) == list(range(every, max_steps + 1, every))
    assert _last_point(histories["cost_usd"]).step == max_steps
    # the orchestrator's own metrics: at the first log, then at most every tracking.job_metrics_every
    # (2 s), then the closing total; the Trainer's loss above has a point at every logging step
    cost = sorted(histories["cost_usd"], key=lambda m: m.step)
    assert cost[0].step == 0, [m.step for m in cost]  # the first log: the "before" evaluation, at step 0
    assert 2 <= len(cost) < len(histories["loss"]), [m.step for m in cost]
    gaps_ms = [b.timestamp - a.timestamp for a, b in zip(cost[:-2], cost[1:-1])]
    assert all(gap >= 1900 for gap in gaps_ms), (gaps_ms, [m.step for m in cost])
    assert _last_point(histories["cost_usd"]).value == pytest.approx(jobs.ledger(storage, run)["cost_usd"], rel=0.01)
    _assert_progress_lines(log, max_steps=max_steps, every_s=2.0, final_cost_usd=jobs.ledger(storage, run)["cost_usd"])


_PROGRESS = re.compile(r"^\S+ (\d\d):(\d\d):(\d\d),(\d+) INFO orchestrator\.tracking\.progress: progress: step (\d+)/(\d+) "
                       r"\(\d+%\), (-|[\d.]+) steps/s, ETA (-|[\d:]+), cost so far \$([\d.,]+), projected total "
                       r"(-|\$[\d.,]+)(?:, loss [-\d.e+]+)?$", re.M)


def _assert_progress_lines(log: str, *, max_steps: int, every_s: float, final_cost_usd: float) -> None:
    """The job's log is a file, not a terminal: one progress line at the attempt's first step, then at most
    every tracking.job_metrics_every, with step/total, ETA, cost so far and the projected total; and none of
    the datasets library's per-map bars (TRL's "Tokenizing train dataset" and the like)."""
    lines = _PROGRESS.findall(log)
    assert len(lines) >= 3, [x for x in log.splitlines() if "progress" in x][:10] or log[-3000:]
    seconds = [int(h) * 3600 + int(m) * 60 + int(sec) + int(ms) / 1000 for h, m, sec, ms, *_ in lines]
    steps = [int(x[4]) for x in lines]
    assert steps[0] == 1 and steps == sorted(set(steps)) and {int(x[5]) for x in lines} == {max_steps}, steps
    assert all(b - a >= every_s - 0.1 for a, b in zip(seconds, seconds[1:])), (seconds, steps)
    spent = [float(x[8].replace(",", "")) for x in lines]
    assert spent == sorted(spent) and 0 < spent[-1] <= final_cost_usd, (spent, final_cost_usd)
    later = lines[1:]
    assert all(x[6] != "-" and x[7] != "-" and x[9] != "-" for x in later), later
    # the projected total (from the money watch) lands near what the job cost; the closing evaluation and
    # save come after the last line, so it runs a little under, never far off
    projected = [float(x[9][1:].replace(",", "")) for x in later]
    assert all(0.3 * final_cost_usd <= p <= 3 * final_cost_usd for p in projected), (projected, final_cost_usd)
    assert "Tokenizing train dataset" not in log and "Map:" not in log, "the datasets library's bars were shown"
