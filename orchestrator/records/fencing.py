"""The fence: the number each attempt of a job takes in its ledger (1, 2, 3, ...; ``Ledger.begin_attempt``).

Every later write of the attempt checks that the ledger still holds its fence, so an attempt presumed dead
that comes back cannot write over its successor (``Fenced``). It is not the training epoch
(``train.num_epochs``). Ledgers and checkpoint manifests written before it had this name hold it as
``"epoch"``: this module is the one place that knows the old name, and reads it.
"""

from __future__ import annotations

from typing import Any

FENCE_KEY = "fence"
LEGACY_FENCE_KEY = "epoch"  # stored by versions before the rename
_LEDGER_LISTS = ("attempts", "checkpoints", "capacity")  # the ledger's records that carry a fence


def upgraded(record: Any) -> Any:
    """``record`` (a dict read from storage) with a legacy ``"epoch"`` renamed ``"fence"``, in place.

    Anything else is returned as it is: the readers check what they read."""
    if isinstance(record, dict) and FENCE_KEY not in record and LEGACY_FENCE_KEY in record:
        record[FENCE_KEY] = record.pop(LEGACY_FENCE_KEY)
    return record


def upgraded_ledger(ledger: Any) -> Any:
    """A ledger read from storage, its own fence and its records' (attempts, checkpoints, capacity) upgraded."""
    upgraded(ledger)
    for name in _LEDGER_LISTS:
        records = ledger.get(name) if isinstance(ledger, dict) else None
        for record in records if isinstance(records, list) else []:
            upgraded(record)
    return ledger
