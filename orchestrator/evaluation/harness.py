"""One lm-evaluation-harness evaluation: ``lm_eval.simple_evaluate`` of a model on the job's task set.

The model is the one in memory (the training attempt: the trainer's model, base + adapter, at the job's dtype)
or a folder (full weights, or a base with a LoRA adapter through the harness's ``peft=``). The harness seeds
Python's, NumPy's and torch's generators; an evaluation inside training puts them back as they were, so the
training run continues exactly as it would have without it, and ``model.train()`` is restored.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """``scores[task][metric] = {"value", "stderr"}``; ``samples[task][metric]``: per-item values in item order."""

    scores: dict = field(default_factory=dict)
    samples: dict = field(default_factory=dict)
    seconds: float = 0.0
    raw_samples: Optional[dict] = None  # the harness's own per-item records (eval.log_samples)


@contextmanager
def preserved_state(model: Any = None):
    """The random generators and the model's train/eval mode, as they were before."""
    import numpy as np
    import torch

    states = (
        random.getstate(),
        np.random.get_state(),
        torch.get_rng_state(),
        torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    )
    training = bool(getattr(model, "training", False))
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])
        if model is not None and training:
            model.train()


def _metric_name(key: str) -> Optional[tuple[str, str, str, str]]:
    """``acc,none`` -> (acc, value, acc, none); ``exact_match_stderr,strip`` -> (exact_match_strip, stderr,
    exact_match, strip): the name logged, the part, the harness's metric and filter; other keys -> None."""
    name, _, filt = key.partition(",")
    if not filt or name == "alias":
        return None
    if name.endswith("_stderr"):
        name, part = name[: -len("_stderr")], "stderr"
    else:
        part = "value"
    return (name if filt == "none" else f"{name}_{filt}"), part, name, filt


def _number(value: Any) -> Optional[float]:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def parse_results(output: dict, names: list[str]) -> Evaluation:
    """The harness's output as scores with their standard errors and per-item values (for paired intervals); only
    fraction-valued metrics (accuracy, exact match: in [0, 1]), what a gain in points and a stored result are."""
    scores: dict[str, dict] = {}
    samples: dict[str, dict] = {}
    origin: dict = {}
    for task, metrics in (output.get("results") or {}).items():
        if task not in names:
            continue
        for key, value in metrics.items():
            parsed, number = _metric_name(key), _number(value)
            if parsed is None or number is None:
                continue
            if not 0.0 <= number <= 1.0:  # gains are points of a fraction; a stored result holds fractions
                log.warning("benchmark %s %s = %s is not a fraction in [0, 1]; not reported", task, key, value)
                continue
            scores.setdefault(task, {}).setdefault(parsed[0], {})[parsed[1]] = _number(value)
            origin[(task, parsed[0])] = parsed[2:]
    scores = {
        task: kept
        for task, metrics in scores.items()
        if (kept := {m: score for m, score in metrics.items() if "value" in score})
    }  # a stderr alone: none
    for task, items in (output.get("samples") or {}).items():
        for metric in scores.get(task, {}):
            name, filt = origin[(task, metric)]
            ordered = sorted((s for s in items if s.get("filter", filt) == filt), key=lambda s: int(s.get("doc_id", 0)))
            values = [_number(s.get(name)) for s in ordered]
            if values and all(v is not None for v in values):
                samples.setdefault(task, {})[metric] = values
    return Evaluation(scores=scores, samples=samples)


@contextmanager
def _no_probes_of_the_machine(harness_version: str):
    """lm_eval ends every evaluation by probing the machine with child processes, and a checkpoint's evaluation
    runs inside the training job:

    - ``git describe``, its stderr on ours: outside a checkout (every job's working directory) that printed
      "fatal: not a git repository" into the job's log. The hash is read instead the way lm_eval itself falls
      back to when git is missing (``.git``'s files, silently: None outside a checkout).
    - ``torch.utils.collect_env`` (``pip list`` twice, ``lscpu``, ``nvidia-smi``...) for a ``pretty_env_info``
      text nothing here reads: about 0.45 s of wall and CPU per evaluation on the development machine, a sixth
      of one checkpoint's evaluation of the tiny model. The versions that matter are recorded without it."""
    import lm_eval.evaluator as evaluator
    from lm_eval.loggers.utils import get_commit_from_path

    def versions_only(results: dict) -> None:
        import torch
        import transformers

        results.update(
            pretty_env_info=f"torch {torch.__version__} (collect_env not run by the orchestrator)",
            transformers_version=transformers.__version__,
            lm_eval_version=harness_version,
            upper_git_hash=None,
        )

    saved = evaluator.get_git_commit_hash, evaluator.add_env_info
    evaluator.get_git_commit_hash = lambda: get_commit_from_path(os.getcwd())
    evaluator.add_env_info = versions_only
    try:
        yield
    finally:
        evaluator.get_git_commit_hash, evaluator.add_env_info = saved


def run(
    task_set: Any,
    eval_cfg: Any,
    *,
    model: Any = None,
    tokenizer: Any = None,
    model_args: Optional[dict] = None,
    keep_samples: bool = False,
) -> Evaluation:
    """Evaluate ``model`` (in memory, with ``tokenizer``) or the ``model_args`` of the harness's ``hf`` model."""
    import lm_eval

    started = time.monotonic()
    seed = int(eval_cfg.seed)
    common = dict(
        tasks=list(task_set.specs),
        task_manager=task_set.manager,
        num_fewshot=eval_cfg.num_fewshot,
        limit=eval_cfg.limit,
        batch_size=int(eval_cfg.batch_size),
        log_samples=True,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
        bootstrap_iters=1000,
    )
    from orchestrator.core.logsetup import library_output_to_file

    # its progress bars (stderr) to the job's log file with its logging (core.logsetup): the console gets one line
    with preserved_state(model), _no_probes_of_the_machine(task_set.harness_version), library_output_to_file():
        if model is not None:
            from lm_eval.models.huggingface import HFLM

            lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=int(eval_cfg.batch_size))
            output = lm_eval.simple_evaluate(model=lm, **common)
        else:
            output = lm_eval.simple_evaluate(model="hf", model_args=model_args, **common)
    result = parse_results(output or {}, task_set.names)
    result.seconds = time.monotonic() - started
    if keep_samples:
        result.raw_samples = output.get("samples")
    log.info(
        "benchmark evaluation took %.2fs: %s",
        result.seconds,
        {t: {m: round(v.get("value", float("nan")), 4) for m, v in ms.items()} for t, ms in result.scores.items()},
    )
    return result
