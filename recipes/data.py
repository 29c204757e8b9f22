"""Datasets for the recipes: a built-in synthetic task, a local JSONL file, a hub dataset, or a weighted mix.

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
from typing import Any

from orchestrator.core.choices import MixSource, choices
from orchestrator.core.errors import DataError

COLUMNS = {
    "sft": ({"prompt", "completion"}, {"messages"}),  # either form
    "dpo": ({"prompt", "chosen", "rejected"},),
    "grpo": ({"prompt"},),  # other columns reach the reward functions as keyword arguments (answer=...)
}


def required_columns(recipe_name: str) -> tuple[set[str], ...]:
    return COLUMNS[recipe_name if recipe_name in ("dpo", "grpo") else "sft"]


def _problem(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    if rng.random() < 0.5:
        return f"{a} + {b} =", a + b
    a, b = max(a, b), min(a, b)
    return f"{a} - {b} =", a - b


def synthetic_rows(kind: str, n: int, seed: int) -> list[dict]:
    """``kind`` 'sft' -> prompt/completion rows; 'dpo' -> prompt/chosen/rejected rows; 'grpo' -> prompt/answer rows."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, answer = _problem(rng)
        prompt = f"Q: {question}\nA:"
        if kind == "dpo":
            wrong = answer + rng.choice([-2, -1, 1, 2, 3])
            rows.append({"prompt": prompt, "chosen": f" {answer}", "rejected": f" {wrong}"})
        elif kind == "grpo":
            rows.append({"prompt": prompt, "answer": str(answer)})
        else:
            rows.append({"prompt": prompt, "completion": f" {answer}"})
    return rows


def tokenizer_training_text() -> list[str]:
    rows = synthetic_rows("sft", 2000, 0)
    return [r["prompt"] + r["completion"] for r in rows] + ["Q: A: user assistant system the a is of"]


def _read_jsonl(path: str, where: str = "data") -> list[dict]:
    """The rows of a JSONL file, or of every JSONL/Parquet file an ``s3://`` object, folder or glob names; the key
    ``<where>.path`` names it (``data``, ``data.mix[i]``)."""
    from orchestrator.storage.inputs import is_remote, local_files

    if is_remote(path):
        rows = [row for f in local_files(path) for row in _read_file(f, f"{where}.path={path!r} ({f.name})")]
    else:
        p = Path(path).expanduser()
        if not p.is_file():
            fix = (
                "or use data=synthetic for the built-in task"
                if where == "data"
                else "or drop the entry from data.mix (or give it source: synthetic)"
            )
            raise DataError(
                f"{where}.path={path!r}: no such file. Point {where}.path at an existing JSONL file "
                f"(one JSON object per line) or an s3:// object, {fix}."
            )
        rows = _read_file(p, f"{where}.path={path!r}")
    if not rows:
        raise DataError(f"{where}.path={path!r} holds no rows. Add training examples, one JSON object per line.")
    return rows


def _read_file(p: Path, where: str) -> list[dict]:
    """One JSONL file's rows, or a Parquet file's (``.parquet``)."""
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(p).to_pylist()
        except Exception as err:  # noqa: BLE001 - pyarrow's errors vary; the fix is the same
            raise DataError(f"{where}: not a readable Parquet file ({err}). Fix or replace the file.") from None
    rows = []
    with p.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DataError(f"{where}, line {lineno}: not valid JSON ({err.msg}). Fix that line.") from None
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
    """Validate a JSONL file up front: it exists, parses, and has the recipe's columns. Raises DataError.

    An ``s3://`` path is read by the worker, not here (``orchestrator.app.checks`` checks that it is listed)."""
    from orchestrator.storage.inputs import is_remote

    if is_remote(path):
        return
    rows = _read_jsonl(path)
    _check_columns(set().union(*(r.keys() for r in rows)), recipe_name, f"data.path={path!r}")


def load_datasets(data_cfg, recipe_name: str):
    """Return (train, eval) ``datasets.Dataset`` for the recipe, validated.

    Raises DataError naming the problem and the fix.
    """
    from datasets import load_dataset

    if data_cfg.source == "mix":
        ds = mixed_dataset(data_cfg, recipe_name)
    elif data_cfg.source in ("synthetic", "jsonl", "hub"):
        ds = _load_source(data_cfg, recipe_name)
        if data_cfg.source == "hub" and data_cfg.eval_split:
            ev = load_dataset(data_cfg.path, split=data_cfg.eval_split, revision=data_cfg.revision)
            return ds, ev.select(range(min(len(ev), data_cfg.max_eval_examples)))
    else:
        raise DataError(f"data.source={data_cfg.source!r} is unknown; choose synthetic, jsonl, hub or mix.")
    n_eval = max(1, min(data_cfg.max_eval_examples, int(len(ds) * data_cfg.eval_fraction)))
    if len(ds) < 2:
        raise DataError("the dataset has fewer than 2 rows; a held-out split needs at least one of each.")
    split = ds.train_test_split(test_size=n_eval, seed=data_cfg.seed, shuffle=True)
    return split["train"], split["test"]


