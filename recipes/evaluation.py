"""Held-out evaluation shared by the recipes: the quality metric, and the Trainer settings and callbacks for it.

The Trainer evaluates (``eval_strategy="steps"`` every ``train.eval_steps``, ``eval_on_start`` for the
"before training" value, once more at the end); :class:`QualityCallback` adds what the Trainer does
not compute to each evaluation's logs, in place, before the orchestrator's callback sends them to
MLflow and before ``metric_for_best_model`` and ``EarlyStoppingCallback`` read them:

* every recipe: ``eval_perplexity`` (exp of ``eval_loss``);
* DPO: ``eval_reward_accuracy`` and ``eval_reward_margin`` (TRL's ``eval_rewards/accuracies`` and
  ``eval_rewards/margins`` on the held-out pairs);
* a generation metric, ``eval_accuracy``, chosen by ``recipe.eval_metric``: the share of held-out
  prompts whose greedy generation matches the reference answer (``exact_match``: the whole answer,
  whitespace normalised; ``contains``: the answer appears in the generation; ``first_number``: the
  first number or word, the built-in arithmetic task's matcher; ``auto``: ``first_number`` on
  ``data=synthetic``, ``exact_match`` on the user's data; ``none``: no generation).

The quality metric (early stopping, the best checkpoint, USD per quality point) is ``eval_accuracy``
for SFT and QLoRA (``eval_loss`` with ``recipe.eval_metric=none``) and ``eval_reward_accuracy`` for DPO.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Optional

from transformers import TrainerCallback

from orchestrator.core import ranks as distributed

MATCHERS = ("auto", "exact_match", "contains", "none")
_NUMBER = re.compile(r"-?\d+")
MAX_LOG_PERPLEXITY = 50.0  # exp(50) is already meaningless; exp(710) overflows


@dataclass(frozen=True)
class QualityMetric:
    name: str  # the key in the evaluation's metrics
    greater_is_better: bool
    fraction: bool  # a share in [0, 1]: "points" are percentage points


def generation_matcher(cfg) -> str:
    """The generation metric ``recipe.eval_metric`` asks for, with ``auto`` resolved: first_number | exact_match |
    contains | none."""
    chosen = str(cfg.recipe.eval_metric)
    if chosen == "auto":
        return "first_number" if cfg.data.source == "synthetic" else "exact_match"
    return chosen


def quality_metric(cfg) -> QualityMetric:
    if cfg.recipe.name == "dpo":
        return QualityMetric("eval_reward_accuracy", True, True)
    if generation_matcher(cfg) == "none":
        return QualityMetric("eval_loss", False, False)
    return QualityMetric("eval_accuracy", True, True)


def _normalise(text: str) -> str:
    return " ".join(text.split())


def _first_answer(text: str) -> str:
    m = _NUMBER.search(text)
    if m:
        return m.group(0)
    words = text.strip().split()
    return words[0] if words else ""


def matches(kind: str, generated: str, answer: str) -> bool:
    """Whether a generation counts as right under matcher ``kind``."""
    if kind == "exact_match":
        return _normalise(generated) == _normalise(answer)
    if kind == "contains":
        want = _normalise(answer)
        return bool(want) and want in _normalise(generated)
    if kind == "first_number":
        return _first_answer(generated) == _first_answer(answer)
    raise ValueError(f"unknown matcher {kind!r}")


def eval_prompts(eval_dataset, tokenizer) -> tuple[list[str], list[str]]:
    """Prompts and reference answers from a held-out split of any supported format."""
    prompts, answers = [], []
    for row in eval_dataset:
        if "messages" in row:
            msgs = row["messages"]
            prompts.append(tokenizer.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True))
            answers.append(msgs[-1]["content"])
        else:
            prompt = row["prompt"]
            prompts.append(
                prompt
                if isinstance(prompt, str)
                else tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            )
            ans = row.get("completion", row.get("chosen"))
            answers.append(ans if isinstance(ans, str) else ans[-1]["content"])
    return prompts, answers


def accuracy(trainer, cfg, eval_dataset, prompts_answers=None) -> float:
    """A recipe's generation metric alone (``recipe.eval_metric``; the first-number matcher when it is none) on
    ``eval_dataset``'s prompts and answers (``prompts_answers``: how the recipe reads them, else ``eval_prompts``)."""
    prompts, answers = (
        prompts_answers(eval_dataset)
        if prompts_answers is not None
        else eval_prompts(eval_dataset, trainer.processing_class)
    )
    matcher = generation_matcher(cfg)
    return generation_accuracy(
        trainer.model,
        trainer.processing_class,
        prompts,
        answers,
        cfg.recipe.eval_generate_max_new_tokens,
        matcher="first_number" if matcher == "none" else matcher,
    )


