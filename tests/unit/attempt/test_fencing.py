"""Storage written before the fencing ``epoch`` was renamed ``fence`` still reads and resumes.

The job's ledger (its own number, its attempts', checkpoint records', capacity decisions') and every
checkpoint manifest held the attempt's fence as ``"epoch"``. Here a real attempt crashes, its storage is
turned back into exactly what the code before the rename wrote, and the next attempt resumes from it:
it takes fence 2, restores step 10 and ends bit-identical to an uninterrupted run.
"""
from __future__ import annotations

import json

import pytest

from orchestrator.attempt.build import build_attempt
from orchestrator.checkpoint import manifest as mf
from orchestrator.money.spend_repair import rebuild_index
from orchestrator.records.ledger import Ledger
from orchestrator.storage import LocalStore
from tests.helpers.attempts import attempt_cfg, crash_after_step_12, weights_digest


def _legacy(record: dict) -> dict:
    """``record`` as the code before the rename wrote it."""
    return {("epoch" if k == "fence" else "attempt_epoch" if k == "attempt_fence" else k):
            (_legacy(v) if isinstance(v, dict) else v) for k, v in record.items()}


def _to_legacy_storage(store: LocalStore, run: str) -> int:
    """Rewrite ``run``'s ledger and manifests in the old format; how many manifests were rewritten."""
    ledger = json.loads(store.get_bytes(f"{run}/ledger.json"))
    old = _legacy(ledger)
    for name in ("attempts", "checkpoints", "capacity"):
        old[name] = [_legacy(r) for r in ledger.get(name) or []]
    store.put_bytes(f"{run}/ledger.json", json.dumps(old, indent=2).encode())
    manifests = [k for k in store.list(f"{run}/") if k.endswith("/" + mf.MANIFEST_NAME)]
    for key in manifests:
        store.put_bytes(key, mf.dumps(_legacy(json.loads(store.get_bytes(key)))))
    return len(manifests)


@pytest.mark.e2e  # three whole attempts (7.6 s of the inner loop's CPU); in-process, as test_attempt's resume
def test_a_job_stored_before_the_rename_resumes_bit_identical(tmp_path):
    store = LocalStore(tmp_path / "runs")
    assert build_attempt(attempt_cfg(tmp_path, "clean")).run() == 0
    crash_after_step_12(tmp_path, "old")
    assert _to_legacy_storage(store, "old") >= 2
    stored = json.loads(store.get_bytes("old/ledger.json"))
    assert "fence" not in json.dumps(stored) and stored["epoch"] == 1 and stored["checkpoints"][-1]["epoch"] == 1

    resumed = build_attempt(attempt_cfg(tmp_path, "old"))
    assert resumed.run() == 0
    assert resumed.step_at_start == 10
    ledger = Ledger(store, "old").load()
    assert ledger["fence"] == 2
    assert [(a["fence"], a["exit_class"]) for a in ledger["attempts"]] == [(1, "crashed"), (2, "completed")]
    assert weights_digest(store, "old") == weights_digest(store, "clean")


def test_the_spend_index_rebuilt_from_a_legacy_ledger_keeps_its_running_attempt_open(tmp_path):
    store = LocalStore(tmp_path / "runs")
    attempt = {"epoch": 3, "exit_class": "running", "cost_usd": 1.5, "started_at": 1.7e9, "last_seen": 1.7e9 + 60,
               "ended_at": None, "extra": {"experiment": "e"}}
    store.put_bytes("job/ledger.json", json.dumps({"run_name": "job", "epoch": 3, "attempts": [attempt]}).encode())
    repair = rebuild_index(store)
    assert list(repair.index["jobs"]["job"]["open"]) == ["3"]
    assert repair.index["jobs"]["job"]["open"]["3"]["spent"] == 1.5
