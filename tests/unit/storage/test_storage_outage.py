"""A storage outage: retried within the attempt, and when it lasts, a preemption-like end, never a crash.

Unit tests of the retrying store around a real local store whose calls fail for a while, the
ledger's conditional write through it, and the classification of an outage that outlasted
``storage.retry_for``.
"""
from __future__ import annotations

import pytest

from orchestrator.attempt.failure import classify_exception
from orchestrator.core.exitcodes import ExitClass, outcome
from orchestrator.records.ledger import Ledger
from orchestrator.storage import LocalStore, TransientStorageError, store_from_config
from orchestrator.storage.retry import RetryingStore, StorageUnavailable


class Flaky(LocalStore):
    """A local store that refuses every call while ``down`` (as a connection refused does)."""

    down = False
    calls = 0

    def get_versioned(self, key):
        self._maybe_fail()
        return super().get_versioned(key)

    def put_if(self, key, data, *, if_version):
        self._maybe_fail()
        return super().put_if(key, data, if_version=if_version)

    def _maybe_fail(self):
        self.calls += 1
        if self.down:
            raise TransientStorageError(f"{self.uri}: connection failed: Connection refused")


class Clock:
    def __init__(self, store: Flaky, up_after_s: float):
        self.now = 0.0
        self.store = store
        self.up_after_s = up_after_s

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.now >= self.up_after_s:
            self.store.down = False


def _retrying(tmp_path, *, up_after_s, window_s):
    inner = Flaky(tmp_path / "store")
    clock = Clock(inner, up_after_s)
    return inner, RetryingStore(inner, retry_seconds=window_s, sleep=clock.sleep, clock=lambda: clock.now)


def test_a_30_second_outage_during_a_heartbeat_is_ridden_out(tmp_path):
    inner, store = _retrying(tmp_path, up_after_s=30.0, window_s=120.0)
    ledger = Ledger(store, "job")
    ledger.begin_attempt(host="h", pid=1, instance_type=None, gpu_type="cpu", gpus=1, spot=True, checkpoint_step=0)
    inner.down = True
    ledger.heartbeat(7, 0.25)  # blocks through the outage (on the test's clock), then writes
    assert ledger.load()["attempts"][0]["cost_usd"] == 0.25 and inner.calls > 5 and not store.down


def test_an_outage_longer_than_the_window_ends_as_a_preemption_not_a_crash(tmp_path):
    inner, store = _retrying(tmp_path, up_after_s=1e9, window_s=20.0)
    ledger = Ledger(store, "job")
    ledger.begin_attempt(host="h", pid=1, instance_type=None, gpu_type="cpu", gpus=1, spot=True, checkpoint_step=0)
    inner.down = True
    with pytest.raises(StorageUnavailable, match=r"unreachable for \d+s \(storage.retry_for=20s\)") as err:
        ledger.heartbeat(7, 0.25)
    before = inner.calls
    with pytest.raises(StorageUnavailable):  # once down, the next call is tried once: the attempt ends fast
        ledger.heartbeat(8, 0.3)
    assert inner.calls == before + 1
    classified = classify_exception(err.value)
    assert classified.exit_class is ExitClass.PREEMPTED and not classified.bug
    assert outcome(classified.exit_class).preemption and classified.exit_code == 75
    assert "storage outage" in classified.message
    inner.down = False
    ledger.heartbeat(9, 0.3)  # the store answers again: back to normal
    assert not store.down


def test_a_job_store_retries_for_storage_retry_for(tmp_path):
    from orchestrator.app.compose import compose_config
    from orchestrator.core.errors import ConfigError

    cfg = compose_config(["recipe=sft", f"storage.uri={tmp_path}", "storage.retry_for=45s"])
    store = store_from_config(cfg.storage)
    assert isinstance(store, RetryingStore) and store.retry_seconds == 45.0
    with pytest.raises(ConfigError, match="storage.retry_for"):
        compose_config(["recipe=sft", "storage.retry_for=soon"])
