"""The attempt's MLflow side: the job's one run (resumed by every attempt), its metrics at the
right rate, and the closing cost report.

Built for every rank; on other ranks than the main one, and when tracking is
off, there is no MLflow client behind it and every call does nothing.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Optional

log = logging.getLogger("orchestrator.worker")


class AttemptTracking:
    """Args:
        tracker: the job's ``orchestrator.tracking.JobTracker``, or None (tracking off, or not the main rank).
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
    def from_config(cls, cfg: Any, *, main: bool, run_name: str, ledger: dict, quality_metric: str,
                    job_metrics_every_s: float) -> "AttemptTracking":
        """``ledger``: the job's ledger before this attempt begins (its MLflow run id, its attempts so far)."""
        from omegaconf import OmegaConf

        from orchestrator.tracking import JobTracker

        if not (main and cfg.tracking.enabled):
            return cls(None, job_metrics_every_s=job_metrics_every_s)
        tags = {"job": run_name, "recipe": cfg.recipe.name, "model": cfg.model.name_or_path,
                "gpu_type": cfg.compute.gpu_type, "spot": str(bool(cfg.compute.spot)), "status": "running",
                "attempts": str(len(ledger.get("attempts", [])) + 1), "quality_metric": quality_metric}
        tracker = JobTracker(cfg.tracking, job_name=run_name, tags=tags,
                             params=OmegaConf.to_container(cfg, resolve=True), run_id=ledger.get("mlflow_run_id"))
        return cls(tracker, job_metrics_every_s=job_metrics_every_s)

    def start(self) -> Optional[str]:
        """Open (or resume) the job's run; None when MLflow is unreachable (metrics are buffered)."""
        if self.tracker is None:
            return None
        from orchestrator.tracking import TrackingUnavailable

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

    def log_dict(self, obj: dict, artifact_file: str) -> None:
        if self.tracker is not None:
            self.tracker.log_dict_artifact(obj, artifact_file)

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

    def log_artifacts_dir(self, folder, artifact_path: str) -> bool:
        return self.tracker is not None and self.tracker.log_artifacts_dir(folder, artifact_path)

    def close_with_report(self, *, job: str, step: int, status: str, tracker_status: str, ledger: dict,
                          figures: dict, money: Any,
                          quality_metric: str, quality: Optional[float], config_yaml: str,
                          quality_before: Optional[float] = None, quality_is_fraction: bool = True) -> None:
        """The attempt's closing figures, the cost report (printed too), the redacted config; tag and close the run.

        ``quality_before``: the metric before training; USD per quality point is the cost over the points gained
        since (fraction-valued metrics only: a loss has no percentage points)."""
        if self.tracker is None:
            return
        from orchestrator.cost_report import (
            build_report,
            format_report,
            quality_gain_points,
            usd_per_quality_point,
        )

        if quality_is_fraction:
            gain = quality_gain_points(quality, quality_before)
            per_point = usd_per_quality_point(figures["cost_usd"], quality, quality_before)
            extra = {"quality_gain_points": gain, "usd_per_quality_point": per_point}
            figures = dict(figures, **{k: v for k, v in extra.items() if v is not None})
        self.log_metrics(figures, step)
        report = build_report(job=job, status=status, ledger=ledger, price=money.price, figures=figures,
                              quality_metric=quality_metric, quality=quality, quality_before=quality_before,
                              tokens_per_step=money.figures.tokens_per_step,
                              tokens_measured=money.figures.measured_tokens_per_step is not None)
        text = format_report(report)
        print(text, flush=True)
        self.log_dict(report, "cost_report.json")
        self.log_text(text, "cost_report.txt")
        self.log_text(config_yaml, "config.yaml")
        self.set_tags({"status": status, "attempts": str(figures["attempts"]), "preemptions": str(figures["preemptions"])})
        self.close(tracker_status)

    def close(self, status: str, *, flush_timeout_s: float = 60.0) -> None:
        if self.tracker is not None:
            self.tracker.close(status, flush_timeout_s=flush_timeout_s)
