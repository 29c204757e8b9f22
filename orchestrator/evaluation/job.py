"""Score a job's committed checkpoints and final weights (``orchestrator eval``: ``orchestrator.cli.evaluate``).

The config is the job's own (its model and recipe from its newest manifest: ``jobconfig``) with the command's
overrides (at least the ``eval.*`` keys), composed and checked like a launch (exit 4 with the fix). Every committed checkpoint (and ``final/``) without a sound result
for this task set is downloaded, verified (hashes, weights-only loads) and evaluated with the harness's ``hf``
model (full weights, or the base with the checkpoint's adapter through ``peft=``); each result is stored as soon
as it exists, so a rerun skips what is done and a SIGKILL loses at most the evaluation in flight.
"""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from orchestrator.records.bench_result import BenchResult
from orchestrator.storage.base import TransientStorageError, finite_number

log = logging.getLogger(__name__)


def _fetch_final(store: Any, run_name: str, dest: Path) -> Optional[Path]:
    """``<run>/final/``, downloaded and verified against its manifest (None: there is none, or it is unsound)."""
    from orchestrator.checkpoint import manifest as mf

    prefix = f"{run_name}/final/"
    try:
        manifest = mf.loads(store.get_bytes(prefix + mf.MANIFEST_NAME))
        mf.fetch_folder(store, prefix, manifest, dest)
    except FileNotFoundError:
        return None
    except (mf.CorruptCheckpoint, ValueError) as err:
        log.warning("%sfinal/ is unusable (%s); not evaluated", prefix, err)
        return None
    return dest


def _manifest(store: Any, key: str) -> dict:
    """The checkpoint's manifest ({} when it is not one this version writes: the fetch then refuses it)."""
    from orchestrator.checkpoint import manifest as mf

    try:
        return mf.loads(store.get_bytes(key))
    except (FileNotFoundError, mf.CorruptCheckpoint, ValueError):
        return {}


def _finite(value: Any) -> Optional[float]:
    """A number read from storage, or None when it is not a finite one (untrusted)."""
    return float(value) if finite_number(value) else None


