"""How long one restart costs: start of a new attempt to its first optimizer step after a restore.

Measured from the job's own attempts when it has any (their median, so one slow
start does not own it), else estimated from what a restart must move and load,
and ``compute.restart_seconds`` overrides both.
"""

from __future__ import annotations

import statistics
from typing import Iterable, Optional

# A fresh machine: container start, Python imports, CUDA init; a round figure for a warm image, not a measurement.
BASE_START_SECONDS = 45.0
MODEL_LOAD_BYTES_PER_SECOND = 400e6  # safetensors from local disk or a warm hub cache
CHECKPOINT_DOWNLOAD_BYTES_PER_SECOND = 100e6  # object storage to one machine, verified


def restart_seconds(
    *,
    override: Optional[float] = None,
    measured: Iterable[float] = (),
    model_bytes: float = 0.0,
    checkpoint_bytes: float = 0.0,
) -> tuple[float, str]:
    """(seconds, where the figure came from: "compute.restart_seconds" | "measured" | "estimated")."""
    if override is not None:
        return float(override), "compute.restart_seconds"
    seen = [float(s) for s in measured if s is not None and s > 0]
    if seen:
        return statistics.median(seen), "measured"
    return (
        BASE_START_SECONDS
        + model_bytes / MODEL_LOAD_BYTES_PER_SECOND
        + checkpoint_bytes / CHECKPOINT_DOWNLOAD_BYTES_PER_SECOND
    ), "estimated"


def start_up_seconds(last_measured: float, override: Optional[float]) -> float:
    """The start-up (process start to first step) a cap's reservation holds for an attempt to come:
    ``compute.restart_seconds`` when set (a sweep's driver sets it to the longest start-up its trials measured,
    which one trial's own last start-up can undercut), else the job's last measured, else the start prior
    ``BASE_START_SECONDS`` (a first attempt has measured nothing, and holding nothing for its start-up would let
    it pass a cap by all of it)."""
    if override is None and last_measured and last_measured > 0:
        return float(last_measured)
    return start_prior_seconds(override)


def start_prior_seconds(override: Optional[float]) -> float:
    """The start-up to assume before one is measured: ``compute.restart_seconds`` when set, else ``BASE_START_SECONDS``."""
    return float(override) if override is not None else BASE_START_SECONDS
