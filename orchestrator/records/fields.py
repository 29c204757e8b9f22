"""Reading one field of a stored document: its type, finiteness and physical bounds, or one clear error.

Every document kept in the bucket is untrusted input (anyone who can write the bucket, a tool that dropped a key,
a truncated write). The records decode each into a type through these readers: a value of the wrong type, NaN,
infinity or past its physical bound raises ``CorruptRecord`` naming the document and the field, and a text meant
for a terminal keeps no control character (a host name carrying terminal escapes prints as ``?``).
"""

from __future__ import annotations

import math
import re
from typing import Any, Collection, Mapping, Optional

from orchestrator.core.errors import DataError

# The physical bounds shared by the records: a dollar figure above any budget, a step count past any job, a time
# outside 1970-2100 did not happen.
MAX_USD = 1e7
MAX_STEPS = 10**12
LATEST_TIME = 4102444800.0  # 2100-01-01, unix time
MAX_TEXT = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MISSING = object()


class CorruptRecord(DataError):
    """A document in the bucket that does not decode: ``where`` names it, ``problem`` says what is wrong.

    A DataError: a job whose own record is corrupt stops with exit 4 (a retry reads the same bytes) and is never
    requeued; a reader of another job's record skips that record with a warning, and its neighbours go on."""

    def __init__(self, where: str, problem: str):
        self.where, self.problem = where, problem
        super().__init__(
            f"{where} is corrupt: {problem}. It was written outside the orchestrator or damaged; "
            "move it aside (the orchestrator then starts that record afresh) or restore it from a copy."
        )


class Fields:
    """The fields of one stored object (a JSON object), read with their checks; errors name ``where``."""

    def __init__(self, doc: Any, where: str):
        if not isinstance(doc, Mapping):
            raise CorruptRecord(where, f"it is a JSON {type(doc).__name__}, not an object")
        self.doc, self.where = doc, where

    def fail(self, key: str, problem: str) -> CorruptRecord:
        return CorruptRecord(self.where, f"{key!r} {problem}")

    def _get(self, key: str, default: Any) -> Any:
        value = self.doc.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise self.fail(key, "is missing")
            return default
        return value

    def number(self, key: str, *, low: float = 0.0, high: float, default: Any = _MISSING) -> Any:
        """A finite float in [low, high] (ints accepted, bools not)."""
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"is {value!r}, not a number")
        if not math.isfinite(value) or not low <= value <= high:
            raise self.fail(key, f"is {value!r}, outside [{low:g}, {high:g}]")
        return float(value)

    def whole(self, key: str, *, low: int = 0, high: int = MAX_STEPS, default: Any = _MISSING) -> Any:
        """An int in [low, high] (a float with no fraction accepted, as JSON writers may give one)."""
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"is {value!r}, not a whole number")
        if not low <= value <= high:
            raise self.fail(key, f"is {value}, outside [{low}, {high}]")
        return value

    def time(self, key: str, default: Any = None) -> Optional[float]:
        """A unix time, or ``default`` when absent."""
        value: Optional[float] = self.number(key, high=LATEST_TIME, default=default)
        return value

    def usd(self, key: str, default: Any = 0.0) -> float:
        value: float = self.number(key, high=MAX_USD, default=default)
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"is {value!r}, not true or false")
        return value

    def text(self, key: str, default: Any = _MISSING, *, limit: int = MAX_TEXT) -> Any:
        """A string, its control characters shown as ``?`` (it may reach a terminal), at most ``limit`` long."""
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.fail(key, f"is {type(value).__name__}, not text")
        value = str(value)
        if len(value) > limit:
            raise self.fail(key, f"is {len(value)} characters long (at most {limit})")
        return _CONTROL.sub("?", value)

    def choice(self, key: str, choices: Collection[str], default: Any = _MISSING) -> Any:
        value = self.text(key, default)
        if value is not default and value not in choices:
            raise self.fail(key, f"is {value!r}, not one of: {', '.join(sorted(choices))}")
        return value

    def objects(self, key: str) -> list["Fields"]:
        """A list of objects (absent: empty), each to be read field by field."""
        value = self._get(key, [])
        if not isinstance(value, list):
            raise self.fail(key, f"is a JSON {type(value).__name__}, not a list")
        return [Fields(item, f"{self.where} {key}[{n}]") for n, item in enumerate(value)]

    def mapping(self, key: str) -> Mapping[Any, Any]:
        """A JSON object kept as it is (absent: empty); its own reader checks what it reads."""
        value = self._get(key, {})
        if not isinstance(value, Mapping):
            raise self.fail(key, f"is a JSON {type(value).__name__}, not an object")
        return value
