"""The requeue policy over ledger attempts: separate caps, backoff, crash-loop breaker."""
from __future__ import annotations

import random

import pytest

from orchestrator.config.schema import RequeueConfig
from orchestrator.policy.requeue import RequeuePolicy
from orchestrator.records.ledger_record import AttemptEntry, LedgerRecord


def decoded(ledger: dict) -> LedgerRecord:
    """A test's ledger as the policy reads it: decoded (``LedgerRecord.decode``); an attempt without a fence gets
    its place in the list (1, 2, ...), as ``begin_attempt`` numbers them."""
    attempts = [dict(a, fence=a.get("fence") or n) for n, a in enumerate(ledger.get("attempts") or [], 1)]
    return LedgerRecord.decode(dict(ledger, attempts=attempts), "test")


def entries(attempts: list[dict]) -> tuple[AttemptEntry, ...]:
    """A test's attempts (dicts) decoded, as the supervisor hands them to ``decide``."""
    return decoded({"attempts": attempts}).attempts


def attempt(exit_class: str, start: int = 0, end: int | None = None, fence: int = 0) -> dict:
    """A ledger attempt that started from the checkpoint at ``start`` and reached ``end``."""
    return {
        "fence": fence, "host": "h", "pid": 1, "started_at": 0.0, "ended_at": 1.0, "last_seen": 1.0,
        "exit_class": exit_class, "step_start": start, "step_end": start if end is None else end,
        "checkpoint_step_at_start": start, "cost_usd": 0.0,
    }


def run_job(policy: RequeuePolicy, outcomes) -> tuple[list[dict], list]:
    """Feed attempts one by one, as the supervisor would, until the policy stops the job.

    ``outcomes(n)`` returns the n-th attempt (0-based). Returns (attempts, decisions).
    """
    attempts, decisions = [], []
    rng = random.Random(0)
    for n in range(1000):
        attempts.append(outcomes(n))
        decisions.append(policy.decide(entries(attempts), rng=rng))
        if not decisions[-1].requeue:
            return attempts, decisions
    raise AssertionError("the policy never stopped the job")


@pytest.mark.e2e
def test_always_crashing_job_runs_exactly_max_failures_attempts():
    # progress each time, so only the failure cap can stop it
    policy = RequeuePolicy(RequeueConfig(max_failures=3, crash_loop_threshold=100))
    attempts, decisions = run_job(policy, lambda n: attempt("crashed", start=10 * n, end=10 * n + 5))
    assert len(attempts) == 3
    assert [d.log_line.split(":")[0] for d in decisions] == ["requeue [1/3]", "requeue [2/3]", "not requeued"]
    assert decisions[-1].log_line == "not requeued: 3 failures reached requeue.max_failures=3"
    assert policy.refuse_reason(decoded({"attempts": attempts})) is not None  # a person re-running it is refused too


@pytest.mark.e2e
def test_out_of_memory_counts_as_a_failure_when_retries_are_allowed():
    policy = RequeuePolicy(RequeueConfig(max_failures=2, max_oom_retries=10, crash_loop_threshold=100))
    attempts, _ = run_job(policy, lambda n: attempt("out_of_memory", start=n, end=n + 1))
    assert len(attempts) == 2


@pytest.mark.e2e
def test_out_of_memory_stops_at_the_first_with_the_fix():
    # the same config runs out of memory the same way: no retry by default, though failures are left
    policy = RequeuePolicy(RequeueConfig(max_failures=10, crash_loop_threshold=100))
    attempts, decisions = run_job(policy, lambda n: attempt("out_of_memory", start=n, end=n + 1))
    assert len(attempts) == 1
    reason = decisions[-1].reason
    assert "requeue.max_oom_retries=0" in reason
    for fix in ("train.per_device_batch_size", "train.gradient_checkpointing=true", "orchestrator plan"):
        assert fix in reason, reason
    refused = policy.refuse_reason(decoded({"attempts": attempts}))  # an engine or a person restarting it is refused too
    assert refused and "requeue.max_oom_retries=1" in refused


@pytest.mark.e2e
def test_raising_the_oom_cap_allows_that_many_retries():
    policy = RequeuePolicy(RequeueConfig(max_failures=10, max_oom_retries=2, crash_loop_threshold=100))
    attempts, decisions = run_job(policy, lambda n: attempt("out_of_memory", start=n, end=n + 1))
    assert len(attempts) == 3
    assert [d.requeue for d in decisions] == [True, True, False]


def test_preemptions_do_not_count_against_failures():
    policy = RequeuePolicy(RequeueConfig(max_failures=2, max_preemptions=50, crash_loop_threshold=100))
    # five preemptions and one crash, all making progress: the job goes on
    history = [attempt("preempted" if i != 2 else "crashed", start=i * 10, end=i * 10 + 5) for i in range(6)]
    history[-1]["exit_class"] = "vanished"
    decision = policy.decide(entries(history), rng=random.Random(0))
    assert decision.requeue
    assert decision.delay_seconds == 0
    assert decision.log_line == "requeue [5/50]: vanished; no charge against failures"
    assert policy.refuse_reason(decoded({"attempts": history})) is None


