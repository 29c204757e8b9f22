"""The search space: Hydra-style sweep overrides (what the Optuna sweeper reads) as Optuna distributions.

``a=1,2`` and ``choice(...)``: a categorical; ``range(lo, hi[, step])``: its values as a categorical (ints)
or a stepped float; ``interval(lo, hi)``: a uniform float (``int(interval(lo, hi))``: an int, as Hydra casts it);
``tag(log, interval(...))``: log-uniform. The parsing itself is Hydra's (``compose.split_sweep_overrides``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from orchestrator.core.errors import ConfigError


@dataclass(frozen=True)
class SearchSpace:
    """``specs``: key -> the parsed tuple (stored in the sweep's state, compared on resume)."""

    specs: dict[str, tuple]

    @classmethod
    def from_specs(cls, specs: dict[str, Any]) -> "SearchSpace":
        out = {}
        for key, spec in sorted(specs.items()):
            spec = tuple(spec)
            _check(key, spec)
            out[key] = spec
        return cls(out)

    def to_json(self) -> dict[str, list]:
        return {key: list(spec) for key, spec in self.specs.items()}

    def distributions(self) -> dict[str, Any]:
        return {key: distribution(key, spec) for key, spec in self.specs.items()}

    def grid(self) -> dict[str, list]:
        """Every key's values (GridSampler's search space); ConfigError when one is an interval."""
        out = {}
        for key, spec in self.specs.items():
            if spec[0] == "interval":
                raise ConfigError(
                    f"{key}=interval({spec[1]},{spec[2]}) has no grid: sweep.sampler=grid (and -m alone) "
                    "needs finite values. Give them (a=1,2,3, choice(...), range(...)), or choose "
                    "sweep.sampler=random|tpe with sweep.n_trials."
                )
            out[key] = _values(spec)
        return out

    def grid_size(self) -> int:
        return math.prod(len(v) for v in self.grid().values())

    def representative(self) -> list[str]:
        """One override per key (its first value): composed at launch to check keys and types before any trial."""
        return [
            override(key, _values(spec)[0] if spec[0] != "interval" else spec[1]) for key, spec in self.specs.items()
        ]

    def difference(self, other: "SearchSpace") -> list[str]:
        """What changed from ``other`` (the stored space) to this one, one line per key."""
        lines = []
        for key in sorted(set(self.specs) | set(other.specs)):
            old, new = other.specs.get(key), self.specs.get(key)
            if old != new:
                lines.append(f"{key}: {_show(old)} -> {_show(new)}")
        return lines


def override(key: str, value: Any) -> str:
    """``key=value`` as a Hydra override that composes back to ``value``."""
    if isinstance(value, float):
        return f"{key}={value!r}"
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    return f"{key}={value}"


def in_domain(space, key: str, value: Any) -> bool:
    """Whether ``value`` is one the space gives ``key`` (a choice of its own type, or a number within its interval)."""
    spec = space.specs.get(key)
    if spec is None:
        return False
    if spec[0] != "interval":
        return any(type(value) is type(c) and value == c for c in _values(spec))
    _, low, high, _log = spec
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    if isinstance(low, int) and isinstance(high, int) and not isinstance(value, int):
        return False
    return low <= value <= high


def distribution(key: str, spec: tuple):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    kind = spec[0]
    if kind == "interval":
        _, low, high, log = spec
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log)
        return FloatDistribution(float(low), float(high), log=log)
    return CategoricalDistribution(_values(spec))


def _values(spec: tuple) -> list:
    if spec[0] == "choice":
        return list(spec[1])
    _, start, stop, step = spec
    n = max(0, math.ceil((stop - start) / step))
    values = [start + i * step for i in range(n)]
    return [round(v, 12) if isinstance(v, float) else v for v in values]


def _check(key: str, spec: tuple) -> None:
    kind = spec[0] if spec else None
    if kind == "choice" and spec[1:] and spec[1]:
        return
    if kind == "range" and len(spec) == 4 and spec[3] and _values(spec):
        return
    if kind == "interval" and len(spec) == 4 and _finite(spec[1], spec[2]) and spec[1] < spec[2]:
        if spec[3] and spec[1] <= 0:
            raise ConfigError(
                f"{key}: a log interval needs a positive low end, not {spec[1]}; "
                f"write tag(log, interval(1e-5,{spec[2]})) or drop the log tag."
            )
        return
    raise ConfigError(
        f"{key}: {_show(spec)} is an empty search space; give at least one value "
        "(a=1,2 | choice(...) | range(lo,hi) with lo < hi | interval(lo,hi) with lo < hi)."
    )


def _finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def _show(spec) -> str:
    if spec is None:
        return "(absent)"
    kind, *args = spec
    if kind == "choice":
        return "choice(" + ",".join(map(str, args[0])) + ")"
    if kind == "interval":
        inner = f"interval({args[0]},{args[1]})"
        return f"tag(log, {inner})" if args[2] else inner
    return f"range({args[0]},{args[1]},{args[2]})"
