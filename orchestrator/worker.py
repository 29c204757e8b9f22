"""One training attempt: ``python -m orchestrator.worker [hydra overrides]``.

Every backend runs this same command (the local supervisor as a child process,
Slurm from an sbatch script, SkyPilot and Kubernetes in the container):
1. open the run's ledger, take a new attempt epoch (fencing), refuse if caps or budget are spent;
2. find the newest committed checkpoint, download it, verify its hashes, check its fingerprints;
3. build the recipe's TRL trainer with the orchestrator's callback;
4. train; the callback saves on time, steps, a preemption notice or an exhausted budget;
5. commit the final weights, close the ledger and the MLflow run, and exit with a
   code that says what happened (see ``orchestrator.exitcodes``).
"""
from __future__ import annotations

import importlib
import logging
import math
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from orchestrator.tracking import quiet_telemetry

quiet_telemetry()  # before transformers/TRL/MLflow are imported below

from omegaconf import OmegaConf  # noqa: E402

from orchestrator import distributed as dist
from orchestrator import exitcodes
from orchestrator.checkpoint import manifest as mf
from orchestrator.checkpoint import snapshot
from orchestrator.checkpoint.callback import OrchestratorCallback
from orchestrator.checkpoint.fingerprint import check_resumable, trajectory_config
from orchestrator.checkpoint.store import CheckpointStore
from orchestrator.durations import parse_duration
from orchestrator.errors import ConfigError, UserError, end_attempt_on_error
from orchestrator.exitcodes import ExitClass

log = logging.getLogger("orchestrator.worker")

