"""MLflow for one job: resume its run, log redacted (``orchestrator.core.redaction``), without duplicates, buffer while down.

One job (``run.name``) is one MLflow run across all its attempts. The run id
lives in the ledger; when that write was lost, the run is found again by its
``job`` tag, so a resume never makes a second run.

Metrics go through a background thread that sends batches with
``MlflowClient.log_batch``. If the server is down, points stay buffered and
are retried with backoff until it is back; training never waits on it. After a
resume, points at steps the run already has (per key) are dropped, so a step
replayed from the last checkpoint is not logged twice.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from orchestrator.core.redaction import _URL_USERINFO, redact, scrub_text
from orchestrator.tracking.delivery import MetricsDelivery, is_permanent
from orchestrator.tracking.names import metric_name

log = logging.getLogger(__name__)

JOB_TAG = "job"
KIND_TAG = "orchestrator.kind"
# MLflow 3's UI opens an experiment without this tag in its GenAI view (traces, judges); this value
# (its "Machine learning" choice) opens the training runs, their metrics and models
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND_TRAINING = "custom_model_development"
# ...but MLflow 3.17's UI takes the view from a global switch (the page's ``workflowType`` query, then the
# browser's last choice, GenAI by default), so the links the job prints ask for the training view
UI_TRAINING_VIEW_QUERY = "workflowType=machine_learning"
MAX_PARAMS_TAGS_PER_BATCH = 100  # MLflow's log_batch limit
MAX_PARAM_VALUE_CHARS = 6000
# MLflow's own HTTP client retries 7 times with a 120 s timeout by default, which can
# hold a call for minutes while the server is down. Our thread retries forever with
# its own backoff, so each HTTP call only needs to fail fast. setdefault: a user's
# explicit environment still wins.
MLFLOW_HTTP_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    # MLflow prints its own "View run ... at" link when a run ends; without the view in it, MLflow 3.17's UI
    # opens it in the GenAI view. The job prints its own link (run_page_url), with the training view.
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
# A training job does not phone home: TRL reports every trainer it builds to the Hugging Face
# Hub, and MLflow 3 sends usage data, each from a background thread of the job's process. Both
# read these when first imported; a user's own setting wins (false / 0 opts in).
NO_TELEMETRY_ENV = {"HF_HUB_DISABLE_TELEMETRY": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}


def quiet_telemetry() -> None:
    """Turn the libraries' usage telemetry off unless the user chose; call before they are imported."""
    for name, value in NO_TELEMETRY_ENV.items():
        os.environ.setdefault(name, value)


def flatten(obj: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"a.b": "1", "c": "[1, 2]"}``: MLflow params are flat strings."""
    flat: dict[str, str] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(list(value), default=str)
        else:
            flat[name] = "None" if value is None else str(value)
    return flat


def resolve_tracking_uri(tracking_cfg: Any) -> str:
    """``tracking.uri`` when the config sets one, else ``$MLFLOW_TRACKING_URI``, else SQLite under ``./.cache/mlflow``.

    An explicit key wins over the environment: a variable left set in a shell
    must not send a job's run to another server than the one its config names.
    """
    uri = tracking_cfg.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    folder = Path.cwd() / ".cache" / "mlflow"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


def ensure_experiment(client, name: str, uri: str) -> str:
    """The experiment ``name``'s id (created when missing, in MLflow's model-training view; artifacts beside a
    local SQLite store)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if EXPERIMENT_KIND_TAG not in (experiment.tags or {}):  # made before this tag was set; a user's choice stays
            client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND_TRAINING)
        return experiment.experiment_id
    artifact_location = None
    if uri.startswith("sqlite:///"):
        # A local SQLite store would otherwise put artifacts in ./mlruns of whatever
        # the working dir is; keep them beside the database.
        artifact_location = (Path(uri[len("sqlite:///") :]).parent / "artifacts").as_uri()
    try:
        return client.create_experiment(
            name, artifact_location=artifact_location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND_TRAINING}
        )
    except Exception:
        # Another attempt created it between our lookup and create.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


_experiment_id = ensure_experiment  # the name orchestrator.sweep.tracking imports


