"""Shared by the tests: a sound ledger, and what a stored value can turn into."""
from __future__ import annotations

import math

from hypothesis import strategies as st

WHERE = "s3://b/runs/job/ledger.json"


GOOD_ATTEMPT = {"fence": 1, "host": "h1", "pid": 4242, "started_at": 1.7e9, "ended_at": 1.7e9 + 60,
                "last_seen": 1.7e9 + 60, "exit_class": "preempted", "step_start": 0, "step_end": 40,
                "checkpoint_step_at_start": 0, "checkpoint_step_end": 40, "cost_usd": 0.25, "instance_type": "g5",
                "gpu_type": "a10g", "gpus": 1, "spot": True, "extra": {"restart": {"total_s": 12.0}},
                "launched_by": "tok"}


GOOD = {"run_name": "job", "status": "running", "fence": 1, "attempts": [GOOD_ATTEMPT],
        "checkpoints": [{"step": 40, "key": "job/checkpoints/40-1", "size": 1000, "time": 1.7e9 + 50, "fence": 1}],
        "checkpoints_committed": 3, "alerts": {"budget_80": 1.7e9}, "mlflow_run_id": "abc", "cost_usd": 0.25,
        "step": 40, "created_at": 1.7e9, "repro": None}


# what a value in a stored document can turn into
JUNK = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30),
                 st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1e300, -1.0]), st.text(max_size=20),
                 st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))


def corrupted(doc: dict, path: tuple, value):
    """A deep copy of the stored document ``doc`` with the field at ``path`` set to ``value`` (None: deleted):
    what the records' corruption tests feed each decode."""
    import json as _json

    out = _json.loads(_json.dumps(doc))
    *parents, leaf = path
    target = out
    for key in parents:
        target = target[key]
    if value is None:
        del target[leaf]
    else:
        target[leaf] = value
    return out
