"""The training attempt's benchmark evaluations (``eval.tasks``): the base model once, every ``eval.every``-th
committed checkpoint right after its commit, and always the final weights.

The model evaluated is the trainer's, in memory (imports and the model's load are paid once), at the step of
the checkpoint just committed: the same weights as the checkpoint. Its time is metered apart (``seconds``) and
shown as evaluation time in the cost report; the step timing does not count it. Each result goes to storage
(``results.ResultStore``) and to the job's MLflow run as ``bench/<task>/<metric>`` (and ``_stderr``) with
``cost_usd`` at the checkpoint's step; the tracker drops a (metric, step) the run already has, so a restart that
evaluates a checkpoint again logs nothing twice.

``eval.every`` counts the job's regular saves (not the emergency save of a stop) in
``<run>/bench/<hash>/progress.json``, each noted when it is saved and again once evaluated. An attempt resuming
from a checkpoint counts only the saves up to it (later ones never committed), and evaluates it if it was due and
its evaluation never finished (the attempt was killed during it).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from typing import Any, Optional

from transformers import TrainerCallback

from orchestrator.evaluation import curve, harness, selection, spec, stats
from orchestrator.evaluation.results import ResultStore, manifest_hash
from orchestrator.records.bench_result import BenchResult

log = logging.getLogger(__name__)


def base_key(cfg: Any, task_set: Any) -> str:
    """The base model's cache key: model, revision, shape and dtype, the task set (with few-shot and limit), seed."""
    m = cfg.model
    shape = {
        "model": m.name_or_path,
        "revision": m.revision,
        "dtype": m.dtype,
        "quantization": cfg.recipe.quantization,
        "tiny": [m.hidden_size, m.num_layers, m.num_heads, m.vocab_size],
        "tasks": task_set.config_hash,
        "seed": int(cfg.eval.seed),
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:24]


