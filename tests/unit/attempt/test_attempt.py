"""The attempt's parts, in-process, against the real stores (a local folder and the moto S3 server) and a
real tiny TRL trainer: logic that whole jobs prove too, each proven here in seconds.

- the runner: a whole attempt in this process; a crashed one resumed by the next ends bit-identical;
- the record: refusals (caps, budget, completed) and fencing between two attempts;
- the checkpoint controller: manifest last (a fenced commit leaves no checkpoint), restore fallback, retention,
  final weights through the store's commit;
- the money watch: the budget's hard stop and its alerts, once each.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator.attempt.build import build_attempt
from orchestrator.attempt.checkpoints import CheckpointController
from orchestrator.attempt.money import MoneyWatch, SpendWatch
from orchestrator.attempt.record import AttemptRecord
from orchestrator.checkpoint.store import CheckpointStore
from orchestrator.config.schema import ComputeConfig, RequeueConfig
from orchestrator.core.errors import (
    AlreadyCompleted,
    BudgetExhausted,
    CapsReached,
    Fenced,
)
from orchestrator.core.exitcodes import ExitClass
from orchestrator.money.cost import Price
from orchestrator.money.spend import Caps, SpendIndex
from orchestrator.policy.requeue import RequeuePolicy
from orchestrator.records.ledger import Ledger
from orchestrator.storage import LocalStore
from tests.helpers import jobs
from tests.helpers.attempts import attempt_cfg, crash_after_step_12, weights_digest


# ---- the runner -----------------------------------------------------------------
@pytest.mark.e2e
def test_an_attempt_that_crashed_is_resumed_by_the_next_and_ends_bit_identical(tmp_path):
    store = LocalStore(tmp_path / "runs")
    assert build_attempt(attempt_cfg(tmp_path, "clean")).run() == 0

    crash_after_step_12(tmp_path, "crashy")
    assert jobs.committed_steps(jobs.Storage(str(tmp_path / "runs")), "crashy")[-1] == 10

    resumed = build_attempt(attempt_cfg(tmp_path, "crashy"))
    assert resumed.run() == 0
    assert resumed.step_at_start == 10
    ledger = Ledger(store, "crashy").load()
    assert [a["exit_class"] for a in ledger["attempts"]] == ["crashed", "completed"]
    assert weights_digest(store, "crashy") == weights_digest(store, "clean")

    # the final folder was committed through the store's protocol: manifest last, every file listed and present
    manifest = json.loads(store.get_bytes("crashy/final/manifest.json"))
    assert {"config.yaml", "adapter_model.safetensors"} <= {e["path"] for e in manifest["files"]}
    with pytest.raises(AlreadyCompleted):
        build_attempt(attempt_cfg(tmp_path, "crashy")).run()


# ---- the record -------------------------------------------------------------------
def _record(store, run="job", **requeue) -> AttemptRecord:
    return AttemptRecord(Ledger(store, run), RequeuePolicy(RequeueConfig(**requeue)),
                         compute=ComputeConfig(name="t", gpu_type="a10g", gpus_per_node=1, spot=True),
                         budget_max_usd=1.0)


def test_a_newer_attempt_fences_the_older_one(store):
    first, second = _record(store), _record(store)
    first.begin(0)
    second.begin(0)
    assert isinstance(first.heartbeat(5, 0.01), Fenced)
    with pytest.raises(Fenced):
        first.check_fence()
    assert second.heartbeat(5, 0.01) is None
    ledger = second.load()
    assert [a["exit_class"] for a in ledger["attempts"]] == ["vanished", "running"]


def test_a_record_refuses_a_spent_budget_spent_caps_and_a_completed_job(store):
    spent = _record(store, "spent")
    spent.begin(0)
    spent.end(ExitClass.PREEMPTED, 3, 1.5)  # $1.50 of a $1.00 budget
    with pytest.raises(BudgetExhausted, match="budget.max_usd"):
        _record(store, "spent").begin(3)

    capped = _record(store, "capped", max_preemptions=1)
    capped.begin(0)
    capped.end(ExitClass.PREEMPTED, 3, 0.01)
    with pytest.raises(CapsReached, match="requeue.max_preemptions"):
        _record(store, "capped", max_preemptions=1).begin(3)

    done = _record(store, "done")
    done.begin(0)
    done.end(ExitClass.COMPLETED, 9, 0.01)
    again = _record(store, "done")
    with pytest.raises(AlreadyCompleted):
        again.begin(9)
    assert [a["exit_class"] for a in again.load()["attempts"]] == ["completed"]  # nothing added


# ---- the checkpoint controller -------------------------------------------------------
def _controller(store, tmp_path, record, keep_last=2) -> CheckpointController:
    work = tmp_path / "attempt"
    ctl = CheckpointController(CheckpointStore(store, "job", keep_last=keep_last, staging_dir=work / "staging"),
                               record, main=True, work=work, token="t", snapshot_dir="work", full_model=False,
                               trajectory={"train.seed": 1}, attempt_cost_usd=lambda: 0.0)
    ctl.checkpoints.staging_dir.mkdir(parents=True)
    return ctl


def _trainer_folder(tmp_path: Path, step: int) -> Path:
    folder = tmp_path / "trainer" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(f"weights at {step}".encode() * 100)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def test_commits_restore_the_newest_good_one_and_retention_keeps_the_last_two(store, tmp_path):
    record = _record(store)
    record.begin(0)
    ctl = _controller(store, tmp_path, record)
    for step in (5, 10, 15):
        ctl.commit(_trainer_folder(tmp_path, step), step, wait=True)
    assert [c.step for c in ctl.checkpoints.committed()] == [10, 15]
    assert [c["step"] for c in record.load()["checkpoints"]][-2:] == [10, 15]

    # the newest is damaged in storage: the previous one is restored, verified
    newest = ctl.checkpoints.committed()[-1]
    store.put_bytes(f"job/checkpoints/{newest.name}/adapter_model.safetensors", b"tampered")
    folder, manifest = ctl.restore(check=lambda m: None)
    assert manifest["step"] == 10
    assert (folder / "adapter_model.safetensors").read_bytes() == b"weights at 10" * 100


def test_a_fenced_attempt_commits_no_checkpoint(store, tmp_path):
    old = _record(store)
    old.begin(0)
    ctl = _controller(store, tmp_path, old)
    ctl.commit(_trainer_folder(tmp_path, 5), 5, wait=True)
    _record(store).begin(5)  # a newer attempt takes the job
    ctl.commit(_trainer_folder(tmp_path, 10), 10, wait=True)
    assert [c.step for c in ctl.checkpoints.committed()] == [5], "the manifest goes last, only while holding the job"
    assert not ctl.checkpoints.results[-1].ok and "Fenced" in ctl.checkpoints.results[-1].error


class _SlowShards:
    """A store whose reward-cache uploads take ``delay`` seconds; it records the order manifests land in."""

    def __init__(self, inner, delay: float):
        self.inner, self.delay, self.manifests = inner, delay, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def upload_file(self, local_path, key: str) -> None:
        if "/reward_cache/" in key:
            time.sleep(self.delay)
        self.inner.upload_file(local_path, key)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.inner.put_bytes(key, data)
        if key.endswith("/manifest.json"):
            self.manifests.append(key.split("/")[1])


def test_grpo_rewards_are_stored_beside_training_and_a_checkpoint_waits_for_them(tmp_path):
    from orchestrator.checkpoint.reward_cache import RewardCache

    store = _SlowShards(LocalStore(tmp_path / "store"), delay=0.6)
    record = _record(store)
    record.begin(0)
    ctl = _controller(store, tmp_path, record)
    cache, key = ctl.reward_cache(), ("a" * 32, "b" * 32)
    started = time.monotonic()
    cache.put("judge", {key: 0.75})
    assert time.monotonic() - started < 0.3, "training waited for the reward shard's upload"
    assert cache.get("judge", key) == 0.75
    ctl.commit(_trainer_folder(tmp_path, 5), 5, wait=True)
    # the checkpoint's manifest lands after the shard's: resuming from it finds every reward computed before it
    assert store.manifests == ["reward_cache", "checkpoints"], store.manifests
    resumed = RewardCache(CheckpointStore(store, "job", staging_dir=tmp_path / "s2"), work=tmp_path / "w2", main=True)
    assert resumed.get("judge", key) == 0.75
    ctl.close()


# ---- the money watch ------------------------------------------------------------------
def test_a_restart_its_budget_cannot_carry_through_its_start_up_stops_before_spending_it(store):
    """budget.max_usd: a step is the first moment the guard can stop an attempt, so a restart whose budget left
    is less than the start-up still ahead of it (the job's last measured, less what it has run) is refused when
    it takes its fence, naming the numbers and the fix, before it loads anything; one the budget carries starts."""
    ledger = Ledger(store, "job")
    first = AttemptRecord(ledger, RequeuePolicy(RequeueConfig()), compute=ComputeConfig(), budget_max_usd=1.0)
    fence = first.begin(0).fence
    first.record_restart({"total_s": 10.0})  # process start to first step, as the runner reports it
    ledger.end_attempt(ExitClass.PREEMPTED, 4, 0.95)

    def restart(budget: float):
        spend = SpendWatch(SpendIndex(store, Caps("job", "x")), usd_per_second=0.01, window_s=60, spent=lambda: 0.02)
        return AttemptRecord(Ledger(store, "job"), RequeuePolicy(RequeueConfig()), compute=ComputeConfig(),
                             budget_max_usd=budget, spend=spend).begin(4)

    with pytest.raises(BudgetExhausted, match=r"budget nearly spent: \$0.030000 left of budget.max_usd=\$1.0, less "
                                              r"than the start-up still ahead of this attempt \(\$0.080000: 10.0 s"):
        restart(1.0)  # $0.95 spent before, $0.02 since this process started (2 s), 8 s of start-up to come
    assert restart(1.2).fence > fence  # $0.23 left carries the $0.08


def test_the_budget_stops_the_attempt_once_spent_and_each_alert_fires_once(store):
    from orchestrator.config.schema import BudgetConfig
    from orchestrator.money.budget import BudgetGuard

    record = _record(store)
    record.begin(0)
    clock = [1000.0]
    price = Price(usd_per_hour_total=3.6, usd_per_gpu_hour=3.6, on_demand_usd_per_hour_total=7.2, source="test", gpus=1)
    money = MoneyWatch(price, max_steps=100, budget_max_usd=1.0, fallback_tokens_per_step=64)
    money.meter._clock = lambda: clock[0]
    money.meter.started_at = clock[0]
    sent = []

    class Sink:
        def send(self, alert):
            sent.append(alert.name)

    money.watch_budget(BudgetGuard(BudgetConfig(max_usd=1.0, projection_alert=False), record_alert=record.record_alert,
                                   sinks=[Sink()], job_name="job"))
    clock[0] += 600  # $0.60: the 50% alert
    assert money.stop_reason(10, 0, first_step_seconds=1.0, restarts=0) is None
    clock[0] += 300  # $0.90: 80%
    assert money.stop_reason(20, 0, first_step_seconds=1.0, restarts=0) is None
    clock[0] += 200  # $1.10: spent
    assert "budget exhausted" in money.stop_reason(30, 0, first_step_seconds=1.0, restarts=0) and money.budget_stopped
    money.stop_reason(31, 0, first_step_seconds=1.0, restarts=0)
    assert sent == ["budget_50", "budget_80", "budget_100"]


def test_a_restore_resends_the_checkpoints_logged_steps_mlflow_lost(tmp_path):
    from orchestrator.attempt.reporting import AttemptTracking

    class Tracker:  # the JobTracker's contract: log_metrics drops steps at or below a key's last logged step
        def __init__(self, last):
            self.last, self.points = last, []

        def log_metrics(self, metrics, step):
            kept = {k: v for k, v in metrics.items() if step > self.last.get(k, -1)}
            self.points.append((step, kept))
            self.last.update({k: step for k in kept})

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    history = [{"loss": 1.0, "reward": 0.5, "step": 5}, {"loss": 0.9, "reward": float("nan"), "step": 10},
               {"loss": 0.8, "reward": 0.75, "flag": True, "step": 15}]
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    tracker = Tracker({"loss": 5, "reward": 5})  # the SIGKILLed attempt's points after step 5 never reached MLflow
    AttemptTracking(tracker).replay_history(folder)
    assert tracker.points == [(5, {}), (10, {"loss": 0.9}), (15, {"loss": 0.8, "reward": 0.75})]
    AttemptTracking(tracker).replay_history(None)  # a fresh start: nothing to resend
    (folder / "trainer_state.json").write_text("not json")
    AttemptTracking(tracker).replay_history(folder)
    assert len(tracker.points) == 3