@pytest.mark.e2e
def test_preemption_cap_stops_the_job():
    policy = RequeuePolicy(RequeueConfig(max_preemptions=4, crash_loop_threshold=100))
    attempts, decisions = run_job(policy, lambda n: attempt("preempted", start=n, end=n + 1))
    assert len(attempts) == 4
    assert decisions[-1].log_line == "not requeued: 4 preemptions reached requeue.max_preemptions=4"
    assert "requeue.max_preemptions=14" in policy.refuse_reason(decoded({"attempts": attempts}))


@pytest.mark.e2e
def test_crash_loop_breaker_trips_on_failures_that_make_no_progress():
    policy = RequeuePolicy(RequeueConfig(max_failures=10, max_preemptions=10, crash_loop_threshold=3))
    # first attempt makes progress; then every attempt dies at the checkpoint it restored (step 40),
    # crashes with lost machines in between: those neither count nor reset the streak
    cycle = ["crashed", "preempted", "crashed", "vanished", "crashed"]

    def outcomes(n):
        if n == 0:
            return attempt("crashed", start=0, end=40)
        return attempt(cycle[(n - 1) % len(cycle)], start=40, end=40)

    attempts, decisions = run_job(policy, outcomes)
    assert len(attempts) == 6  # 1 with progress + 3 crashes and 2 preemptions without
    assert decisions[-1].log_line.startswith("not requeued: crash loop: the last 3 attempts made no progress")
    assert "step 40" in decisions[-1].reason
    refused = policy.refuse_reason(decoded({"attempts": attempts}))
    assert refused and "crash_loop_threshold=4" in refused


def test_progress_resets_the_crash_loop_count():
    policy = RequeuePolicy(RequeueConfig(max_failures=10, crash_loop_threshold=3))
    history = [attempt("crashed", 0, 0), attempt("crashed", 0, 0), attempt("crashed", 0, 25), attempt("crashed", 20, 20)]
    assert policy.no_progress_streak(entries(history)) == 1
    assert policy.decide(entries(history), rng=random.Random(0)).requeue


def test_attempt_that_never_recorded_its_last_step_counts_as_no_progress():
    policy = RequeuePolicy(RequeueConfig(crash_loop_threshold=2))
    history = [attempt("crashed", 30), attempt("crashed", 30)]
    for a in history:
        a["step_end"] = None
    assert policy.no_progress_streak(entries(history)) == 2
    assert not policy.decide(entries(history)).requeue


def test_preemptions_while_loading_never_trip_the_crash_loop_breaker():
    # volatile capacity, a 70B download: every attempt is preempted or its machine vanishes before
    # its first checkpoint. That is the preemption cap's business, not a crash loop.
    policy = RequeuePolicy(RequeueConfig(max_preemptions=20, crash_loop_threshold=3))
    history = [attempt(["preempted", "vanished", "running"][i % 3], start=0, end=0) for i in range(9)]
    assert policy.no_progress_streak(entries(history)) == 0
    decision = policy.decide(entries(history))
    assert decision.requeue and decision.log_line == "requeue [9/20]: vanished; no charge against failures"
    assert policy.refuse_reason(decoded({"attempts": history})) is None


@pytest.mark.e2e
def test_preemptions_without_progress_are_stopped_by_their_own_cap():
    policy = RequeuePolicy(RequeueConfig(max_preemptions=4, crash_loop_threshold=2))
    attempts, decisions = run_job(policy, lambda n: attempt("vanished", start=0, end=0))
    assert len(attempts) == 4
    assert decisions[-1].log_line == "not requeued: 4 preemptions reached requeue.max_preemptions=4"


def test_machines_lost_while_loading_in_a_real_ledger_are_not_a_crash_loop(tmp_path):
    # the ledger as the worker writes it: each attempt is killed before its first checkpoint,
    # and the next one's begin_attempt marks it vanished
    from orchestrator.records.ledger import Ledger
    from orchestrator.storage import LocalStore

    store = LocalStore(tmp_path / "store")
    for host in ("spot-1", "spot-2", "spot-3", "spot-4"):
        Ledger(store, "big").begin_attempt(host=host, pid=1, instance_type="p5", gpu_type="h100", gpus=8,
                                           spot=True, checkpoint_step=0)
    record = Ledger(store, "big").load()
    assert [a["exit_class"] for a in record["attempts"]] == ["vanished"] * 3 + ["running"]
    policy = RequeuePolicy(RequeueConfig(crash_loop_threshold=3))
    assert policy.refuse_reason(decoded(record)) is None
    assert policy.decide(decoded(record).attempts).requeue


