"""The attempt's MLflow side: the job's one run (resumed by every attempt), its metrics at the
right rate, and the closing cost report; what the run page shows besides: the training data as a
dataset input, the commit as MLflow's source tags, a description with the cost and quality, and the
final weights as a logged model.

Built for every rank; on other ranks than the main one, and when tracking is
off, there is no MLflow client behind it and every call does nothing.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable, Optional

from orchestrator.records.ledger_record import LedgerRecord
from orchestrator.storage.base import finite_number

log = logging.getLogger(__name__)

# MLflow's own tag names (mlflow.utils.mlflow_tags): the run page shows the note as the run's
# description and the source tags as its source and commit
RUN_NOTE_TAG = "mlflow.note.content"
SOURCE_NAME_TAG = "mlflow.source.name"
SOURCE_TYPE_TAG = "mlflow.source.type"
GIT_COMMIT_TAG = "mlflow.source.git.commit"
DATASET_CONTEXT_TAG = "mlflow.data.context"
VERDICT_TAG = "verdict"  # continue | stop | change, from the job's benchmark scores against its dollars
CHECKPOINTS_TABLE = "checkpoints.json"
SCORES_TABLE = "bench/score_vs_usd.json"  # beside the chart evaluation.watch draws, bench/score_vs_usd.png


def _prior(ledger: Any) -> tuple[int, Optional[str]]:
    """(attempts so far, the MLflow run id) of the job's ledger (``LedgerRecord``, or the stored JSON: decoded here);
    (0, None) for one that does not decode: the attempt's begin, before the run opens, stops on it (exit 4)."""
    from orchestrator.records.fields import CorruptRecord
    from orchestrator.records.ledger_record import LedgerRecord

    try:
        record = ledger if isinstance(ledger, LedgerRecord) else LedgerRecord.decode(ledger, "the job's ledger")
    except CorruptRecord:
        return 0, None
    return len(record.attempts), record.mlflow_run_id