def generation_accuracy(
    model,
    tokenizer,
    prompts: list[str],
    answers: list[str],
    max_new_tokens: int = 8,
    batch_size: int = 32,
    matcher: str = "first_number",
) -> float:
    """The share of greedy generations that ``matcher`` counts as the reference answer."""
    import torch

    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    correct = 0
    device = next(p for p in model.parameters()).device
    try:
        for i in range(0, len(prompts), batch_size):
            batch = prompts[i : i + batch_size]
            enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            with torch.no_grad():
                out = model.generate(
                    **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
                )
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            correct += sum(matches(matcher, text, want) for text, want in zip(texts, answers[i : i + batch_size]))
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return correct / max(1, len(prompts))


def on_benchmark(cfg) -> bool:
    """Whether early stopping and ``checkpoint.final=best`` select on a benchmark metric
    (``train.early_stopping_metric=bench/<task>/<metric>``) instead of the held-out quality metric."""
    return str(cfg.train.early_stopping_metric or "").startswith("bench/")


def quality_args(cfg) -> dict:
    """TrainingArguments for evaluation during training (``train.eval_steps``) and early stopping.

    ``prediction_loss_only``: no metric needs the logits, and gathering them over the held-out split
    would hold eval examples x length x vocabulary floats in memory. The early-stopping counter lives
    in ``EarlyStoppingCallback``'s state, which the Trainer writes into ``trainer_state.json``; it comes
    back on resume only with ``restore_callback_states_from_checkpoint``.
    """
    t = cfg.train
    kw: dict = {"prediction_loss_only": True}
    if int(t.eval_steps) > 0:
        kw.update(eval_strategy="steps", eval_steps=int(t.eval_steps))
        if not on_benchmark(cfg):  # else the benchmark watch selects (orchestrator.evaluation.selection)
            metric = quality_metric(cfg)
            kw.update(metric_for_best_model=metric.name, greater_is_better=metric.greater_is_better)
    if int(t.early_stopping_patience) > 0 and not on_benchmark(cfg):
        kw["restore_callback_states_from_checkpoint"] = True
    return kw


def with_quality_callbacks(cfg, callbacks: list, tokenizer, eval_dataset) -> list:
    """The recipe's callbacks around the orchestrator's: the quality metric first (it completes the
    evaluation's logs the others read), early stopping last."""
    from transformers import EarlyStoppingCallback

    out = [QualityCallback(cfg, tokenizer, eval_dataset), *callbacks]
    if int(cfg.train.early_stopping_patience) > 0 and not on_benchmark(cfg):
        out.append(
            EarlyStoppingCallback(
                early_stopping_patience=int(cfg.train.early_stopping_patience),
                early_stopping_threshold=float(cfg.train.early_stopping_threshold),
            )
        )
    return out


class QualityCallback(TrainerCallback):
    """Completes each evaluation's logs (perplexity, DPO's reward metrics, the generation metric), in place."""

    def __init__(self, cfg, tokenizer, eval_dataset, *, generate: Optional[Callable] = None):
        self.matcher = generation_matcher(cfg)
        self.max_new_tokens = int(cfg.recipe.eval_generate_max_new_tokens)
        self.tokenizer = tokenizer
        self.prompts, self.answers = (
            eval_prompts(eval_dataset, tokenizer) if eval_dataset is not None and self.matcher != "none" else ([], [])
        )
        self.generate = generate or generation_accuracy

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if not logs or "eval_loss" not in logs:
            return
        added = quality_metrics(logs)
        if self.prompts and model is not None:
            value = self.generate(
                model, self.tokenizer, self.prompts, self.answers, self.max_new_tokens, matcher=self.matcher
            )
            # every rank generated the same; rank 0's value decides, so early stopping stops every rank together
            added["eval_accuracy"] = float(distributed.broadcast(value))
        logs.update(added)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(added)  # trainer_state.json keeps the whole evaluation


def quality_metrics(logs: dict) -> dict:
    """Perplexity from ``eval_loss``; DPO's reward accuracy and margin under their own names."""
    out = {"eval_perplexity": math.exp(min(float(logs["eval_loss"]), MAX_LOG_PERPLEXITY))}
    for theirs, ours in (
        ("eval_rewards/accuracies", "eval_reward_accuracy"),
        ("eval_rewards/margins", "eval_reward_margin"),
    ):
        if theirs in logs:
            out[ours] = float(logs[theirs])
    return out


def evaluate(trainer, cfg) -> dict:
    """The end-of-training evaluation on the trainer's held-out split (prepared once, at build): the same
    metrics as during training, through the same callback."""
    raw = trainer.evaluate()
    keep = ("eval_loss", "eval_perplexity", "eval_accuracy", "eval_reward_accuracy", "eval_reward_margin")
    return {k: float(raw[k]) for k in keep if k in raw}