HEARTBEAT_SECONDS = float(os.environ.get("ORCH_HEARTBEAT_SECONDS", "15"))
# Chaos testing: crash every attempt this many steps after it started (0: off).
FAULT_AFTER_STEPS = int(os.environ.get("ORCH_FAULT_AFTER_STEPS", "0"))
# Chaos testing: a floor under each step's duration, so interruptions land mid-run on fast and slow machines alike.
STEP_DELAY_SECONDS = float(os.environ.get("ORCH_STEP_DELAY_SECONDS", "0"))
class Job:
    """The state of one attempt; also the hooks the Trainer callback calls."""

    def __init__(self, cfg, overrides: list[str]):
        from orchestrator.cost import CostMeter, load_catalog, price_for
        from orchestrator.ledger import Ledger
        from orchestrator.preemption import PreemptionHandler
        from orchestrator.requeue import RequeuePolicy
        from orchestrator.storage import store_from_config

        self.cfg = cfg
        self.overrides = overrides
        # a trial is its own job, so it neither resumes nor completes the real one
        self.run_name = cfg.run.name + ("-trial" if cfg.train.trial_steps > 0 else "")
        try:
            self.price = price_for(cfg.compute, load_catalog())
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self.meter = CostMeter(self.price)
        self.store = store_from_config(cfg.storage)
        self.ledger = Ledger(self.store, self.run_name, keep_checkpoints=cfg.checkpoint.keep_last)
        self.policy = RequeuePolicy(cfg.requeue)
        self.main = dist.is_main()
        # one folder per attempt, shared by its ranks (the launcher hands them a token)
        token = os.environ.get("ORCH_ATTEMPT_TOKEN", f"pid{os.getpid()}")
        work = Path(cfg.run.work_dir).expanduser().resolve() / self.run_name / token
        if self.main:
            shutil.rmtree(work, ignore_errors=True)
        self.work = work
        self.token = token
        self.snapshot_root = work  # moved to memory by use_snapshot_root() when there is room
        self.checkpoints = CheckpointStore(self.store, self.run_name, keep_last=cfg.checkpoint.keep_last,
                                           staging_dir=work / "staging")
        self.preemption = PreemptionHandler.from_config(cfg.preemption)
        if not self.main:  # rank 0 alone watches the cloud; every rank must survive the signal to save
            self.preemption.provider = "none"
        self.every_seconds = parse_duration(cfg.checkpoint.every, key="checkpoint.every")
        self.job_metrics_every = parse_duration(cfg.tracking.job_metrics_every, key="tracking.job_metrics_every")
        self._last_job_metrics = -math.inf  # the first log carries them
        self.prior_cost_usd = 0.0
        self.tracker = None
        self.guard = None
        self._max_steps = int(cfg.train.max_steps)
        self.step = 0
        self.step_at_start = 0
        self._last_heartbeat = time.monotonic()
        self._budget_stop = False
        self.fenced_error = None
        self.dataset_fp = ""
        self.trajectory = trajectory_config(cfg)
        self.first_step_seconds: float | None = None
        self.trial = cfg.train.trial_steps > 0

    # ---- 1. ledger ---------------------------------------------------------
    def begin(self) -> None:
        from orchestrator.requeue import start_refusal

        final_uri = self.store.get_uri(f"{self.run_name}/final/")

        def refuse(ledger: dict):  # a UserError: AlreadyCompleted (exit 0), CapsReached, BudgetExhausted
            return start_refusal(ledger, self.policy, max_usd=self.cfg.budget.max_usd, final_uri=final_uri)

        self.store.abort_incomplete_uploads(f"{self.run_name}/")
        newest = self.checkpoints.newest_step()
        attempt = self.ledger.begin_attempt(
            host=socket.gethostname(), pid=os.getpid(), instance_type=self.cfg.compute.name,
            gpu_type=self.cfg.compute.gpu_type, gpus=self.cfg.compute.gpus_per_node * self.cfg.compute.nodes,
            spot=bool(self.cfg.compute.spot), checkpoint_step=newest, refuse=refuse,
        )
        ledger = self.ledger.load()
        self.prior_cost_usd = sum(float(a.get("cost_usd") or 0) for a in ledger["attempts"][:-1])
        log.info("attempt epoch %d of job %r on %s (newest checkpoint: step %d)", attempt["epoch"],
                 self.run_name, attempt["host"], newest)
        self.checkpoints.remove_uncommitted()

    # ---- hooks for the callback -------------------------------------------
    def total_cost_usd(self) -> float:
        return self.prior_cost_usd + self.meter.attempt_cost_usd()

    def stop_reason(self) -> str | None:
        if self.preemption.requested:
            return f"preempted ({self.preemption.reason})"
        if self.guard is not None:
            total = self.total_cost_usd()
            steps = max(1, self.step - self.step_at_start)
            # plain numbers: this runs every step, and an OmegaConf lookup costs tens of microseconds
            self.guard.check(total, steps_done=self.step, max_steps=self._max_steps,
                             recent_usd_per_step=self.meter.attempt_cost_usd() / steps)
            if self.guard.exhausted(total):
                self._budget_stop = True
                return f"budget exhausted (${total:.4f} of ${self.cfg.budget.max_usd})"
        return None

    def on_step(self, step: int) -> None:
        self.step = step
        if not self.main:
            return
        if self.first_step_seconds is None:
            self.first_step_seconds = self.meter.attempt_seconds()
            log.info("start to first step: %.2fs (set-up and restore included, resumed at step %d)",
                     self.first_step_seconds, self.step_at_start)
        if STEP_DELAY_SECONDS:
            time.sleep(STEP_DELAY_SECONDS)
        if FAULT_AFTER_STEPS and step - self.step_at_start >= FAULT_AFTER_STEPS:
            raise RuntimeError(f"injected fault after {FAULT_AFTER_STEPS} steps (ORCH_FAULT_AFTER_STEPS)")
        if time.monotonic() - self._last_heartbeat >= HEARTBEAT_SECONDS:
            self.heartbeat()

    def heartbeat(self) -> None:
        self._last_heartbeat = time.monotonic()
        try:
            self.ledger.heartbeat(self.step, self.meter.attempt_cost_usd())
        except UserError as err:  # fenced: another attempt took over
            self.fenced_error = err
            self.preemption.request(f"fenced: {err}")

    def on_metrics(self, metrics: dict, step: int) -> None:
        """The Trainer's logs plus the job's cost and throughput figures, keyed by optimizer step.

        At the attempt's closing step (a stop was decided, max_steps reached, or the
        end-of-training summary) the cost figures are left to ``end``, which logs them
        once the attempt's bill is closed: a metric takes one point per step, and
        the last one must be the final total.
        """
        if self.tracker is None or not self.main:
            return
        self.figures().observe_logs(metrics, step)
        closing = (self.callback.stop_reason is not None or "train_runtime" in metrics
                   or (self._max_steps > 0 and step >= self._max_steps))
        now = time.monotonic()
        # The Trainer's metrics go at every logging step. The orchestrator's own (cost, lost work,
        # throughput, step time, memory) change slowly and were most of the job's points: they go
        # at the first log, then at most every tracking.job_metrics_every, and at the close.
        if closing or now - self._last_job_metrics >= self.job_metrics_every:
            self._last_job_metrics = now
            timing = self.callback.timing_metrics()
            metrics = dict(metrics, peak_memory_bytes=peak_memory_bytes(), **timing)
            if not closing:
                metrics.update(self.cost_figures(step, window_step_seconds=timing.get("step_time_s")))
        self.tracker.log_metrics(metrics, step)

    def figures(self):
        """The job's running cost figures (``orchestrator.cost_report.JobFigures``), built on first use."""
        if getattr(self, "_figures", None) is None:
            from orchestrator.cost_report import JobFigures, estimated_tokens_per_step

            prior = [a for a in self.ledger.load().get("attempts", []) if a.get("epoch") != self.ledger.epoch]
            self._figures = JobFigures(self.price, prior, step_at_start=self.step_at_start,
                                       fallback_tokens_per_step=estimated_tokens_per_step(self.cfg))
        return self._figures

    def cost_figures(self, step: int, *, window_step_seconds: float | None = None, ledger: dict | None = None) -> dict:
        """Cost, GPU-hours, tokens, lost work, savings and checkpoint time at ``step``; with ``ledger``
        (after ``end_attempt``) the totals are the ledger's."""
        callback = getattr(self, "callback", None)
        whole = callback.timing_metrics(reset=False, whole_run=True) if callback is not None else {}
        overrides = {}
        if ledger is not None:
            attempts = ledger["attempts"]
            overrides = dict(total_cost_usd=float(ledger["cost_usd"]), attempts=len(attempts),
                             preemptions=sum(a["exit_class"] in ("preempted", "vanished") for a in attempts))
        return self.figures().figures(
            step=step, attempt_cost_usd=self.meter.attempt_cost_usd(), attempt_gpu_hours=self.meter.gpu_hours(),
            mean_step_seconds=whole.get("step_time_s"),
            window_step_seconds=window_step_seconds,
            checkpoint_stall_seconds=sum(callback.save_stall_seconds) if callback is not None else 0.0,
            checkpoint_upload_seconds=sum(r.seconds for r in self.checkpoints.results), **overrides)

    def commit(self, folder: Path, step: int, *, wait: bool) -> None:
        dist.barrier()  # every rank's files (RNG, optimizer shards) are written before rank 0 commits
        if not self.main:
            return
        meta = {"trajectory": self.trajectory, "dataset_fingerprint": self.dataset_fp,
                "attempt_epoch": self.ledger.epoch, "wall_time": time.time()}
        started = time.monotonic()

        def on_committed(result, manifest):
            self.ledger.record_checkpoint(step, f"{self.run_name}/checkpoints/{result.name}", result.bytes,
                                          cost_usd=self.meter.attempt_cost_usd())

        self.checkpoints.commit_async(folder, step=step, epoch=self.ledger.epoch, meta=meta,
                                      may_commit=self.ledger.check_epoch, on_committed=on_committed)
        if wait:
            self.checkpoints.wait()
            took = time.monotonic() - started
            left = self.preemption.seconds_left()
            ok = self.checkpoints.results and self.checkpoints.results[-1].ok
            log.warning("emergency checkpoint at step %d %s in %.2fs%s", step, "committed" if ok else "FAILED", took,
                        "" if left is None else f" ({left:.1f}s before the deadline)")

    # ---- tracking -----------------------------------------------------------
    def start_tracking(self) -> None:
        from orchestrator.budget import BudgetGuard, default_sinks
        from orchestrator.tracking import JobTracker, TrackingUnavailable

        cfg = self.cfg
        if cfg.tracking.enabled:
            ledger = self.ledger.load()
            tags = {"job": self.run_name, "recipe": cfg.recipe.name, "model": cfg.model.name_or_path,
                    "gpu_type": cfg.compute.gpu_type, "spot": str(bool(cfg.compute.spot)),
                    "status": "running", "attempts": str(len(ledger["attempts"])),
                    "quality_metric": self.recipe.QUALITY_METRIC}
            self.tracker = JobTracker(cfg.tracking, job_name=self.run_name, tags=tags,
                                      params=OmegaConf.to_container(cfg, resolve=True),
                                      run_id=ledger.get("mlflow_run_id"))
            try:
                run_id = self.tracker.start()
            except TrackingUnavailable as err:
                log.warning("MLflow unavailable (%s); training goes on and metrics are buffered", err)
                run_id = None
            if run_id and run_id != ledger.get("mlflow_run_id"):
                self.ledger.set_mlflow_run_id(run_id)
        set_tag = self.tracker.set_tag if self.tracker else None
        self.guard = BudgetGuard(cfg.budget, record_alert=self.ledger.record_alert,
                                 sinks=default_sinks(cfg.budget, set_tag=set_tag), job_name=self.run_name)

    # ---- 2-5. restore, train, finish -----------------------------------------
    def run(self) -> int:
        from recipes.data import fingerprint, load_datasets

        cfg = self.cfg
        self.recipe = importlib.import_module(f"recipes.{cfg.recipe.name}")
        if self.main:
            self.begin()
        self.preemption.install()
        try:
            if self.main:
                self.start_tracking()
                self.record_repro()
            train_ds, eval_ds = load_datasets(cfg.data, cfg.recipe.name)
            self.dataset_fp = fingerprint(train_ds)
            restored, manifest = self.restore()
            self.step = self.step_at_start = manifest["step"] if manifest else 0
            self.callback = OrchestratorCallback(self, every_seconds=0 if self.trial else self.every_seconds,
                                                 every_steps=0 if self.trial else cfg.checkpoint.every_steps,
                                                 stop_after_steps=cfg.train.trial_steps)
            trainer = self.recipe.build_trainer(cfg, train_dataset=train_ds, eval_dataset=eval_ds,
                                                output_dir=str(self.work / "trainer"), callbacks=[self.callback])
            self.use_snapshot_root(trainer)
            if restored is None and not self.trial and self.main and cfg.distributed.name != "zero3":
                self.record_quality_before(trainer, eval_ds)
            trainer.train(resume_from_checkpoint=str(restored) if restored else None)
            self.checkpoints.wait()
            if self.trial:
                return self.finish_trial(trainer)
            if self.callback.stop_reason:
                return self.stop(self.callback.stop_reason)
            return self.finish(trainer, eval_ds)
        finally:
            self.preemption.uninstall()
            self.checkpoints.close()
            if self.main:
                shutil.rmtree(self.work, ignore_errors=True)
                if self.snapshot_root != self.work:
                    snapshot.release(self.snapshot_root)

    def use_snapshot_root(self, trainer) -> None:
        """Let the Trainer write its checkpoint folder (and the uploader stage it) in memory when there is room.

        The Trainer's save is the only part of a checkpoint training waits for;
        into ``/dev/shm`` it is serialisation into memory. Rank 0 decides, every
        rank of the attempt uses the same folder.
        """
        chosen = None
        if self.main:
            estimate = snapshot.estimate_snapshot_bytes(trainer.model, full_model=self.cfg.recipe.peft == "full")
            root, why = snapshot.choose_root(self.cfg.checkpoint.snapshot_dir, run_name=self.run_name,
                                             token=self.token, work=self.work, estimate_bytes=estimate)
            if root != self.work:
                snapshot.remove_orphans(root.parent)
                snapshot.claim(root)
            log.info("local checkpoint snapshots in %s (%s; about %.1f MB each)", root, why, estimate / 1e6)
            chosen = str(root)
        root = Path(dist.broadcast(chosen))
        self.snapshot_root = root
        trainer.args.output_dir = str(root / "trainer")
        self.checkpoints.staging_dir = root / "staging"
        self.checkpoints.staging_dir.mkdir(parents=True, exist_ok=True)

    def restore(self):
        """Rank 0 downloads and verifies the newest checkpoint; every rank gets its local path."""
        if self.main:
            try:
                restored, manifest = self.checkpoints.restore_latest(
                    self.work / "restore",
                    check=lambda m: check_resumable(m, self.trajectory, self.dataset_fp, self.cfg))
            except UserError as err:
                dist.broadcast(("error", str(err)))
                raise
            dist.broadcast(("ok", (str(restored) if restored else None, manifest)))
            return restored, manifest
        status, payload = dist.broadcast(None)
        if status == "error":
            raise ConfigError(payload)
        path, manifest = payload
        return (Path(path) if path else None), manifest

    def finish_trial(self, trainer) -> int:
        """``train.trial_steps=N``: print the plan beside what N steps measured; log both to MLflow."""
        from orchestrator import plan

        measured = plan.count_allocated_state_bytes(trainer.model, trainer.optimizer)
        measured["grads"] = gradient_bytes(trainer)  # the Trainer frees gradients after each step
        timing = self.callback.timing_metrics(reset=False, whole_run=True)
        measured.update(peak_memory_bytes=peak_memory_bytes(), step_time_s=timing.get("step_time_s"),
                        data_wait_s=timing.get("data_wait_s"))
        tokens_per_step = (self.cfg.train.per_device_batch_size * self.cfg.train.gradient_accumulation_steps
                           * self.cfg.data.max_length)
        if measured["step_time_s"]:
            measured["tokens_per_second"] = tokens_per_step / measured["step_time_s"]
        estimate = plan.estimate_memory(self.cfg)
        cost = plan.estimate_cost(self.cfg, self.price)
        print(plan.format_trial(estimate, measured, cost), flush=True)
        if self.tracker:
            self.tracker.log_metrics({f"trial_{k}": float(v) for k, v in measured.items() if v is not None}, self.step)
            self.tracker.log_dict_artifact({"estimate": estimate.components, "measured": measured}, "trial.json")
        self.end(ExitClass.COMPLETED)
        return exitcodes.COMPLETED

    def record_repro(self) -> None:
        """Record what this attempt runs on; warn when it differs from the first attempt in a result-changing way."""
        from orchestrator.repro import collect_record, diff_records

        record = collect_record(OmegaConf.to_container(self.cfg, resolve=True), image=self.cfg.backend.image)
        first = {}

        def fn(ledger):
            nonlocal first
            first = ledger.get("repro") or {}
            if not first:
                ledger["repro"] = record
            self.ledger.current_attempt(ledger)["extra"]["repro"] = record

        self.ledger.update(fn)
        differences = diff_records(first, record) if first else []
        for line in differences:
            log.warning("this attempt differs from the first one: %s", line)
        if self.tracker:
            self.tracker.log_dict_artifact(record, f"repro/attempt-{self.ledger.epoch}.json")
            if differences:
                self.tracker.set_tags({"repro_differs": "true"})
                self.tracker.log_text_artifact("\n".join(differences), f"repro/attempt-{self.ledger.epoch}-differences.txt")

    def record_quality_before(self, trainer, eval_ds) -> None:
        acc = self.recipe.accuracy(trainer, self.cfg, eval_ds)
        print(f"held-out accuracy before training: {acc:.3f}", flush=True)
        self.ledger.update(lambda ledger: ledger.setdefault("quality", {}).update({"eval_accuracy_before": acc}))
        if self.tracker:
            self.tracker.log_metrics({"eval_accuracy": acc}, 0)

    def stop(self, reason: str) -> int:
        """After an emergency checkpoint: preempted (requeue) or budget exhausted (stop)."""
        if not self.main:
            return exitcodes.BUDGET_EXHAUSTED if "budget" in reason else exitcodes.PREEMPTED
        if self.fenced_error is not None:
            raise self.fenced_error
        if self._budget_stop:
            self.end(ExitClass.BUDGET_EXHAUSTED)
            print(f"stopped: {reason}; the final checkpoint is committed and the job will not be requeued", flush=True)
            return exitcodes.BUDGET_EXHAUSTED
        self.end(ExitClass.PREEMPTED)
        return exitcodes.PREEMPTED

    def finish(self, trainer, eval_ds) -> int:
        cfg = self.cfg
        final = self.work / "final"
        trainer.save_model(str(final))  # collective under ZeRO-3; the Trainer writes on rank 0
        dist.barrier()
        if self.main:
            trainer.processing_class.save_pretrained(str(final))
            (final / "config.yaml").write_text(OmegaConf.to_yaml(redacted_config(cfg)))
            self.ledger.check_epoch()
            self.upload_final(final)
        metrics = self.recipe.evaluate(trainer, cfg, eval_ds) if cfg.train.eval_at_end else {}
        if not self.main:
            return exitcodes.COMPLETED
        before = (self.ledger.load().get("quality") or {}).get("eval_accuracy_before")
        if "eval_accuracy" in metrics:
            print(f"held-out accuracy before training: {before if before is None else f'{before:.3f}'}; "
                  f"after: {metrics['eval_accuracy']:.3f}", flush=True)
        print("final metrics: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()), flush=True)
        self.ledger.update(lambda ledger: ledger.setdefault("quality", {}).update(metrics))
        if self.tracker:
            self.tracker.log_metrics(metrics, self.step)
        self.end(ExitClass.COMPLETED, final_metrics=metrics)
        print(f"final weights: {self.store.get_uri(f'{self.run_name}/final/')}", flush=True)
        return exitcodes.COMPLETED

    def upload_final(self, folder: Path) -> None:
        """Final weights under ``<run>/final/``, manifest last, like a checkpoint."""
        manifest = mf.build_manifest(folder, run_name=self.run_name, step=self.step, epoch=self.ledger.epoch,
                                     meta={"trajectory": self.trajectory, "dataset_fingerprint": self.dataset_fp})
        prefix = f"{self.run_name}/final/"
        self.store.delete(prefix + mf.MANIFEST_NAME)
        for entry in manifest["files"]:
            self.store.upload_file(folder / entry["path"], prefix + entry["path"])
        self.store.put_bytes(prefix + mf.MANIFEST_NAME, mf.dumps(manifest))

    def end(self, exit_class: ExitClass, *, final_metrics: dict | None = None) -> None:
        """Close the attempt in the ledger; log the final cost figures, the cost report and the
        redacted config to MLflow; tag the run with its status; close the run (statuses: exitcodes.OUTCOMES)."""
        status, tracker_status = exitcodes.outcome(exit_class).ledger_status, exitcodes.outcome(exit_class).mlflow_status
        self.ledger.end_attempt(exit_class, self.step, self.meter.attempt_cost_usd())
        ledger = self.ledger.load()
        if self.guard is not None and not self.guard.wait_for_delivery():
            log.warning("a budget alert was still being sent when the attempt ended; it may not arrive")
        if self.tracker:
            from orchestrator.cost_report import build_report, format_report, usd_per_quality_point

            figures = self.cost_figures(self.step, ledger=ledger)
            quality = (final_metrics or {}).get(self.recipe.QUALITY_METRIC)
            per_point = usd_per_quality_point(figures["cost_usd"], quality)
            if per_point is not None:
                figures["usd_per_quality_point"] = per_point
            self.tracker.log_metrics(figures, self.step)
            report = build_report(job=self.run_name, status=status, ledger=ledger, price=self.price, figures=figures,
                                  quality_metric=self.recipe.QUALITY_METRIC, quality=quality,
                                  tokens_per_step=self.figures().tokens_per_step,
                                  tokens_measured=self.figures().measured_tokens_per_step is not None)
            text = format_report(report)
            print(text, flush=True)
            self.tracker.log_dict_artifact(report, "cost_report.json")
            self.tracker.log_text_artifact(text, "cost_report.txt")
            self.tracker.log_text_artifact(OmegaConf.to_yaml(redacted_config(self.cfg)), "config.yaml")
            self.tracker.set_tags({"status": status, "attempts": str(figures["attempts"]),
                                   "preemptions": str(figures["preemptions"])})
            self.tracker.close(tracker_status)

    def fail(self, exit_class: ExitClass) -> None:
        """Best effort: record a failed attempt; the ledger may be what failed."""
        try:
            self.ledger.end_attempt(exit_class, self.step, self.meter.attempt_cost_usd())
        except Exception as err:  # noqa: BLE001
            log.warning("could not record the attempt's end in the ledger: %s", err)
        if self.tracker:
            self.tracker.close(exitcodes.outcome(exit_class).mlflow_status or "FAILED", flush_timeout_s=10)


def gradient_bytes(trainer) -> int:
    """Bytes of gradients one backward pass allocates, measured on a training batch."""
    model = trainer.model
    batch = next(iter(trainer.get_train_dataloader()))
    batch = trainer._prepare_inputs(batch)
    model.train()
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    total = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    model.zero_grad(set_to_none=True)
    return int(total)


def peak_memory_bytes() -> int:
    """CUDA max allocated on a GPU; peak RSS of this process on CPU."""
    import resource

    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def redacted_config(cfg) -> dict:
    from orchestrator.tracking import redact

    return redact(OmegaConf.to_container(cfg, resolve=True))


def main(argv: list[str] | None = None) -> int:
    code = _run(argv)
    dist.report_exit(code)  # under torchrun, the launcher reads rank 0's code from here
    return code


def _run(argv: list[str] | None = None) -> int:
    from orchestrator.compose import absolutize, compose_config
    from orchestrator.logsetup import setup_logging

    setup_logging()
    overrides = absolutize(list(sys.argv[1:] if argv is None else argv))
    job = None
    try:
        cfg = compose_config(overrides)
        if dist.needs_launcher(cfg):
            return dist.launch_ranks(cfg, overrides, Path(cfg.run.work_dir).expanduser().resolve() / cfg.run.name)
        dist.init_process_group()
        job = Job(cfg, overrides)
        code = job.run()
        dist.report_exit(code)
        return code
    except Exception as err:  # noqa: BLE001 - user errors, trainer-side config errors, OOM, bugs: see errors.py
        return end_attempt_on_error(err, job)


if __name__ == "__main__":
    sys.exit(main())
