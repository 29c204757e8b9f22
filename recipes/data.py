"""Datasets for the recipes: a built-in synthetic task, a local JSONL file, or a hub dataset.

The synthetic task is single-digit arithmetic ("Q: 3 + 5 =" -> "8"), generated
from ``data.seed``. For preference training the right answer is chosen and a
wrong one rejected. It is small enough for the tiny model to learn in a minute
on a CPU, so "accuracy after training is higher" is a real check.
"""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from orchestrator.errors import DataError

COLUMNS = {
    "sft": ({"prompt", "completion"}, {"messages"}),  # either form
    "dpo": ({"prompt", "chosen", "rejected"},),
}


def required_columns(recipe_name: str) -> tuple[set[str], ...]:
    return COLUMNS["dpo" if recipe_name == "dpo" else "sft"]


def _problem(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    if rng.random() < 0.5:
        return f"{a} + {b} =", a + b
    a, b = max(a, b), min(a, b)
    return f"{a} - {b} =", a - b


def synthetic_rows(kind: str, n: int, seed: int) -> list[dict]:
    """``kind`` 'sft' -> prompt/completion rows; 'dpo' -> prompt/chosen/rejected rows."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, answer = _problem(rng)
        prompt = f"Q: {question}\nA:"
        if kind == "dpo":
            wrong = answer + rng.choice([-2, -1, 1, 2, 3])
            rows.append({"prompt": prompt, "chosen": f" {answer}", "rejected": f" {wrong}"})
        else:
            rows.append({"prompt": prompt, "completion": f" {answer}"})
    return rows


def tokenizer_training_text() -> list[str]:
    rows = synthetic_rows("sft", 2000, 0)
    return [r["prompt"] + r["completion"] for r in rows] + ["Q: A: user assistant system the a is of"]


def _read_jsonl(path: str) -> list[dict]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(
            f"data.path={path!r}: no such file. Point data.path at an existing JSONL file "
            "(one JSON object per line), or use data=synthetic for the built-in task."
        )
    rows = []
    with p.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DataError(f"data.path={path!r}, line {lineno}: not valid JSON ({err.msg}). Fix that line.") from None
    if not rows:
        raise DataError(f"data.path={path!r} holds no rows. Add training examples, one JSON object per line.")
    return rows


def _check_columns(rows_columns: set[str], recipe_name: str, where: str) -> None:
    options = required_columns(recipe_name)
    if any(opt <= rows_columns for opt in options):
        return
    wanted = " or ".join("{" + ", ".join(sorted(o)) + "}" for o in options)
    raise DataError(
        f"{where} has columns {sorted(rows_columns)}, but recipe {recipe_name!r} needs {wanted}. "
        "Rename the columns, or choose the recipe that matches the data (sft: prompt/completion or messages; "
        "dpo: prompt/chosen/rejected)."
    )


def check_jsonl(path: str, recipe_name: str) -> None:
    """Validate a JSONL file up front: it exists, parses, and has the recipe's columns. Raises DataError."""
    rows = _read_jsonl(path)
    _check_columns(set().union(*(r.keys() for r in rows)), recipe_name, f"data.path={path!r}")


def load_datasets(data_cfg, recipe_name: str):
    """Return (train, eval) ``datasets.Dataset`` for the recipe, validated.

    Raises DataError naming the problem and the fix.
    """
    from datasets import Dataset

    kind = "dpo" if recipe_name == "dpo" else "sft"
    if data_cfg.source == "synthetic":
        rows = synthetic_rows(kind, data_cfg.num_examples, data_cfg.seed)
        ds = Dataset.from_list(rows)
    elif data_cfg.source == "jsonl":
        rows = _read_jsonl(data_cfg.path)
        columns = set().union(*(r.keys() for r in rows))
        _check_columns(columns, recipe_name, f"data.path={data_cfg.path!r}")
        ds = Dataset.from_list(rows)
    elif data_cfg.source == "hub":
        from datasets import load_dataset

        try:
            ds = load_dataset(data_cfg.path, split=data_cfg.split)
        except Exception as err:  # the hub's errors vary; the fix is the same
            raise DataError(
                f"data.path={data_cfg.path!r}, split {data_cfg.split!r} could not be loaded from the hub ({err}). "
                "Check the dataset id and split, your network and HF_TOKEN, or use data=jsonl data.path=FILE."
            ) from None
        _check_columns(set(ds.column_names), recipe_name, f"hub dataset {data_cfg.path!r}")
        if data_cfg.eval_split:
            ev = load_dataset(data_cfg.path, split=data_cfg.eval_split)
            return ds, ev.select(range(min(len(ev), data_cfg.max_eval_examples)))
    else:
        raise DataError(f"data.source={data_cfg.source!r} is unknown; choose synthetic, jsonl or hub.")
    n_eval = max(1, min(data_cfg.max_eval_examples, int(len(ds) * data_cfg.eval_fraction)))
    if len(ds) < 2:
        raise DataError("the dataset has fewer than 2 rows; a held-out split needs at least one of each.")
    split = ds.train_test_split(test_size=n_eval, seed=data_cfg.seed, shuffle=True)
    return split["train"], split["test"]


def fingerprint(dataset) -> str:
    """SHA-256 over the dataset's rows in order: a changed dataset changes the trajectory."""
    h = hashlib.sha256()
    for row in dataset:
        h.update(json.dumps(row, sort_keys=True, default=str).encode())
    return h.hexdigest()