class BenchWatch(TrainerCallback):
    """Args: ``store`` the job's object store; the attempt's ``tracking``, ``checkpoints`` (the controller),
    ``money`` (the meter, for the dollars beside each score), ``steps`` (the step clock) and ``record`` (the
    ledger's: ``record_scores``). A main-rank part."""

    def __init__(
        self,
        cfg: Any,
        *,
        store: Any,
        run_name: str,
        tracking: Any,
        checkpoints: Any,
        money: Any,
        steps: Any,
        record: Any = None,
    ):
        self.cfg, self.ev, self.store, self.run_name, self.record = cfg, cfg.eval, store, run_name, record
        self.tracking, self.checkpoints, self.money, self.steps = tracking, checkpoints, money, steps
        self.task_set = spec.resolve(cfg.eval)
        self.results = ResultStore.for_run(store, run_name, self.task_set, cfg.eval.seed)
        key = base_key(cfg, self.task_set)
        self.base_results = ResultStore(
            store,
            f"_bench/{key}",
            harness_version=self.task_set.harness_version,
            task_hash=self.task_set.config_hash,
            seed=cfg.eval.seed,
        )
        self.base: Optional[BenchResult] = None
        self.seconds = 0.0  # evaluation time this attempt
        self.evaluated: list[int] = []  # steps evaluated this attempt
        self.history: list[list[int]] = []  # [step, regular commits since the last evaluated one] per noted save
        self.records: dict[
            int, BenchResult
        ] = {}  # step -> the result logged at it (the base's at 0): the chart's points
        name = cfg.train.early_stopping_metric
        # early stopping / checkpoint.final=best on a benchmark metric; the reason training ended early on it
        self.select = name if selection.is_bench_metric(name) else None
        self.early_stop_reason: Optional[str] = None

    # ---- the Trainer's hooks --------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.tracking.set_tags(spec.describe(self.task_set, self.ev))
        self.base = self._base(model, processing_class)
        self._replay(state.global_step)
        restored = self._committed_at(state.global_step)
        # saves noted after the restored checkpoint never committed: they do not count
        self.history = [
            e
            for e in read_progress(self.store, f"{self.results.prefix}progress.json")
            if restored is not None and e[0] <= state.global_step
        ]
        if restored is not None and (not self.history or self.history[-1][0] < state.global_step):
            self._note(state.global_step, (self.history[-1][1] if self.history else 0) + 1)  # killed before noting
        if restored is not None and self.ev.every > 0 and self.history[-1][1] >= self.ev.every:
            self._evaluate_checkpoint(model, processing_class, restored, state, control)  # killed before or during it
        self._decide(state, control)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.early_stop_reason:  # decided at a save (or replayed at the start): training ends now
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, model=None, processing_class=None, **kwargs):
        rung = 0 < self.cfg.train.pause_at_step <= state.global_step < state.max_steps  # a sweep's: always scored
        if not rung and (self.ev.every <= 0 or (control.should_training_stop and state.global_step < state.max_steps)):
            # training stops after this save: an emergency save (the next attempt goes on) or an early stop's
            return control
        since = (self.history[-1][1] if self.history else 0) + 1
        self._note(state.global_step, since)
        if rung or since >= self.ev.every:
            self.checkpoints.wait()
            done = self.checkpoints.checkpoints.results
            if done and done[-1].ok and done[-1].step == state.global_step:
                self._evaluate_checkpoint(model, processing_class, done[-1].name, state, control, announce=True)
            self.steps.resume()  # the evaluation is not the data loader's wait
        return control

    # ---- evaluations ----------------------------------------------------------------
    def _evaluate_checkpoint(self, model, tokenizer, name: str, state, control, *, announce: bool = False) -> None:
        """Score, decide (an early stop), log: ``cost_usd`` only if training goes on (else the closing total)."""
        step = state.global_step
        digest = manifest_hash(self.store, f"{self.run_name}/checkpoints/{name}/manifest.json")
        if digest is None:
            return
        self.records[step] = record = self._score(name, step, digest, model, tokenizer)
        self._note(step, 0)
        self._decide(state, control, announce=announce)
        self._log(record, step, cost=not (self.early_stop_reason or step >= state.max_steps > 0))

    def after_final(self, trainer: Any, step: int) -> Optional[dict]:  # the summary's rows
        """The final weights (committed under ``<run>/final/``), then the job's benchmark summary."""
        digest = manifest_hash(self.store, f"{self.run_name}/final/manifest.json") or f"unsaved-step-{step}"
        record = self._score(
            "final", step, digest, trainer.model, trainer.processing_class, keep_samples=bool(self.ev.log_samples)
        )
        self._log(record, step, cost=False)  # the closing report logs the final total at the last step
        return self.summary(record)

    def _score(self, name: str, step: int, digest: str, model, tokenizer, keep_samples: bool = False) -> BenchResult:
        record = self.results.load(name, manifest_sha256=digest)
        if record is not None and not keep_samples:
            return record
        result = harness.run(self.task_set, self.ev, model=model, tokenizer=tokenizer, keep_samples=keep_samples)
        self.seconds += result.seconds
        self.evaluated.append(step)
        if keep_samples and result.raw_samples is not None:
            self.tracking.log_dict(json.loads(json.dumps(result.raw_samples, default=str)), "bench/samples_final.json")
        return self.results.save(
            name, step=step, manifest_sha256=digest, evaluation=result, cost_usd=self.money.total_cost_usd()
        )

    def _base(self, model, tokenizer) -> Optional[BenchResult]:
        """The base model's scores, from ``_bench/<key>/`` or evaluated once (LoRA: the adapter switched off)."""
        identity = f"base:{base_key(self.cfg, self.task_set)}"
        cached = self.base_results.load("base", manifest_sha256=identity)
        if cached is None:
            if self.cfg.recipe.peft == "lora" and hasattr(model, "disable_adapter"):
                with model.disable_adapter():
                    result = harness.run(self.task_set, self.ev, model=model, tokenizer=tokenizer)
            else:
                from recipes.common import resolve_model_path

                result = harness.run(
                    self.task_set,
                    self.ev,
                    model_args={
                        "pretrained": resolve_model_path(self.cfg.model),
                        "dtype": str(self.cfg.model.dtype),
                        "revision": self.cfg.model.revision or "main",
                    },
                )
            self.seconds += result.seconds
            cached = self.base_results.save("base", step=0, manifest_sha256=identity, evaluation=result)
        self._log(cached, 0, cost=False)
        return cached

    def _decide(self, state, control, *, announce: bool = False) -> None:
        """``train.early_stopping_metric=bench/...``: the best checkpoint beyond noise as the Trainer state's
        ``best_global_step`` (``checkpoint.final=best``, retention) and whether a plateau ends training."""
        if self.select is None:
            return
        chosen = selection.of_checkpoints(self.records.values(), self.select, self.cfg.train)
        if chosen.best_step is not None:
            state.best_global_step, state.best_metric = chosen.best_step, chosen.best_value
        if announce:
            print(f"benchmark selection {selection.describe(chosen, self.select)}", flush=True)
        if chosen.stop_reason:
            self.early_stop_reason = chosen.stop_reason
            control.should_training_stop = True

    # ---- what it reports ----------------------------------------------------------------
    def _replay(self, restored_step: int) -> None:
        """Points of stored results an earlier attempt was killed before delivering (the tracker drops those the
        run has): oldest first, each with the cost it was evaluated at."""
        records = []
        for name in self.results.names():
            if name in ("progress", "final"):
                continue
            digest = manifest_hash(self.store, f"{self.run_name}/checkpoints/{name}/manifest.json")
            record = self.results.load(name, manifest_sha256=digest) if digest else None  # None: retention took it
            if record is not None and record.step <= restored_step:
                records.append(record)
        for record in sorted(records, key=lambda r: r.step):
            self._log(record, record.step, cost=record.cost_usd is not None, chart=False)

    def _log(self, record: BenchResult, step: int, *, cost: bool = True, chart: bool = True) -> None:
        """The record's points at ``step``, then (``chart``) the score-against-dollars chart redrawn from every
        point so far (replayed ones included) under one artifact name: a restart replaces it, never adds one."""
        if cost and record.cost_usd is None:
            record = replace(record, cost_usd=self.money.total_cost_usd())
        self.records.setdefault(int(step), replace(record, step=int(step)))  # final=best: the best's own point stays
        metrics = bench_points(record)
        record_scores(self.record, int(step), metrics)
        if cost:
            metrics.update(cost_usd=record.cost_usd)
        self.tracking.log_metrics(metrics, step)
        log_items(self.tracking, step, record)
        if chart and getattr(self.tracking, "active", True):
            self.tracking.log_file(
                curve.render(self.records.values(), title=f"{self.run_name}: benchmark score against dollars"),
                curve.CHART_ARTIFACT,
            )
        tracker = getattr(self.tracking, "tracker", None)
        if tracker is not None:  # delivered now: a SIGKILL after this loses no point
            tracker.flush(timeout_s=10.0)

    def summary(self, final: BenchResult) -> Optional[dict]:
        """Per task and metric: the final score, the base's, the gain with its 95% interval, USD per point."""
        if self.base is None:
            return None
        cost = self.money.total_cost_usd()
        rows = {}
        for key, g in stats.gains(final, self.base).items():
            rows[key] = {
                "gain_points": g.points,
                "interval_points": g.half_width,
                "paired": g.paired,
                "usd_per_point": g.usd_per_point(cost),
                "verdict": g.verdict(cost),
            }
        gain_metrics = {}
        for key, row in rows.items():
            gain_metrics[f"bench_gain/{key}"] = row["gain_points"]
            gain_metrics[f"bench_gain/{key}_interval"] = row["interval_points"]
            if row["usd_per_point"] is not None:
                gain_metrics[f"bench_usd_per_point/{key}"] = row["usd_per_point"]
        self.tracking.log_metrics(gain_metrics, final.step)
        lines = [f"benchmark {key}: {row['verdict']}" for key, row in rows.items()]
        if lines:
            print("\n".join(lines), flush=True)
        self.tracking.log_dict({"cost_usd": cost, "gains": rows, "refused": self.results.refused}, "bench/summary.json")
        return rows

    def figures(self) -> dict:
        """Evaluation time this attempt, for the cost report (not training time)."""
        return {
            "attempt_evaluation_s": self.seconds,
            "attempt_evaluation_usd": self.seconds * self.money.price.usd_per_second,
        }

    def _note(self, step: int, since: int) -> None:
        """The save at ``step`` is the ``since``-th regular commit since the last evaluated one (0: evaluated)."""
        self.history = [e for e in self.history if e[0] < step][-8:] + [[int(step), int(since)]]
        self.store.put_bytes(f"{self.results.prefix}progress.json", json.dumps({"saves": self.history}).encode())

    def _committed_at(self, step: int) -> Optional[str]:
        found = [c.name for c in self.checkpoints.checkpoints.committed() if c.step == step]
        return found[-1] if found and step > 0 else None