def _find_or_create_run(client, experiment_id: str, job_name: str, run_id: Optional[str], uri: str):
    """The job's run: ``run_id`` from the ledger if it is live, else the run tagged with the job, else a new one.
    Returns (run, resumed)."""
    from mlflow.exceptions import MlflowException

    if run_id:
        try:
            run = client.get_run(run_id)
            if run.info.lifecycle_stage == "active":
                return run, True
            log.warning("MLflow run %s from the ledger was deleted; looking for the job's run by tag", run_id)
        except MlflowException as err:
            if not is_permanent(err):
                raise
            log.warning(
                "MLflow run %s from the ledger is not in %s; looking for the job's run by tag", run_id, scrub_text(uri)
            )
    quoted = job_name.replace("\\", "\\\\").replace("'", "\\'")
    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.{JOB_TAG} = '{quoted}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if found:
        return found[0], True
    tags = {JOB_TAG: job_name, KIND_TAG: "job"}
    return client.create_run(experiment_id, tags=tags, run_name=job_name), False


def _last_steps(client, run) -> dict[str, int]:
    """The last logged step of each metric key, so replayed steps are not logged twice."""
    # run.data keeps, per key, the point at the largest step: one call, no history scan.
    metric_objs = getattr(run.data, "_metric_objs", None)
    if metric_objs is not None:
        return {m.key: int(m.step) for m in metric_objs}
    return {key: max(int(m.step) for m in client.get_metric_history(run.info.run_id, key)) for key in run.data.metrics}


def run_page_url(uri: Optional[str], experiment_id: Optional[str], run_id: Optional[str]) -> Optional[str]:
    """A run's page in the MLflow UI, in its model-training view; None for a store without a UI (SQLite)."""
    if not (run_id and experiment_id and uri and uri.startswith(("http://", "https://"))):
        return None
    base = scrub_text(_URL_USERINFO.sub(r"\g<scheme>", uri.rstrip("/")))  # no credentials in a printed link
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{UI_TRAINING_VIEW_QUERY}"


class TrackingUnavailable(RuntimeError):
    """The tracking server could not be reached when the run had to be opened."""


# ---------------------------------------------------------------- the tracker