@pytest.mark.parametrize(
    "final", ["config_error", "budget_exhausted", "caps_reached", "fenced", "completed"]
)
def test_final_classes_are_never_requeued(final):
    policy = RequeuePolicy(RequeueConfig(max_failures=100, max_preemptions=100))
    decision = policy.decide(entries([attempt(final, 0, 10)]))
    assert not decision.requeue
    assert decision.log_line.startswith("not requeued: ")


def test_config_error_is_not_requeued_even_with_caps_left():
    policy = RequeuePolicy(RequeueConfig(max_failures=100))
    decision = policy.decide(entries([attempt("crashed", 0, 5), attempt("config_error", 5, 5)]))
    assert not decision.requeue and "config or data error" in decision.reason


def test_backoff_grows_exponentially_with_full_jitter_and_is_capped():
    policy = RequeuePolicy(RequeueConfig(backoff_base_seconds=5, backoff_max_seconds=60))

    class Top(random.Random):  # the top of the jitter range: the ceiling itself
        def uniform(self, a, b):
            return b

    assert [policy.backoff_seconds(n, Top()) for n in range(1, 7)] == [5, 10, 20, 40, 60, 60]
    samples = [policy.backoff_seconds(3, random.Random(seed)) for seed in range(200)]
    assert all(0 <= s <= 20 for s in samples) and min(samples) < 5 and max(samples) > 15  # full jitter


def test_failure_decision_carries_the_backoff_delay():
    policy = RequeuePolicy(RequeueConfig(max_failures=5, backoff_base_seconds=5, backoff_max_seconds=300, crash_loop_threshold=100))
    history = [attempt("crashed", i, i + 1) for i in range(3)]
    decision = policy.decide(entries(history), rng=random.Random(7))
    assert decision.requeue and 0 <= decision.delay_seconds <= 20
    assert decision.log_line == f"requeue [3/5]: crashed; retrying in {decision.delay_seconds:.1f}s"


def test_refuse_reason_allows_a_fresh_or_healthy_job():
    policy = RequeuePolicy(RequeueConfig())
    assert policy.refuse_reason(decoded({"attempts": []})) is None
    assert policy.refuse_reason(decoded({})) is None
    assert policy.refuse_reason(decoded({"attempts": [attempt("preempted", 0, 50), attempt("crashed", 50, 60)]})) is None


def test_raising_the_cap_lets_a_person_go_on():
    history = [attempt("crashed", i, i + 1) for i in range(3)]
    assert RequeuePolicy(RequeueConfig(max_failures=3)).refuse_reason(decoded({"attempts": history}))
    assert RequeuePolicy(RequeueConfig(max_failures=4)).refuse_reason(decoded({"attempts": history})) is None


def test_zero_failures_allowed_means_one_attempt():
    policy = RequeuePolicy(RequeueConfig(max_failures=0))
    assert not policy.decide(entries([attempt("crashed", 0, 5)])).requeue
    assert policy.refuse_reason(decoded({"attempts": []})) is None


def test_invalid_config_is_refused_with_the_key():
    with pytest.raises(ValueError, match="crash_loop_threshold"):
        RequeuePolicy(RequeueConfig(crash_loop_threshold=0))
    with pytest.raises(ValueError, match="max_failures"):
        RequeuePolicy(RequeueConfig(max_failures=-1))
    with pytest.raises(ValueError, match="max_oom_retries"):
        RequeuePolicy(RequeueConfig(max_oom_retries=-1))


def _ledger(status: str, attempts: list[dict]) -> LedgerRecord:
    return decoded({"run_name": "exp", "status": status, "attempts": attempts})


def test_start_refusal_of_a_completed_job_is_a_success_naming_the_final_weights():
    from orchestrator.core.errors import AlreadyCompleted
    from orchestrator.policy.requeue import start_refusal

    # even a job that completed after spending its failure cap is complete, not "caps reached"
    history = [attempt("crashed", i, i + 1) for i in range(3)] + [attempt("completed", 3, 40)]
    refusal = start_refusal(_ledger("completed", history), RequeuePolicy(RequeueConfig(max_failures=3)),
                            final_uri="s3://b/runs/exp/final/")
    assert isinstance(refusal, AlreadyCompleted) and refusal.exit_code == 0
    assert "already complete" in str(refusal) and "s3://b/runs/exp/final/" in str(refusal)


def test_start_refusal_types_caps_and_budget():
    from orchestrator.core.errors import BudgetExhausted, CapsReached
    from orchestrator.policy.requeue import start_refusal

    policy = RequeuePolicy(RequeueConfig(max_failures=1))
    crashed = [dict(attempt("crashed", 0, 5), cost_usd=2.0)]
    assert isinstance(start_refusal(_ledger("failed", crashed), policy), CapsReached)
    preempted = [dict(attempt("preempted", 0, 5), cost_usd=2.0)]
    spent = start_refusal(_ledger("preempted", preempted), policy, max_usd=1.5)
    assert isinstance(spent, BudgetExhausted) and spent.exit_code == 3
    assert start_refusal(_ledger("preempted", preempted), policy, max_usd=5.0) is None