def _load_source(src, recipe_name: str, where: str = "data"):
    """One source (``data`` itself or an entry of ``data.mix``) as a validated ``datasets.Dataset``."""
    from datasets import Dataset

    kind = recipe_name if recipe_name in ("dpo", "grpo") else "sft"
    if src.source == "synthetic":
        return Dataset.from_list(synthetic_rows(kind, src.num_examples, src.seed))
    if src.source == "jsonl":
        rows = _read_jsonl(src.path, where)
        _check_columns(set().union(*(r.keys() for r in rows)), recipe_name, f"{where}.path={src.path!r}")
        return Dataset.from_list(rows)
    if src.source == "hub":
        from datasets import load_dataset

        try:
            ds = load_dataset(src.path, split=src.split, revision=src.revision)
        except Exception as err:  # the hub's errors vary; the fix is the same
            raise DataError(
                f"{where}.path={src.path!r}, split {src.split!r}, revision {src.revision!r} could not be loaded from "
                f"the hub ({err}). Check the dataset id, split and revision, your network and HF_TOKEN, or use a "
                "local JSONL file."
            ) from None
        _check_columns(set(ds.column_names), recipe_name, f"hub dataset {src.path!r}")
        return ds
    raise DataError(f"{where}.source={src.source!r} is unknown; choose synthetic, jsonl or hub.")


MIX_SOURCES = choices(MixSource)


def check_mix(data_cfg, recipe_name: str, readable=lambda path: True) -> None:
    """``data.mix`` at launch: present exactly when data.source=mix, each source usable. Raises DataError.

    A JSONL source is read to check it where ``readable(path)`` (not an ``s3://`` object, which the worker
    reads, nor a path inside a Kubernetes image)."""
    mix = list(data_cfg.mix or [])
    if data_cfg.source != "mix":
        if mix:
            raise DataError(
                f"data.mix lists {len(mix)} sources but data.source={data_cfg.source}; set "
                "data.source=mix (or data=mix) to train on the mix, or drop data.mix."
            )
        return
    if len(mix) < 2:
        raise DataError(
            "data.source=mix needs at least two sources in data.mix, e.g. "
            "data.mix='[{path: /data/a.jsonl, weight: 3}, {path: /data/b.jsonl, weight: 1}]'."
        )
    for i, src in enumerate(mix):
        where = f"data.mix[{i}]"
        if src.source not in MIX_SOURCES:
            raise DataError(f"{where}.source={src.source!r}; choose one of: {', '.join(MIX_SOURCES)}.")
        if not src.weight > 0:
            raise DataError(f"{where}.weight={src.weight} must be more than 0 (its share is weight / sum of weights).")
        if src.source in ("jsonl", "hub") and not src.path:
            raise DataError(f"{where} (source {src.source}) needs a path: a JSONL file or a hub dataset id.")
        if src.source == "jsonl" and not str(src.path).startswith("s3://") and readable(str(src.path)):
            if not Path(src.path).expanduser().is_absolute():
                raise DataError(
                    f"{where}.path={src.path!r} is relative; every attempt (maybe on another machine "
                    "or in another folder) must find it. Give an absolute path."
                )
            rows = _read_jsonl(src.path, where)
            _check_columns(set().union(*(r.keys() for r in rows)), recipe_name, f"{where}.path={src.path!r}")


def mixed_dataset(data_cfg, recipe_name: str):
    """The sources of ``data.mix`` interleaved into one dataset: each row drawn from source i with probability
    weight_i / sum of weights, by ``datasets.interleave_datasets`` seeded with ``data.seed`` (the same rows in the
    same order on every attempt); it stops when the first source runs out, so no row repeats."""
    from datasets import interleave_datasets

    parts = [_load_source(src, recipe_name, f"data.mix[{i}]") for i, src in enumerate(data_cfg.mix)]
    columns = [sorted(p.column_names) for p in parts]
    if any(c != columns[0] for c in columns):
        listing = "; ".join(f"data.mix[{i}]: {c}" for i, c in enumerate(columns))
        raise DataError(
            f"the sources of data.mix have different columns ({listing}). Give every source the same "
            "form (prompt/completion, messages, or prompt/chosen/rejected)."
        )
    parts = [p.cast(parts[0].features) for p in parts]
    total = float(sum(src.weight for src in data_cfg.mix))
    return interleave_datasets(
        parts,
        probabilities=[src.weight / total for src in data_cfg.mix],
        seed=int(data_cfg.seed),
        stopping_strategy="first_exhausted",
    )


