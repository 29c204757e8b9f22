"""Early stopping and ``checkpoint.final=best`` on a benchmark metric (``train.early_stopping_metric=
bench/<task>/<metric>``), deciding only beyond noise.

Over the evaluated checkpoints in step order (the base model is not a candidate):

- the **best** is the first evaluated checkpoint, replaced only by one whose gain over it is beyond noise (its
  95% interval above 0, paired over the same items where both hold per-item values, and more than
  ``train.early_stopping_threshold``): a later score higher within noise does not displace an earlier, cheaper one;
- an evaluation **counts toward the plateau** only when the data show it is no better than the best: the upper
  end of its gain's 95% interval is at most the threshold. One that is higher or lower within noise cannot say
  either way and starts the count again, so a small task whose scores move within their standard errors never
  stops a job;
- training **stops** after ``train.early_stopping_patience`` such evaluations in a row.

The state is a function of the stored results alone (``decide``): a resumed attempt replays them and reaches the
same best and count as an uninterrupted run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from orchestrator.evaluation.stats import Gain, gain
from orchestrator.records.bench_result import BenchResult

PREFIX = "bench/"


@dataclass(frozen=True)
class Selection:
    best_step: Optional[int] = None
    best_name: Optional[str] = None
    best_value: Optional[float] = None
    plateau: int = 0  # evaluations in a row shown (beyond noise) no better than the best
    last_gain: Optional[Gain] = None  # the last evaluation's gain over the best before it
    stop_reason: Optional[str] = None


def is_bench_metric(name: Optional[str]) -> bool:
    return bool(name) and str(name).startswith(PREFIX)


def split(name: str) -> tuple[str, str]:
    """``bench/<task>/<metric>`` -> (task, metric)."""
    task, _, metric = str(name)[len(PREFIX) :].rpartition("/")
    return task, metric


def decide(
    records: Iterable[BenchResult],
    name: str,
    *,
    patience: int,
    threshold: float,
    greater_is_better: bool = True,
    max_steps: Optional[int] = None,
) -> Selection:
    """The best checkpoint and the plateau count after ``records`` (checkpoint results, any order)."""
    task, metric = split(name)
    sign = 1.0 if greater_is_better else -1.0
    state, best = Selection(), None
    for record in sorted(records, key=lambda r: r.step):
        score, items = record.score(task, metric), record.items(task, metric)
        if score is None or record.step <= 0:
            continue
        if best is None:
            best, state = (score, items), Selection(record.step, record.checkpoint, score.value)
            continue
        g = gain(score.encode(), best[0].encode(), items, best[1])
        points, half = sign * g.points, g.half_width
        if points - half > 100 * threshold and points > 0:  # better beyond noise (and the threshold)
            best = (score, items)
            state = Selection(record.step, record.checkpoint, score.value, 0, g)
        elif points + half <= 100 * threshold:  # shown no better than the best
            state = Selection(state.best_step, state.best_name, state.best_value, state.plateau + 1, g)
        else:  # within noise: cannot tell
            state = Selection(state.best_step, state.best_name, state.best_value, 0, g)
        if patience > 0 and state.plateau >= patience and state.stop_reason is None:
            state = Selection(
                state.best_step,
                state.best_name,
                state.best_value,
                state.plateau,
                g,
                (
                    f"{name} has been no better than its best ({state.best_value:.4f}, step {state.best_step}) beyond "
                    f"noise for {patience} evaluations (the last: {g.points:+.1f}+-{g.half_width:.1f} points); training "
                    f"ended at step {record.step}" + (f" of {max_steps}" if max_steps else "")
                ),
            )
            break
    return state


def of_checkpoints(records: Iterable[BenchResult], name: str, train_cfg) -> Selection:
    """``decide`` over a job's checkpoint results (not the base's, at step 0, nor the final weights'), with the
    job's ``train.early_stopping_patience`` and ``_threshold``."""
    candidates = [r for r in records if r.step > 0 and r.checkpoint != "final"]
    return decide(
        candidates,
        name,
        patience=int(train_cfg.early_stopping_patience),
        threshold=float(train_cfg.early_stopping_threshold),
        max_steps=int(train_cfg.max_steps),
    )


def describe(state: Selection, name: str) -> str:
    """One line for the log after an evaluation: the best so far and why training goes on."""
    if state.best_step is None:
        return f"{name}: no evaluated checkpoint yet"
    text = f"{name}: best {state.best_value:.4f} at step {state.best_step}"
    if state.last_gain is not None:
        g = state.last_gain
        text += f"; the last evaluation {g.points:+.1f}+-{g.half_width:.1f} points against it"
        if state.plateau == 0 and g.points > g.half_width:
            text += " (better beyond noise: the new best)"
        elif state.plateau == 0:
            text += " (within noise: not counted toward a plateau)"
        elif state.plateau:
            text += f" (no better beyond noise: {state.plateau} in a row)"
    return text
