"""Every float key of the config schema holds a finite number, in its range: checked at launch (exit 4).

OmegaConf parses ``nan`` and ``inf`` into a float field, and a comparison with NaN is always false,
so ``budget.max_usd=nan`` passed every ``value <= 0`` check and switched the cap off. The schema's
float fields are found by walking the dataclasses the config was composed against (the recipe's own
schema and each ``data.mix`` source included), not listed by hand, so a new float key is covered.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Iterator, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

from orchestrator.core.errors import ConfigError

# (low, low included, high, high included, an example of a good value); None: unbounded on that side.
# Keys whose range another launch check already reports (budget.max_usd, compute.restart_seconds...)
# are not repeated here: this table covers the rest.
RANGES = {
    "recipe.lora_dropout": (0.0, True, 1.0, False, "0.05"),
    "recipe.dpo_beta": (0.0, False, None, False, "0.1"),
    "recipe.temperature": (0.0, False, None, False, "1.0 (GRPO's sampling temperature)"),
    "data.eval_fraction": (0.0, True, 1.0, False, "0.1"),
    "train.learning_rate": (0.0, True, None, False, "5e-3"),
    "train.weight_decay": (0.0, True, None, False, "0.0"),
    "train.max_grad_norm": (0.0, True, None, False, "1.0 (0: off)"),
    "compute.price_per_hour": (0.0, True, None, False, "2.5 (USD per GPU-hour), or null for the catalog's"),
    "compute.memory_gb": (0.0, False, None, False, "80, or null for the catalog's"),
    "budget.alert_thresholds": (0.0, False, 1.0, True, "[0.5,0.8,1.0] (fractions of budget.max_usd)"),
}


def _float_hint(hint: Any) -> str | None:
    """'float' for ``float``/``Optional[float]``, 'list' for ``list[float]``, 'node' for a schema, else None."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return _float_hint(args[0])  # Optional[X] is X where it is set (an optional list of weights too)
    if hint is float:
        return "float"
    if typing.get_origin(hint) is list and args:
        inner = _float_hint(args[0])
        return "list" if inner == "float" else ("nodes" if inner == "node" else None)
    if dataclasses.is_dataclass(hint):
        return "node"
    return None


def float_values(node: DictConfig, path: str = "") -> Iterator[tuple[str, str, float]]:
    """(the key as written, its schema path, value) for every float in ``node``, by its schema's type hints."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        kind, key = _float_hint(hints[f.name]), f"{path}{f.name}"
        value = node.get(f.name)
        if value is None or kind is None:
            continue
        if kind == "float":
            yield key, key, value
        elif kind == "node":
            yield from float_values(value, f"{key}.")
        elif isinstance(value, ListConfig):
            for i, item in enumerate(value):
                if kind == "list" and item is not None:
                    yield f"{key}[{i}]", key, item
                elif kind == "nodes" and isinstance(item, DictConfig):
                    for written, schema_key, number in float_values(item, f"{key}[{i}]."):
                        yield written, f"{key}.{schema_key.rpartition('.')[2]}", number


def check_finite(cfg: DictConfig) -> None:
    """Refuse NaN and infinity in any float key (reported first and alone: the other checks compare them)."""
    bad = [f"{key}={value}" for key, _, value in float_values(cfg) if not math.isfinite(value)]
    if bad:
        raise ConfigError(
            f"{', '.join(bad)}: {'these keys take' if len(bad) > 1 else 'this key takes'} a finite number "
            "(a NaN or an infinity compares false with every limit, so a cap or a price would silently "
            "stop counting). Give a number, or null where the key may be unset."
        )


def check_ranges(cfg: DictConfig) -> None:
    """Each float key with a range in ``RANGES`` is inside it; one ConfigError names every key outside."""
    outside: dict[str, list[str]] = {}
    for key, schema_key, value in float_values(cfg):
        if schema_key in RANGES and not _inside(value, *RANGES[schema_key][:4]):
            outside.setdefault(schema_key, []).append(f"{key}={value:g}")
    problems = []
    for schema_key, written in outside.items():
        low, low_in, high, high_in, example = RANGES[schema_key]
        problems.append(
            f"{', '.join(written)}: must be {_describe(low, low_in, high, high_in)}; set e.g. {schema_key}={example}"
        )
    if problems:
        raise ConfigError(". ".join(problems) + ".")


def _inside(value: float, low: Optional[float], low_in: bool, high: Optional[float], high_in: bool) -> bool:
    above = low is None or value > low or (low_in and value == low)
    below = high is None or value < high or (high_in and value == high)
    return above and below


def _describe(low: Optional[float], low_in: bool, high: Optional[float], high_in: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"at least {low:g}" if low_in else f"more than {low:g}")
    if high is not None:
        parts.append(f"at most {high:g}" if high_in else f"less than {high:g}")
    return " and ".join(parts)


def check_options(args: Any, ranges: dict[str, tuple[Any, ...]]) -> None:
    """A command line's number options: every float finite, each one in ``ranges`` inside its range.

    ``ranges`` maps an attribute of ``args`` to (low, low included, high, high included); raises
    ValueError naming the option (``--job-hours``) and what it takes.
    """
    for name, value in vars(args).items():
        option = f"--{name.replace('_', '-')}"
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{option} {value}: give a finite number.")
        if name in ranges and value is not None and not _inside(value, *ranges[name]):
            raise ValueError(
                f"{option} {value:g} must be {_describe(*ranges[name])}; give {option} a value in that range."
            )