def model_args(cfg: Any, folder: Path) -> dict:
    """The harness's ``hf`` arguments for a checkpoint folder: base + adapter (LoRA) or the folder's full weights."""
    from recipes.common import resolve_model_path

    args = {"dtype": str(cfg.model.dtype), "device": "cpu"}
    try:
        import torch

        args["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        pass
    if (folder / "adapter_config.json").exists():
        base = resolve_model_path(cfg.model)
        return dict(args, pretrained=base, peft=str(folder), tokenizer=base, revision=cfg.model.revision or "main")
    return dict(args, pretrained=str(folder))


def evaluate_run(cfg: Any, store: Any, run_name: str, work: Path, bill: Any = None) -> dict:
    """Evaluate what has no result yet; returns counts (evaluated, skipped, unusable). ``bill``: the run's
    ``billing.EvalBill``, charged after each evaluation (it raises BudgetExhausted once a cap is reached)."""
    from orchestrator.checkpoint.store import CheckpointStore
    from orchestrator.evaluation import harness, spec
    from orchestrator.evaluation.deadline import EvalDeadline
    from orchestrator.evaluation.results import ResultStore, manifest_hash
    from orchestrator.records.ledger import Ledger

    task_set = spec.resolve(cfg.eval)
    results = ResultStore.for_run(store, run_name, task_set, cfg.eval.seed)
    checkpoints = CheckpointStore(store, run_name, keep_last=10**6, staging_dir=work / "staging")
    todo: list[tuple[str, Optional[int], str]] = [(c.name, c.step, c.manifest_key) for c in checkpoints.committed()]
    final_key = f"{run_name}/final/manifest.json"
    if store.exists(final_key):
        todo.append(("final", None, final_key))
    counts = {"evaluated": 0, "skipped": 0, "unusable": 0, "left": 0}
    deadline = EvalDeadline.of(cfg, Ledger(store, run_name).load())
    for name, step, key in todo:
        digest = manifest_hash(store, key)
        if digest is None:
            continue
        if results.load(name, manifest_sha256=digest) is not None:
            counts["skipped"] += 1
            continue
        if not deadline.allows_another():  # run.deadline: stop before it, the done ones stored
            counts["left"] += 1
            continue
        started = time.monotonic()
        local = work / name
        shutil.rmtree(local, ignore_errors=True)
        manifest = _manifest(store, key)
        if step is None:
            folder = _fetch_final(store, run_name, local)
            step = int(manifest.get("step", 0)) if folder else 0
        else:
            folder, _ = checkpoints.restore_latest(work, step=step)
        if folder is None:
            counts["unusable"] += 1
            continue
        result = harness.run(task_set, cfg.eval, model_args=model_args(cfg, Path(folder)))
        record = results.save(name, step=step, manifest_sha256=digest, evaluation=result)
        log_to_run(cfg, store, run_name, record, step, _finite(manifest.get("created_at")), results.identity)
        counts["evaluated"] += 1
        print(
            f"{name} (step {step}): "
            + ", ".join(
                f"{task}/{metric}={score['value']:.4f}"
                for task, metrics in result.scores.items()
                for metric, score in metrics.items()
            ),
            flush=True,
        )
        shutil.rmtree(folder, ignore_errors=True)
        deadline.took(time.monotonic() - started)
        if bill is not None:
            bill.charge(counts["evaluated"])
    return counts


def log_to_run(
    cfg: Any, store: Any, run_name: str, record: BenchResult, step: int, committed_at: Optional[float], identity: dict
) -> int:
    """``record``'s (a stored result's) ``bench/<task>/<metric>`` (and ``_stderr``) at ``step`` into the job's
    MLflow run (the ledger's), with ``cost_usd`` beside them: the training's cost up to the checkpoint's commit
    (``billing.training_cost_until``); each (metric, step) only if the run does not have it yet, so a rerun logs
    nothing twice and a step the training logged its own cost at keeps that one. Its per-item values go to
    ``bench/items/`` (the report's paired verdict) with ``identity`` (the result store's: which items they are),
    only with scores logged now: the items of another ``eval.seed`` never replace those of the run's scores.
    Returns the points logged."""
    from orchestrator.evaluation.billing import training_cost_until
    from orchestrator.records.fields import CorruptRecord
    from orchestrator.records.ledger import Ledger
    from orchestrator.records.ledger_record import LedgerRecord

    ledger = Ledger(store, run_name)
    try:
        job = LedgerRecord.decode(ledger.load(), ledger.uri)
    except CorruptRecord as err:  # the scores stay in the result store; the run they go to is unknown
        log.warning("%s; the scores are stored but not logged to the job's MLflow run", err)
        return 0
    run_id = job.mlflow_run_id
    cost_usd = training_cost_until(job.attempts, committed_at)
    if not (cfg.tracking.enabled and run_id):
        return 0
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    from orchestrator.tracking.run import quiet_telemetry, resolve_tracking_uri

    quiet_telemetry()
    client = MlflowClient(tracking_uri=resolve_tracking_uri(cfg.tracking))
    now_ms, points = int(time.time() * 1000), []
    for task, metrics in record.scores.items():
        for metric, score in metrics.items():
            for key, value in (
                (f"bench/{task}/{metric}", score.value),
                (f"bench/{task}/{metric}_stderr", score.stderr),
            ):
                if value is not None and step not in {m.step for m in client.get_metric_history(run_id, key)}:
                    points.append(Metric(key, float(value), now_ms, int(step)))
    if cost_usd is not None and step not in {m.step for m in client.get_metric_history(run_id, "cost_usd")}:
        points.append(Metric("cost_usd", float(cost_usd), now_ms, int(step)))
    scored = any(p.key.startswith("bench/") for p in points)
    if points:
        client.log_batch(run_id, metrics=points)
    if record.samples and scored:
        from orchestrator.evaluation import curve

        client.log_dict(run_id, curve.items_payload(step, record.samples_table(), identity), curve.items_artifact(step))
    return len(points)


class EvalPreempted(BaseException):
    """SIGTERM, SIGUSR1 or SIGINT (a spot reclaim, Slurm's time limit, a pod's deletion) during ``orchestrator
    eval``: it exits 75, which every backend requeues (a BaseException, so no library's ``except Exception``
    swallows it)."""


def _raise_preempted(signum: int, _frame: Any) -> None:
    raise EvalPreempted(f"preempted by {signal.Signals(signum).name}")


def billed_evaluation(cfg: Any, store: Any, run_name: str) -> tuple[dict, float]:
    """``evaluate_run`` billed to the job (``billing.EvalBill``); a preemption signal closes the bill and raises
    EvalPreempted; a storage outage past ``storage.retry_for`` closes it if storage is back (``storage_outage``) and
    raises TransientStorageError (the command exits 75, as for a preemption)."""
    from orchestrator.core.exitcodes import PREEMPTION_SIGNALS
    from orchestrator.evaluation.billing import EvalBill

    bill = EvalBill(cfg, store, run_name)
    bill.open()
    counts: dict = {"evaluated": 0}
    previous = {sig: signal.signal(sig, _raise_preempted) for sig in PREEMPTION_SIGNALS}
    try:
        with tempfile.TemporaryDirectory(prefix="orch-eval-") as work:
            counts = evaluate_run(cfg, store, run_name, Path(work), bill)
    except EvalPreempted:
        bill.close(bill.evaluated, status="preempted")
        raise
    except TransientStorageError:  # past storage.retry_for: settled if storage is back by now (retried again)
        try:
            bill.close(bill.evaluated, status="storage_outage")
        except TransientStorageError as err:
            log.warning(
                "the evaluation's bill is left open (%s); the job's next orchestrator eval settles its spend "
                "index entry",
                err,
            )
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return counts, bill.close(counts["evaluated"], status="deadline" if counts["left"] else "completed")