class JobTracker:
    """The MLflow run of one job, shared by all its attempts.

    Args:
        tracking_cfg: ``orchestrator.config.schema.TrackingConfig``; ``enabled=False`` makes every method a no-op.
        job_name: ``run.name``; tagged ``job=<job_name>`` and used as the run name.
        tags, params: set on the run, redacted (params: the resolved config, nested or flat, flattened).
        run_id: the run recorded in the ledger, if any.
        system_metrics: MLflow's system metrics on or off; None: ``tracking_cfg.log_system_metrics`` (unset: off).
    """

    def __init__(
        self,
        tracking_cfg: Any,
        *,
        job_name: str,
        tags: Optional[dict] = None,
        params: Optional[dict] = None,
        run_id: Optional[str] = None,
        system_metrics: Optional[bool] = None,
    ):
        self.cfg = tracking_cfg
        self.enabled = bool(tracking_cfg.enabled)
        self.job_name = job_name
        self.run_id = run_id
        self._secrets: set[str] = set()
        self._tags = {k: str(v) for k, v in redact(dict(tags or {}), self._secrets).items()}
        self._params = flatten(redact(dict(params or {}), self._secrets))
        self.uri: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self.client: Any = None  # an MlflowClient once the run is open (never used before)
        self._last_step: dict[str, int] = {}
        self._delivery: Optional[MetricsDelivery] = None  # started with the run
        self._system_monitor: Any = None  # MLflow's SystemMetricsMonitor while it samples
        self.system_metrics = bool(tracking_cfg.log_system_metrics if system_metrics is None else system_metrics)

    # -- opening the run ---------------------------------------------------

    def start(self) -> Optional[str]:
        """Open the job's run (resume ``run_id``, else the run tagged with the job, else a new one).

        Returns the run id (None when tracking is disabled). Raises
        TrackingUnavailable when the server cannot be reached.
        """
        if not self.enabled:
            return None
        for name, value in MLFLOW_HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
        quiet_telemetry()  # before mlflow is imported: it decides then
        from mlflow import MlflowClient

        self.uri = resolve_tracking_uri(self.cfg)
        self.client = MlflowClient(tracking_uri=self.uri)
        try:
            experiment_id = ensure_experiment(self.client, self.cfg.experiment, self.uri)
            self.experiment_id = experiment_id
            run, resumed = _find_or_create_run(self.client, experiment_id, self.job_name, self.run_id, self.uri)
            self.run_id = run.info.run_id
            if resumed:
                self.client.update_run(self.run_id, status="RUNNING")
                self._last_step = _last_steps(self.client, run)
            self._log_params_and_tags(run if resumed else None)
        except Exception as err:
            if is_permanent(err):
                raise
            raise TrackingUnavailable(
                f"MLflow at {scrub_text(self.uri)} could not be reached ({type(err).__name__}: "
                f"{scrub_text(str(err))[:300]}). Start the server, fix tracking.uri / MLFLOW_TRACKING_URI, "
                "or set tracking.enabled=false."
            ) from err
        log.info(
            "MLflow run %s (%s) for job %r at %s",
            self.run_id,
            "resumed" if resumed else "new",
            self.job_name,
            scrub_text(self.uri),
        )
        if self.run_url():
            log.info("MLflow run page: %s", self.run_url())
        self._delivery = MetricsDelivery(self._send)
        if self.system_metrics:
            self._start_system_metrics(resumed)
        return self.run_id

    def run_url(self) -> Optional[str]:
        """The run's page in the MLflow UI (``run_page_url``), once the run is open."""
        return run_page_url(self.uri, self.experiment_id, self.run_id)

    def _log_params_and_tags(self, existing_run) -> None:
        from mlflow.entities import Param, RunTag

        params = {k: v[:MAX_PARAM_VALUE_CHARS] for k, v in self._params.items()}
        if existing_run is not None:
            # MLflow params are immutable: log only keys the run lacks; a changed value
            # (allowed by checkpoint.allow_config_change) is reported, not fatal.
            old = existing_run.data.params
            changed = sorted(k for k, v in params.items() if k in old and old[k] != v)
            if changed:
                log.warning(
                    "config changed since the run was created (MLflow keeps the first value): %s", ", ".join(changed)
                )
            params = {k: v for k, v in params.items() if k not in old}
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + MAX_PARAMS_TAGS_PER_BATCH], synchronous=True)
        tags = [RunTag(k, v) for k, v in {**self._tags, JOB_TAG: self.job_name}.items()]
        for i in range(0, len(tags), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, tags=tags[i : i + MAX_PARAMS_TAGS_PER_BATCH], synchronous=True)

    def _start_system_metrics(self, resumed: bool) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import (
                SystemMetricsMonitor,
            )

            from orchestrator.core.durations import parse_duration

            # each sample is a log_batch plus a get_run (MLflow checks whether the run ended) on the
            # server: MLflow's own 10 s default costs a busy server more than the sampling is worth
            every = parse_duration(self.cfg.system_metrics_every, key="tracking.system_metrics_every")
            self._system_monitor = SystemMetricsMonitor(
                self.run_id, resume_logging=resumed, tracking_uri=self.uri, sampling_interval=every if every > 0 else 10
            )
            self._system_monitor.start()
        except Exception as err:  # psutil/pynvml missing: tracking goes on without them
            log.warning("MLflow system metrics are off: %s", err)
            self._system_monitor = None

    # -- logging (never blocks, never raises) ---------------------------------

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Queue numeric ``metrics`` at ``step``, named for MLflow's sections (``names.metric_name``); steps at or
        below a key's last logged step are dropped."""
        if not self.enabled or self._delivery is None:  # not started
            return
        from mlflow.entities import Metric

        # The timestamp is fixed now, so a resend after a lost reply is the
        # identical row, which MLflow's store de-duplicates.
        timestamp_ms = int(time.time() * 1000)
        points = []
        for key, value in metrics.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue  # strings and None are not metrics
            key = metric_name(key)
            if step <= self._last_step.get(key, -math.inf):
                continue
            points.append(Metric(key, number, timestamp_ms, int(step)))
            self._last_step[key] = int(step)
        self._delivery.add_points(points)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if not self.enabled or self._delivery is None:  # not started
            return
        from mlflow.entities import RunTag

        clean = redact(dict(tags), self._secrets)
        self._delivery.add_op(("tags", [RunTag(k, str(v)) for k, v in clean.items()]))

    def log_dataset_input(self, dataset_input: Any) -> None:
        """Queue an ``mlflow.entities.DatasetInput`` (the run's training data); MLflow keeps one per name and digest."""
        if self.enabled and self._delivery is not None:
            self._delivery.add_op(("inputs", [dataset_input]))

    def log_text_artifact(self, text: str, artifact_file: str) -> None:
        """Queue ``text`` as an artifact, with every secret seen in params/tags scrubbed out."""
        if self.enabled and self._delivery is not None:
            self._delivery.add_op(("text", scrub_text(text, self._secrets), artifact_file))

    def log_dict_artifact(self, obj: Mapping[str, Any], artifact_file: str) -> None:
        if self.enabled and self._delivery is not None:
            self._delivery.add_op(("dict", redact(obj, self._secrets), artifact_file))

    def log_file_artifact(self, data: bytes, artifact_file: str) -> None:
        """Queue ``data`` (a chart's PNG) as the artifact ``artifact_file``, replacing one of that name."""
        if self.enabled and self._delivery is not None:
            self._delivery.add_op(("file", bytes(data), artifact_file))

    def log_table_artifact(self, table: Mapping[str, list], artifact_file: str) -> None:
        """Queue ``{column: values}`` as the table artifact ``artifact_file`` (``log_table``), redacted."""
        if self.enabled and self._delivery is not None:
            self._delivery.add_op(("table", redact(dict(table), self._secrets), artifact_file))

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Retry now and wait up to ``timeout_s`` for everything queued to be delivered."""
        if not self.enabled or self._delivery is None:
            return True
        return self._delivery.flush(timeout_s)

    def close(self, status: str = "FINISHED", *, flush_timeout_s: float = 60.0) -> bool:
        """Deliver what is queued (up to ``flush_timeout_s``), end the run with ``status``
        (FINISHED | KILLED | FAILED). Returns False if points were left undelivered."""
        if not self.enabled or self._delivery is None:  # not started
            return True
        if self._system_monitor is not None:
            try:
                self._system_monitor.finish()
            except Exception as err:
                log.warning("stopping MLflow system metrics failed: %s", err)
        delivered = self._delivery.flush(flush_timeout_s)
        left = self._delivery.stop()
        if not delivered:
            log.warning("MLflow unreachable: %d metric points/operations were not delivered before close", left)
        try:
            self.client.set_terminated(self.run_id, status=status)
        except Exception as err:
            log.warning("could not mark MLflow run %s %s: %s", self.run_id, status, err)
        return delivered

    def _send(self, batch: list, op: Optional[tuple]) -> None:
        send(self.client, str(self.run_id), batch, op)  # delivery starts with the run: it has its id


def send(client: Any, run_id: str, batch: list, op: Optional[tuple]) -> None:
    """Deliver a batch of metric points, or (``batch`` empty) one queued operation, to the run."""
    if batch:
        client.log_batch(run_id, metrics=batch, synchronous=True)
        return
    if op is None:  # nothing queued: nothing to deliver
        return
    if op[0] == "tags":
        client.log_batch(run_id, tags=op[1], synchronous=True)
    elif op[0] == "text":
        client.log_text(run_id, op[1], op[2])
    elif op[0] == "dict":
        client.log_dict(run_id, op[1], op[2])
    elif op[0] == "file":
        _log_file(client, run_id, op[1], op[2])
    elif op[0] == "table":
        log_table(client, run_id, op[1], op[2])
    elif op[0] == "inputs":
        client.log_inputs(run_id, datasets=op[1])


LOGGED_ARTIFACTS_TAG = "mlflow.loggedArtifacts"  # MLflow's list of a run's table artifacts, which its UI draws


def table_json(table: Mapping[str, list]) -> bytes:
    """``{column: values}`` as the JSON ``MlflowClient.log_table`` writes (pandas' ``split`` orient)."""
    columns = list(table)
    rows = [list(row) for row in zip(*(table[c] for c in columns))]
    return json.dumps({"columns": columns, "data": rows}, default=str).encode()


def log_table(client, run_id: str, table: Mapping[str, list], artifact_file: str) -> None:
    """``table`` as the run's table artifact ``artifact_file`` (a ``.json``), replacing one of that name:
    ``MlflowClient.log_table`` would append its rows to it, so a table logged again would repeat them."""
    _log_file(client, run_id, table_json(table), artifact_file)
    listed = json.loads(client.get_run(run_id).data.tags.get(LOGGED_ARTIFACTS_TAG, "[]"))
    entry = {"path": artifact_file, "type": "table"}
    if entry not in listed:
        client.set_tag(run_id, LOGGED_ARTIFACTS_TAG, json.dumps(listed + [entry]))


def _log_file(client, run_id: str, data: bytes, artifact_file: str) -> None:
    import tempfile

    folder, name = os.path.split(artifact_file)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        client.log_artifact(run_id, str(path), folder or None)