def bench_points(record: BenchResult) -> dict:
    """A stored result's MLflow points: ``bench/<task>/<metric>`` and its ``_stderr`` where the harness gives one."""
    metrics: dict[str, Any] = {}
    for task, scores in record.scores.items():
        for metric, score in scores.items():
            metrics[f"bench/{task}/{metric}"] = score.value
            if score.stderr is not None:
                metrics[f"bench/{task}/{metric}_stderr"] = score.stderr
    return metrics


def record_scores(record: Any, step: int, metrics: dict) -> None:
    """A checkpoint's (or the final weights') scores also in the ledger's ``quality.evals[<step>]``: what a
    sweep's rung decides by with ``sweep.metric=bench/<task>/<metric>`` (its checkpoint at ``train.pause_at_step``
    is scored whatever ``eval.every``). Not the base model's (step 0)."""
    if record is not None and record.writes and step > 0:
        record.record_eval(step, {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})


def log_items(tracking: Any, step: int, record: BenchResult) -> None:
    """The record's per-item values as the run's ``bench/items/`` artifact of its step: what makes the report's
    verdict paired over the same items (MLflow's metrics hold only the score and its standard error)."""
    if record.samples:
        tracking.log_dict(
            curve.items_payload(step, record.samples_table(), record.identity), curve.items_artifact(step)
        )


def read_progress(store: Any, key: str) -> list[list[int]]:
    """The noted saves (``[[step, since], ...]``) in ``progress.json``; none when missing or not sound."""
    try:
        data = json.loads(store.get_bytes(key))
    except (FileNotFoundError, KeyError, ValueError):
        return []
    entries: Any = data.get("saves") if isinstance(data, dict) else None
    ok = isinstance(entries, list) and all(
        isinstance(e, list) and len(e) == 2 and all(isinstance(v, int) and v >= 0 for v in e) for e in entries
    )
    return entries if ok else []


def bench_watch(cfg: Any, **ports: Any) -> Optional[BenchWatch]:
    """The attempt's watch when ``eval.tasks`` is set (made for the main rank only), else None."""
    return BenchWatch(cfg, **ports) if spec.enabled(cfg) else None