class AttemptTracking:
    """Args:
    tracker: the job's ``orchestrator.tracking.run.JobTracker``, or None (tracking off, or not the main rank).
    job_metrics_every_s: the orchestrator's own metrics go at most this often (0: at every log).
    """

    def __init__(self, tracker: Any = None, *, job_metrics_every_s: float = 0.0):
        self.tracker = tracker
        self.job_metrics_every_s = job_metrics_every_s
        self._last_job_metrics = -math.inf  # the first log carries them

    @property
    def active(self) -> bool:
        return self.tracker is not None

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        tracking_cfg: Any,
        *,
        main: bool,
        run_name: str,
        ledger: Any,
        params: dict,
        quality_metric: str,
        job_metrics_every_s: float,
    ) -> "AttemptTracking":
        """``cfg``: the job's config (the run's tags); ``tracking_cfg``: its ``tracking`` group (a ``TrackingConfig``,
        what the tracker keeps); ``ledger``: the job's ledger before this attempt begins (its MLflow run id, its
        attempts so far; a ``LedgerRecord`` or the stored JSON, decoded here); ``params``: the resolved config (``attempt.resolved``), the run's params once redacted."""
        from orchestrator.tracking.run import JobTracker

        if not (main and tracking_cfg.enabled):
            return cls(None, job_metrics_every_s=job_metrics_every_s)
        attempts, run_id = _prior(ledger)
        tags = {
            "job": run_name,
            "recipe": cfg.recipe.name,
            "model": cfg.model.name_or_path,
            "gpu_type": cfg.compute.gpu_type,
            "spot": str(bool(cfg.compute.spot)),
            "status": "running",
            "attempts": str(attempts + 1),
            "quality_metric": quality_metric,
            **source_tags(),
        }
        if tracking_cfg.parent_run_id:  # a sweep's trial: MLflow's nested runs
            tags["mlflow.parentRunId"] = str(tracking_cfg.parent_run_id)
        system = tracking_cfg.log_system_metrics  # unset: on for a GPU job (its utilisation and memory beside the cost)
        system = bool(cfg.compute.gpus_per_node) if system is None else system
        if system and cfg.compute.gpus_per_node and not _has_module("pynvml"):
            log.warning(
                "MLflow's system metrics sample no GPU without NVIDIA's NVML bindings: pip install nvidia-ml-py"
            )
        tracker = JobTracker(
            tracking_cfg, job_name=run_name, tags=tags, params=params, run_id=run_id, system_metrics=system
        )
        return cls(tracker, job_metrics_every_s=job_metrics_every_s)

    def start(self) -> Optional[str]:
        """Open (or resume) the job's run; None when MLflow is unreachable (metrics are buffered)."""
        if self.tracker is None:
            return None
        from orchestrator.tracking.run import TrackingUnavailable

        try:
            return self.tracker.start()
        except TrackingUnavailable as err:
            log.warning("MLflow unavailable (%s); training goes on and metrics are buffered", err)
            return None

    def set_tag(self, key: str, value: Any) -> None:
        if self.tracker is not None:
            self.tracker.set_tags({key: value})

    def set_tags(self, tags: dict) -> None:
        if self.tracker is not None:
            self.tracker.set_tags(tags)

    def log_metrics(self, metrics: dict, step: int) -> None:
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, step)

    def replay_history(self, checkpoint: Optional[Path]) -> None:
        """After a restore: the Trainer's logs up to the checkpoint (its ``trainer_state.json``, verified with
        it) that MLflow lacks. A SIGKILL loses the points still queued for MLflow, and the next attempt resumes
        past their steps; re-sent in order, points MLflow has are dropped like any replayed step."""
        if self.tracker is None or checkpoint is None:
            return
        try:
            history = json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("log_history")
        except (OSError, ValueError, AttributeError):
            return
        for entry in history if isinstance(history, list) else []:
            step = entry.get("step") if isinstance(entry, dict) else None
            if isinstance(step, int) and not isinstance(step, bool):
                self.tracker.log_metrics({k: v for k, v in entry.items() if k != "step" and finite_number(v)}, step)

    def log_dict(self, obj: dict, artifact_file: str) -> None:
        if self.tracker is not None:
            self.tracker.log_dict_artifact(obj, artifact_file)

    def log_dataset(self, train_dataset: Any, fingerprint: str, data_cfg: Any) -> None:
        """The training data as the run's MLflow dataset input (context ``train``), its digest the job's
        dataset fingerprint (``recipes.data.fingerprint``) cut to MLflow's 36 characters; the whole
        fingerprint goes in the run's ``dataset_fingerprint`` tag."""
        if self.tracker is None:
            return
        try:
            self.tracker.log_dataset_input(dataset_input(train_dataset, fingerprint, data_cfg))
        except Exception as err:  # noqa: BLE001 - a dataset MLflow cannot describe must not stop training
            log.warning("the training data could not be described as an MLflow dataset input: %s", err)
        self.set_tags({"dataset_fingerprint": fingerprint})

    def log_file(self, data: bytes, artifact_file: str) -> None:
        if self.tracker is not None:
            self.tracker.log_file_artifact(data, artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        if self.tracker is not None:
            self.tracker.log_text_artifact(text, artifact_file)

    def on_trainer_log(self, metrics: dict, step: int, *, closing: bool, job_figures: Callable[[bool], dict]) -> None:
        """The Trainer's logs at every logging step; the orchestrator's own figures (``job_figures(closing)``)
        at the first log, then at most every ``job_metrics_every_s``, and at the close.

        At the attempt's closing step ``job_figures`` leaves the cost figures out:
        the end of the attempt logs them once the bill is closed (a metric takes
        one point per step, and the last one must be the final total).
        """
        if self.tracker is None:
            return
        now = time.monotonic()
        if closing or now - self._last_job_metrics >= self.job_metrics_every_s:
            self._last_job_metrics = now
            metrics = dict(metrics, **job_figures(closing))
        self.tracker.log_metrics(metrics, step)

    def log_final_model(self, folder, *, adapter: bool, step: int) -> bool:
        """The final weights (``tracking.log_final_weights``) as the run's logged model ``final-adapter``
        (LoRA) or ``final-model`` (full fine-tune); see ``log_model_dir``."""
        return (
            self.tracker is not None
            and log_model_dir(
                self.tracker,
                folder,
                name="final-adapter" if adapter else "final-model",
                model_type="peft-adapter" if adapter else "transformers",
                step=step,
            )
            is not None
        )

    def close_with_report(
        self,
        *,
        job: str,
        step: int,
        status: str,
        tracker_status: str,
        ledger: LedgerRecord,
        figures: dict,
        money: Any,
        quality_metric: str,
        quality: Optional[float],
        config_yaml: str,
        quality_before: Optional[float] = None,
        quality_is_fraction: bool = True,
        bench_records: Optional[list] = None,
    ) -> None:
        """The attempt's closing figures, the cost report (printed too), the redacted config, the committed
        checkpoints as a table; tag, describe and close the run.

        ``quality_before``: the metric before training; USD per quality point is the cost over the points gained
        since (fraction-valued metrics only: a loss has no percentage points). ``bench_records``: the benchmark
        results so far (``evaluation.watch``), whose verdict (``curve.job_verdict``) the description carries."""
        if self.tracker is None:
            return
        from orchestrator.money.report import (
            build_report,
            format_report,
            quality_gain_points,
            usd_per_quality_point,
        )
        from orchestrator.tracking.names import HEADLINE_SCORE

        if quality_is_fraction:
            gain = quality_gain_points(quality, quality_before)
            per_point = usd_per_quality_point(figures["cost_usd"], quality, quality_before)
            extra = {"quality_gain_points": gain, "usd_per_quality_point": per_point}
            figures = dict(figures, **{k: v for k, v in extra.items() if v is not None})
        # the headline figures (``tracking.names``): cost_usd is among the figures, the score beside it
        self.log_metrics(figures if quality is None else dict(figures, **{HEADLINE_SCORE: quality}), step)
        report = build_report(
            job=job,
            status=status,
            ledger=ledger,
            price=money.price,
            figures=figures,
            quality_metric=quality_metric,
            quality=quality,
            quality_before=quality_before,
            tokens_per_step=money.figures.tokens_per_step,
            tokens_measured=money.figures.measured_tokens_per_step is not None,
        )
        text = format_report(report)
        url = self.tracker.run_url()
        print(text + (f"\nMLflow run page: {url}" if url else ""), flush=True)
        self.log_dict(report, "cost_report.json")
        self.log_text(text, "cost_report.txt")
        self.log_text(config_yaml, "config.yaml")
        self.tracker.log_table_artifact(checkpoints_table(ledger), CHECKPOINTS_TABLE)
        if bench_records:
            self.tracker.log_table_artifact(scores_table(bench_records), SCORES_TABLE)
        verdict = bench_verdict(bench_records)
        self.set_tags(
            {
                "status": status,
                "attempts": str(figures["attempts"]),
                "preemptions": str(figures["preemptions"]),
                RUN_NOTE_TAG: run_description(report, verdict),
                **({VERDICT_TAG: verdict[0]} if verdict else {}),
            }
        )
        self.close(tracker_status)

    def close(self, status: str, *, flush_timeout_s: float = 60.0) -> None:
        if self.tracker is not None:
            self.tracker.close(status, flush_timeout_s=flush_timeout_s)


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def log_model_dir(tracker: Any, folder, *, name: str, model_type: str, step: int) -> Optional[str]:
    """Upload ``folder`` as an MLflow logged model of ``tracker``'s run (MLflow 3: the run page's "Logged
    models", the experiment's Models tab), now -- it is large, and its folder is removed when the attempt
    ends, so it does not wait behind the delivery thread -- and mark it READY. Returns its model id, or
    None, logged, when MLflow refused or could not be reached; never raises. ``folder`` holds nothing secret."""
    if not tracker.enabled or tracker.client is None or not tracker.run_id:
        return None
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus

    from orchestrator.core.redaction import scrub_text
    from orchestrator.tracking.run import JOB_TAG

    client, model_id = tracker.client, None
    try:
        model = client.create_logged_model(
            tracker.experiment_id,
            name=name,
            source_run_id=tracker.run_id,
            model_type=model_type,
            tags={JOB_TAG: tracker.job_name},
        )
        model_id = model.model_id
        client.log_model_artifacts(model_id, str(folder))
        client.finalize_logged_model(model_id, LoggedModelStatus.READY)
        client.log_outputs(tracker.run_id, [LoggedModelOutput(model_id, int(step))])
    except Exception as err:  # noqa: BLE001 - the weights are the run's, not the tracker's, to lose
        log.warning(
            "could not log the final weights to MLflow as the logged model %r: %s", name, scrub_text(str(err))[:300]
        )
        if model_id is not None:  # not left PENDING as if still uploading
            try:
                client.finalize_logged_model(model_id, LoggedModelStatus.FAILED)
            except Exception:  # noqa: BLE001
                pass
        return None
    log.info("logged the final weights to MLflow run %s as the logged model %s (%s)", tracker.run_id, name, model_id)
    return model_id


def source_tags() -> dict:
    """MLflow's source tags for the job: the worker as its entry point, the commit of the code it runs
    (``orchestrator.records.repro.git_state``: the checkout, or the commit baked into the image)."""
    from orchestrator.records.repro import git_state

    commit, _ = git_state()
    tags = {SOURCE_NAME_TAG: "orchestrator.worker", SOURCE_TYPE_TAG: "JOB"}
    if commit:
        tags[GIT_COMMIT_TAG] = commit
    return tags


def dataset_input(train_dataset: Any, fingerprint: str, data_cfg: Any):
    """An ``mlflow.entities.DatasetInput`` for the training split, made by ``mlflow.data`` (schema and row count
    from the Hugging Face dataset). A hub dataset's source is its hub id; a JSONL file or the built-in
    task are named in a code source's tags."""
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.huggingface_dataset import from_huggingface
    from mlflow.entities import DatasetInput, InputTag

    from orchestrator.core.redaction import scrub_text

    source, path = str(data_cfg.source), scrub_text(str(data_cfg.path or ""))
    name = {"synthetic": "synthetic-arithmetic", "jsonl": path.rsplit("/", 1)[-1]}.get(source, path)
    kwargs = (
        {"path": path}
        if source == "hub"
        else {"source": CodeDatasetSource({"data.source": source, **({"data.path": path} if path else {})})}
    )
    dataset = from_huggingface(train_dataset, name=name, digest=fingerprint[:36], **kwargs)
    return DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag(DATASET_CONTEXT_TAG, "train")])


