"""What an attempt's start-up inherited from the process it was forked from (``orchestrator.process.warm_start``).

A forked attempt's process starts at the fork, but the first one's import of the training stack happened before
it, in its supervisor, and belongs on its restart timeline (``orchestrator.attempt.restart``). Set once, in the
forked child, before the worker runs; a fresh interpreter has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Inherited:
    started_at: float  # unix time this attempt's start-up began: the import before the first attempt, else the fork
    cpu_s: float  # CPU seconds the supervisor spent on it (0 for attempts after the first)
    source: str = (
        "the supervisor"  # what it was forked from (a rank: "torchrun's agent", orchestrator.process.forked_ranks)
    )


_inherited: Optional[Inherited] = None


def inherit(start_up: Inherited) -> None:
    """In a forked attempt, before the worker runs: the start-up it inherited."""
    global _inherited
    _inherited = start_up


def inherited() -> Optional[Inherited]:
    """The start-up this attempt inherited; None in a fresh interpreter."""
    return _inherited