def trl_templates_dir() -> Path:
    """TRL's shipped templates, found without importing TRL (seconds at launch)."""
    import importlib.util

    spec: Any = importlib.util.find_spec("trl")  # None: the AttributeError of a missing TRL
    return Path(next(iter(spec.submodule_search_locations))).resolve() / "chat_templates"


def named_chat_templates() -> list[str]:
    """The chat templates TRL ships, by name (the file name without .jinja)."""
    return sorted(p.stem for p in trl_templates_dir().glob("*.jinja"))


def chat_template_text(value) -> str | None:
    """The Jinja text of ``data.chat_template``: None (the tokenizer's own), a .jinja/.j2 file, or a TRL name."""
    if value is None:
        return None
    value = str(value)
    if value.startswith("s3://"):
        from orchestrator.storage.inputs import local_files

        text = local_files(value)[0].read_text(encoding="utf-8")  # downloaded once per attempt, verified
        check_jinja(text, value)
        return text
    if value.endswith((".jinja", ".j2")) or "/" in value:
        path = Path(value).expanduser()
        if not path.is_file():
            raise DataError(
                f"data.chat_template={value!r}: no such file. Point it at a Jinja template file "
                f"(.jinja), or name one TRL ships (e.g. {', '.join(named_chat_templates()[:4])})."
            )
        return path.read_text(encoding="utf-8")
    path = trl_templates_dir() / f"{value}.jinja"
    if not path.is_file():
        raise DataError(
            f"data.chat_template={value!r} is not a template TRL ships; choose one of: "
            f"{', '.join(named_chat_templates())}, give a .jinja file, or drop the key for the "
            "tokenizer's own."
        )
    return path.read_text(encoding="utf-8")


def check_chat_template(value) -> None:
    """Launch check: the named template exists, or the file does and is a valid Jinja template that renders a
    sample conversation in transformers' sandbox (the one ``apply_chat_template`` renders in) without tripping it.
    An ``s3://`` template is checked by the worker, which reads it (``orchestrator.app.checks`` checks it is listed)."""
    if str(value).startswith("s3://"):
        return
    text = chat_template_text(value)
    if text is not None:
        check_jinja(text, value)


def check_jinja(text: str, value) -> None:
    """``text`` compiles as a chat template in transformers' own environment (its tags, such as ``{% generation %}``
    in TRL's *_training templates, and its sandbox) and renders a sample conversation there. Raises DataError."""
    import jinja2
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:  # transformers' own environment (its loop controls, filters and sandbox), as apply_chat_template compiles
        _compile_jinja_template(text)
    except jinja2.TemplateSyntaxError as err:
        raise DataError(
            f"data.chat_template={value!r} is not valid Jinja (line {err.lineno}: {err.message}). Fix the template."
        ) from None
    _check_sandbox(value, text)


SAMPLE_CONVERSATION = [
    {"role": "system", "content": "You answer."},
    {"role": "user", "content": "2 + 2 ="},
    {"role": "assistant", "content": "4"},
]


def _check_sandbox(value, text: str) -> None:
    """Render ``text`` as training and generation do; an access the sandbox forbids is a DataError. Other errors
    (a template's own ``raise_exception`` for this sample, say) are the data's business, seen when it renders."""
    from jinja2.exceptions import SecurityError
    from transformers.utils.chat_template_utils import render_jinja_template

    for generation in (False, True):
        conversation = SAMPLE_CONVERSATION[:-1] if generation else SAMPLE_CONVERSATION
        try:
            render_jinja_template([conversation], chat_template=text, add_generation_prompt=generation)
        except SecurityError as err:
            value = str(value)
            where = (
                str(Path(value).expanduser().resolve())
                if value.endswith((".jinja", ".j2")) or "/" in value
                else str(trl_templates_dir() / f"{value}.jinja")
            )
            raise DataError(
                f"data.chat_template={value!r} ({where}) is refused by Jinja's sandbox: "
                f"{str(err).rstrip('.')}. A chat template may only read the messages and format "
                "them; remove that expression from the template."
            ) from None
        except Exception:  # noqa: BLE001 - not the sandbox: the template's own checks, rendered again on the data
            continue


def fingerprint(dataset, data_cfg=None) -> str:
    """SHA-256 over the dataset's rows in order: a changed dataset changes the trajectory.

    With ``data_cfg``, the text of its chat template too: a template file edited between attempts
    renders other tokens from the same rows.
    """
    h = hashlib.sha256()
    template = chat_template_text(data_cfg.chat_template) if data_cfg is not None else None
    if template is not None:
        h.update(b"chat_template\0" + template.encode() + b"\0")
    for row in dataset:
        h.update(json.dumps(row, sort_keys=True, default=str).encode())
    return h.hexdigest()