def checkpoints_table(ledger: Any) -> dict[str, list]:
    """The ledger's committed checkpoints (the newest ``checkpoint.keep_last``) as table columns: step, fence,
    time (UTC), size in bytes, path in storage. ``ledger``: decoded (``LedgerRecord``)."""
    from datetime import datetime, timezone

    def when(t) -> Optional[str]:
        return None if t is None else datetime.fromtimestamp(float(t), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    rows = ledger.checkpoints
    return {
        "step": [c.step for c in rows],
        "fence": [c.fence for c in rows],
        "time": [when(c.time) for c in rows],
        "size_bytes": [c.size for c in rows],
        "path": [c.key for c in rows],
    }


def scores_table(records: list) -> dict[str, list]:
    """Every benchmark point so far as table columns (metric, step, cost_usd, score, stderr): the score against
    dollars as a table MLflow draws itself."""
    from orchestrator.evaluation import curve

    points = [(key, p) for key, series in curve.from_records(records).items() for p in series]
    return {
        "metric": [k for k, _ in points],
        "step": [p.step for _, p in points],
        "cost_usd": [p.usd for _, p in points],
        "score": [p.value for _, p in points],
        "stderr": [p.stderr for _, p in points],
    }


def bench_verdict(records: Optional[list]) -> Optional[tuple[str, str]]:
    """(continue | stop | change, its numbers) of the benchmark results so far, as ``orchestrator report`` judges
    them with its defaults; None without two evaluations to compare."""
    if not records:
        return None
    from orchestrator.evaluation import curve

    return curve.job_verdict(curve.from_records(records))


def run_description(report: dict, verdict: Optional[tuple[str, str]] = None) -> str:
    """The run's description (markdown) from the cost report (``cost_report.build_report``): outcome, cost,
    spot savings, lost work and quality, so the run page answers "what did it cost, what did it buy"."""

    def usd(value, digits=4) -> str:
        return "-" if value is None else f"${value:,.{digits}f}"

    totals, spot, lost, quality = report["totals"], report["spot"], report["lost_work"], report["quality"]
    rows = [
        (
            "cost",
            f"{usd(totals['cost_usd'])} ({usd(totals['usd_per_step'], 6)} per step, "
            f"{usd(totals['usd_per_million_tokens'])} per million tokens)",
        ),
        (
            "spot savings",
            f"{usd(spot['savings_usd'])} against an uninterrupted on-demand run ({usd(spot['on_demand_cost_usd'])})"
            if spot.get("ran_on_spot", True)
            else "none (an on-demand job)",
        ),
        ("lost work", f"{lost['steps'] if lost['steps'] is not None else '-'} step(s) redone, {usd(lost['usd'])}"),
    ]
    if quality["value"] is not None:
        rows.append(
            (
                "quality",
                f"{quality['metric']} = {quality['value']:.4f} "
                f"({usd(quality['usd_per_point'], 6)} per percentage point)",
            )
        )
    else:
        rows.append(("quality", f"{quality['metric']}: not measured in this attempt"))
    if verdict is not None:
        rows.append(("verdict", f"{verdict[0]}: {verdict[1]}"))
    head = (
        f"**{report['job']}**: {report['status']} at step {totals['steps']} after {totals['attempts']} attempt(s), "
        f"{totals['preemptions']} preemption(s)."
    )
    return "\n".join([head, "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])
