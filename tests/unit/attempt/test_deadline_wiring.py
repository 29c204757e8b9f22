"""``checkpoint.every=auto`` and ``run.deadline`` wired into an attempt, in-process.

The decisions are pure (``orchestrator.policy``, tested in test_policy.py); these tests drive the attempt's
callbacks that feed and act on them (``orchestrator.attempt.schedule``, ``orchestrator.attempt.capacity``) with a
real ledger in a folder and stand-ins for the Trainer's events, and check the launch checks, the backends'
renders that follow the ledger's decision and ``orchestrator status``. The real Slurm run is in test_slurm_e2e.py.
"""
from __future__ import annotations

import math
import re
import time
from types import SimpleNamespace

import pytest
import yaml

from orchestrator.attempt.capacity import AT_RISK_ALERT, CapacityWatch
from orchestrator.attempt.ports import CheckpointInterval, StepClock
from orchestrator.policy.history import (last_restart_seconds, measured_cost_seconds, read_attempts,
                                         restart_seconds_measured, steady_seconds_per_step)
from orchestrator.policy.interval import Lifetime
from orchestrator.attempt.record import AttemptRecord
from orchestrator.attempt.schedule import CheckpointCost, CheckpointSchedule
from orchestrator.policy.history import spot_lifetimes as lifetimes
from orchestrator.attempt.capacity_contract import MOVE, RESUBMIT, attempt_capacity, attempt_compute
from orchestrator.app.compose import compose_config
from orchestrator.config.schema import ComputeConfig, RequeueConfig
from orchestrator.core.durations import parse_deadline
from orchestrator.core.errors import ConfigError
from orchestrator.records.ledger import Ledger
from orchestrator.policy.deadline import ON_DEMAND, SPOT
from orchestrator.cli.status import format_ledger
from orchestrator.records.ledger_record import LedgerRecord
from orchestrator.storage.local import LocalStore

HOUR = 3600.0


def attempt(fence, hours, exit_class, *, spot=True, step_end=100, checkpoint_step_end=100, extra=None, start=0.0):
    return {"fence": fence, "started_at": start, "ended_at": start + hours * HOUR, "last_seen": start + hours * HOUR,
            "exit_class": exit_class, "spot": spot, "step_start": 0, "step_end": step_end,
            "checkpoint_step_end": checkpoint_step_end, "extra": {"start_to_first_step_s": 36.0, **(extra or {})}}


class Tracking:
    def __init__(self):
        self.tags, self.metrics = {}, {}

    def set_tag(self, key, value):
        self.tags[key] = value

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_metrics(self, metrics, step):
        self.metrics.update(metrics)


class Webhook:
    def __init__(self):
        self.sent = []

    def send(self, alert):
        self.sent.append(alert)

    def wait(self, timeout_s):
        return True


def make_ports(tmp_path, *, history=(), spot=True, step_time_s=0.1):
    """What the steering callbacks are handed: a real ledger record in a folder (its earlier attempts ``history``,
    an attempt begun in it), a real checkpoint interval and step clock (``step_time_s`` per step measured), the
    stops they request, and a stand-in for MLflow."""
    ledger = Ledger(LocalStore(tmp_path / "runs"), "job")
    if history:
        from orchestrator.records.ledger import new_ledger
        from orchestrator.storage.transact import transact

        def seed(_):
            seeded = new_ledger("job")
            seeded.update(attempts=[dict(a) for a in history], fence=max(a["fence"] for a in history))
            return seeded

        transact(ledger.store, ledger.key, seed)
    compute = ComputeConfig(spot=spot)  # as build_attempt hands it: the schema's dataclass
    record = AttemptRecord(ledger, _policy(), compute=compute, budget_max_usd=None)
    record.begin(0)
    stops: list = []
    return SimpleNamespace(record=record, tracking=Tracking(), interval=CheckpointInterval.derived(),
                           steps=measured_steps(step_time_s), stops=stops, request_stop=stops.append), compute


def measured_steps(step_time_s: float, steps: int = 3) -> StepClock:
    """A step clock that has measured ``steps`` steps of ``step_time_s`` (the first, warm-up, is left out)."""
    now = [0.0]
    clock = StepClock(clock=lambda: now[0])
    for _ in range(steps):
        clock.step_began()
        now[0] += step_time_s
        clock.step_ended()
        clock.resume()
    return clock


def _policy():
    from orchestrator.policy.requeue import RequeuePolicy

    return RequeuePolicy(RequeueConfig())


def state(step=0, max_steps=1000):
    return SimpleNamespace(global_step=step, max_steps=max_steps)


# ---- checkpoint.every=auto ----------------------------------------------------------


def test_lifetimes_tell_honoured_notices_from_hard_kills_and_leave_out_moves_and_on_demand():
    attempts = [attempt(1, 2, "preempted"), attempt(2, 1, "vanished"),
                attempt(3, 1, "preempted", step_end=120, checkpoint_step_end=100),  # work past its checkpoint: lost
                attempt(4, 1, "preempted", extra={"capacity_switch": "on_demand"}),  # it moved, lost nothing
                attempt(5, 3, "completed", spot=False), attempt(6, 1, "crashed"),
                attempt(7, 1, "vanished", extra={"start_to_first_step_s": None})]  # killed before its first step
    got = [(round(lt.seconds / HOUR, 2), lt.preempted, lt.noticed) for lt in lifetimes(attempts)]
    # a lifetime is training time: the 36 s start-up (0.01 h) is not in it; one that never trained is none
    assert got == [(1.99, True, True), (0.99, True, False), (0.99, True, False), (0.99, False, False),
                   (0.99, False, False), (0.0, False, False)]


def test_attempts_are_read_typed_and_a_tampered_number_counts_as_not_recorded():
    measured = {"cost_source": "measured", "checkpoint_cost_s": 2.5}
    good = attempt(1, 1.0, "vanished", extra={"restart": {"total_s": 36.0}, "checkpoint_interval": measured})
    bad = attempt(2, 1.0, "vanished", start=2 * HOUR, extra={
        "start_to_first_step_s": "nan", "checkpoint_interval": dict(measured, checkpoint_cost_s=float("inf"))})
    bad["step_end"] = "lots"
    a, b = read_attempts([good, bad, "not an attempt"])
    assert (a.restart_seconds, a.checkpoint_cost_seconds, a.lifetime) == (36.0, 2.5, Lifetime(HOUR - 36.0, True))
    assert (b.restart_seconds, b.checkpoint_cost_seconds, b.step_end) == (None, None, 0)
    assert b.lifetime == Lifetime(0.0, preempted=False)  # no measured first step: no lifetime
    assert restart_seconds_measured([good, bad]) == [36.0] and measured_cost_seconds([good, bad]) == 2.5


def test_checkpoint_cost_is_the_stall_plus_what_uploads_take_from_training():
    cost = CheckpointCost()
    assert cost.seconds() is None
    for _ in range(10):
        cost.observe_step(0.10, uploading=False)
    for _ in range(4):
        cost.observe_step(0.15, uploading=True)  # 0.05 s slower per step while an upload runs
    cost.observe_save(0.5)
    cost.observe_save(0.7)
    assert cost.seconds() == pytest.approx(0.6 + 0.05 * 4 / 2)


def schedule_for(ports, compute, **kw):
    return CheckpointSchedule(interval=ports.interval, steps=ports.steps, record=ports.record, tracking=ports.tracking,
                              full_model=False, uploading=lambda: False, compute=compute, catalog={},
                              min_seconds=kw.get("low", 1.0), max_seconds=kw.get("high", 10 * HOUR))


def test_auto_interval_is_young_daly_from_the_estimate_then_re_derived_when_the_measured_cost_moves(tmp_path):
    ports, compute = make_ports(tmp_path)
    compute.preemptions_per_hour = 1.0  # one lossy preemption per hour: M = 3600 s
    schedule = schedule_for(ports, compute)
    schedule.on_train_begin(None, state(), None, model=None)
    c0 = schedule.decision.checkpoint_cost_seconds
    assert ports.interval.seconds == pytest.approx(math.sqrt(2 * c0 * HOUR))
    assert ports.tracking.metrics["checkpoint_interval_s"] == ports.interval.seconds

    ports.steps.saved(c0 * 1.1)  # the first measurement replaces the estimate
    schedule.on_save(None, state(50), None)
    assert schedule.decision.checkpoint_cost_seconds == pytest.approx(c0 * 1.1)
    ports.steps.saved(c0 * 1.2)  # the mean moves by less than 25%: T stays
    schedule.on_save(None, state(75), None)
    assert schedule.decision.checkpoint_cost_seconds == pytest.approx(c0 * 1.1)
    ports.steps.saved(c0 * 40)  # by far more: re-derived
    schedule.on_save(None, state(100), None)
    measured = (c0 * 1.1 + c0 * 1.2 + c0 * 40) / 3
    assert ports.interval.seconds == pytest.approx(math.sqrt(2 * measured * HOUR))
    noted = ports.record.load()["attempts"][-1]["extra"]["checkpoint_interval"]
    assert noted["cost_source"] == "measured" and noted["checkpoint_cost_s"] == pytest.approx(measured)
    assert noted["mean_s_between_losses"] == pytest.approx(HOUR) and "sqrt(2 x C x M)" in noted["explanation"]

    # the next attempt starts from the cost this one measured
    done = ports.record.load()["attempts"][-1]
    nxt, compute2 = make_ports(tmp_path / "next", history=[dict(done, exit_class="preempted",
                                                                 ended_at=done["started_at"] + 60)])
    later = schedule_for(nxt, compute2)
    later.on_train_begin(None, state(), None, model=None)
    assert later.decision.checkpoint_cost_seconds == pytest.approx(measured)


def test_hard_kills_shorten_the_interval_and_honoured_notices_lengthen_it(tmp_path):
    def interval(exit_class, where):
        history = [attempt(i, 0.5, exit_class, start=i * HOUR) for i in range(1, 7)]
        ports, compute = make_ports(tmp_path / where, history=history)
        schedule = schedule_for(ports, compute)
        schedule.on_train_begin(None, state(), None, model=None)
        return ports.interval.seconds

    assert interval("vanished", "killed") < interval("preempted", "noticed")


def test_on_demand_attempts_checkpoint_at_the_longest_interval(tmp_path):
    ports, compute = make_ports(tmp_path, spot=False)
    schedule = schedule_for(ports, compute, high=1800.0)
    schedule.on_train_begin(None, state(), None, model=None)
    assert (ports.interval.seconds, schedule.decision.bound) == (1800.0, "max_every")


def test_an_explicit_preemption_rate_is_used_on_on_demand_capacity_too(tmp_path):
    ports, compute = make_ports(tmp_path, spot=False)
    compute.preemptions_per_hour = 600.0  # a partition that requeues on-demand jobs: M = 6 s
    schedule = schedule_for(ports, compute, high=1800.0)
    schedule.on_train_begin(None, state(), None, model=None)
    c0 = schedule.decision.checkpoint_cost_seconds
    assert ports.interval.seconds == pytest.approx(max(1.0, math.sqrt(2 * c0 * 6.0)))
    assert "prior from compute.preemptions_per_hour" in ports.tracking.tags["checkpoint.interval"]


def test_the_plan_prices_a_checkpoint_as_the_attempt_estimates_it_before_measuring(tmp_path):
    import torch

    from orchestrator.money.cost import load_catalog
    from orchestrator.planning.spot import price_option

    model = torch.nn.Linear(1000, 1000)  # 1M trainable fp32 parameters: 4 MB saved, 8 MB of Adam's moments
    ports, compute = make_ports(tmp_path)
    compute.preemptions_per_hour = 1.0
    schedule = schedule_for(ports, compute)
    schedule.on_train_begin(None, state(), None, model=model)
    attempt_c = schedule.decision.checkpoint_cost_seconds
    plan = SimpleNamespace(components={"adapters": 4 * model.weight.numel() + 4000, "optimizer": 8 * 1_001_000})
    cfg = compose_config(["recipe=sft", "compute=l40s-spot", f"storage.uri={tmp_path}/none"])
    option = price_option(cfg, "l40s", "spot", plan, load_catalog(), ([], []), variant=lambda c, g: c,
                          work_hours=lambda c, p: 10.0)
    assert option.checkpoint_cost_seconds == pytest.approx(attempt_c)


def test_the_deadline_keeps_the_checkpoints_of_the_work_left_in_hand_as_the_simulator_does(tmp_path):
    from orchestrator.policy.deadline import reserve_seconds

    ports, _ = make_ports(tmp_path)
    ports.interval = CheckpointInterval.fixed(600.0)
    ports.steps.saved(20.0)
    ports.steps.saved(40.0)  # C = 30 s measured in this attempt
    watch = watch_for(ports, capacity=SPOT, deadline="52h", restart=60.0)
    watch.on_train_begin(None, state(), None)
    got = watch.standing(step=1000, max_steps=37000, seconds_per_step=1.0).reserve_seconds
    # 36 000 s of work left at one 30 s checkpoint per 600 s: 1 800 s, besides the interval at risk and a heartbeat
    assert got == pytest.approx(600.0 + 36000 * 30.0 / 600.0 + watch.heartbeat_seconds)
    assert got == pytest.approx(reserve_seconds(at_risk_seconds=600.0, work_left_seconds=36000.0,
                                                checkpoint_cost_seconds=30.0, on_demand_every_seconds=600.0,
                                                until_next_decision_seconds=watch.heartbeat_seconds))


# ---- run.deadline -----------------------------------------------------------------


def test_deadlines_are_durations_or_iso_times():
    assert parse_deadline("52h") == ("after", 52 * HOUR)
    assert parse_deadline("2026-12-24T18:00:00Z") == ("at", parse_deadline("2026-12-24T18:00:00+00:00")[1])
    assert parse_deadline("2026-12-24T18:00:00")[1] == parse_deadline("2026-12-24T18:00:00Z")[1]  # UTC
    with pytest.raises(ValueError, match="neither a duration .* nor an ISO-8601 time"):
        parse_deadline("next tuesday")


def test_the_backend_says_which_capacity_an_attempt_runs_on_and_it_is_priced_so():
    spot = ComputeConfig(spot=True, gpu_type="h100", gpus_per_node=8)
    assert attempt_capacity(spot, {}) == SPOT
    assert attempt_capacity(spot, {"ORCH_CAPACITY": "on_demand"}) == ON_DEMAND
    assert attempt_compute(spot, ON_DEMAND) == ComputeConfig(spot=False, gpu_type="h100", gpus_per_node=8)
    assert spot.spot is True and attempt_compute(spot, SPOT) is spot
    on_demand = ComputeConfig(spot=False)
    assert attempt_capacity(on_demand, {"ORCH_CAPACITY": "spot"}) == ON_DEMAND  # never spot for an on-demand job


def watch_for(ports, *, capacity=SPOT, action=None, request_file="", deadline="20m", restart=900.0, spot_job=True):
    return CapacityWatch(job="job", record=ports.record, tracking=ports.tracking, interval=ports.interval,
                         steps=ports.steps, request_stop=ports.request_stop, total_cost_usd=lambda: 0.0,
                         budget_max_usd=None, deadline=deadline, capacity=capacity, action=action,
                         request_file=request_file, restart_override=restart, webhook=Webhook(),
                         heartbeat_seconds=0.0, spot_job=spot_job)


@pytest.mark.slurm
def test_slurm_job_that_only_on_demand_can_finish_in_time_saves_and_asks_to_move(tmp_path):
    ports, _ = make_ports(tmp_path)
    request = tmp_path / "job.capacity"
    watch = watch_for(ports, action=MOVE, request_file=str(request))
    watch.on_train_begin(None, state(), None)  # no earlier attempt: no pace to judge by yet
    assert not ports.stops
    watch.on_step_end(None, state(10), None)  # 990 steps x 0.1 s left, 20 min to go, two 15-minute restarts
    assert request.read_text().strip() == ON_DEMAND
    [reason] = ports.stops
    assert reason.startswith("capacity [spot -> on-demand]: time left is less than the work left plus two restarts")
    ledger = ports.record.load()
    [decision] = ledger["capacity"]
    assert (decision["previous"], decision["capacity"], decision["locked"], decision["fence"]) == (SPOT, ON_DEMAND,
                                                                                                   True, 1)
    assert ledger["attempts"][-1]["extra"]["capacity_switch"] == ON_DEMAND
    assert ports.tracking.tags["capacity"] == ON_DEMAND and "two restarts" in ports.tracking.tags["capacity.reason"]
    assert ports.tracking.metrics["capacity_on_demand"] == 1.0
    assert "capacity [spot -> on-demand]" in watch.webhook.sent[0].message
    watch.on_step_end(None, state(11), None)  # stopping: nothing more is decided or sent
    assert len(ports.record.load()["capacity"]) == 1 and len(watch.webhook.sent) == 1


def test_local_job_is_advised_once_and_a_resubmitted_one_is_told_where_it_goes_next(tmp_path):
    ports, _ = make_ports(tmp_path)
    watch = watch_for(ports)  # local: no action
    watch.on_train_begin(None, state(), None)
    for step in (10, 20, 30):
        watch.on_step_end(None, state(step), None)
    [decision] = ports.record.load()["capacity"]
    assert decision["action"].startswith("advice only") and not ports.stops
    assert [a.name for a in watch.webhook.sent] == ["capacity"]

    ports2, _ = make_ports(tmp_path / "k8s")
    watch2 = watch_for(ports2, action=RESUBMIT)
    watch2.on_train_begin(None, state(), None)
    watch2.on_step_end(None, state(10), None)
    assert "the next submission of run.name=job" in ports2.record.load()["capacity"][0]["action"]


def test_on_schedule_jobs_stay_on_spot_and_the_decision_uses_the_earlier_attempts_pace(tmp_path):
    history = [attempt(1, 0.1, "preempted", step_end=361, extra={"start_to_first_step_s": 0.0})]
    assert steady_seconds_per_step(history) == pytest.approx(1.0)  # 360 s for 360 steps after the first
    now = time.time()
    history[0].update(started_at=now - 400, ended_at=now - 40)
    ports, _ = make_ports(tmp_path, history=history)
    watch = watch_for(ports, action=MOVE, request_file=str(tmp_path / "c"), deadline="2h", restart=60.0)
    watch.on_train_begin(None, state(361, 1000), None)  # decided before training, at the earlier pace
    [decision] = ports.record.load()["capacity"]
    assert decision["capacity"] == SPOT and decision["seconds_per_step"] == pytest.approx(1.0)
    assert decision["action"] == "stays on spot" and not ports.stops


def test_deadline_at_risk_alerts_once_per_job(tmp_path):
    ports, _ = make_ports(tmp_path)
    watch = watch_for(ports, deadline="1m", restart=10.0)  # 1000 steps x 0.1 s cannot fit in a minute
    watch.on_train_begin(None, state(), None)
    watch.on_step_end(None, state(1), None)
    watch.on_step_end(None, state(2), None)
    again = watch_for(ports, deadline="1m", restart=10.0)  # a later attempt of the same job
    again.on_train_begin(None, state(), None)
    again.on_step_end(None, state(3), None)
    alerts = [a.name for a in watch.webhook.sent + again.webhook.sent]
    assert alerts.count(AT_RISK_ALERT) == 1 and AT_RISK_ALERT in ports.record.load()["alerts"]
    assert "deadline at risk" in next(a.message for a in watch.webhook.sent if a.name == AT_RISK_ALERT)

    on_demand_job, _ = make_ports(tmp_path / "od", spot=False)  # nothing to choose; it still hears of the risk
    watch = watch_for(on_demand_job, capacity=ON_DEMAND, deadline="1m", restart=10.0, spot_job=False)
    watch.on_train_begin(None, state(), None)
    watch.on_step_end(None, state(1), None)
    assert [a.name for a in watch.webhook.sent] == [AT_RISK_ALERT] and not on_demand_job.record.load().get("capacity")


def test_the_restart_split_is_the_one_record_of_start_to_first_step_and_old_ledgers_still_read(tmp_path):
    ports, _ = make_ports(tmp_path)
    ports.record.record_restart({"imports_s": 2.0, "first_step_s": 0.5, "total_s": 12.5})
    written = ports.record.load()["attempts"][-1]
    assert set(written["extra"]) == {"restart"} and written["extra"]["restart"]["imports_s"] == 2.0
    old = attempt(1, 0.1, "preempted", extra={"start_to_first_step_s": 30.0})  # a ledger from before the split
    assert restart_seconds_measured([old, written]) == [30.0, 12.5]
    assert last_restart_seconds([old, written]) == 12.5
    assert [round(lt.seconds) for lt in lifetimes([dict(written, spot=True, ended_at=written["started_at"] + 100,
                                                        exit_class="vanished")])] == [88]


# ---- launch checks, renders, status ----------------------------------------------------


@pytest.mark.parametrize("bad,needle", [
    (["run.deadline=soon"], "run.deadline='soon' is neither a duration"),
    (["checkpoint.every=auto", "checkpoint.min_every=2h", "checkpoint.max_every=1h"], "0 < min_every <= max_every"),
    (["backend.on_demand_partition=ondemand"], "it is a Slurm setting"),
    (["backend=slurm", "backend.on_demand_partition=ondemand", "backend.partition=spot"], "only run.deadline"),
    (["backend=slurm", "backend.on_demand_partition=spot", "backend.partition=spot", "run.deadline=2h",
      "compute.spot=true"], "must name the spot partition"),
    (["compute.restart_seconds=-1"], "compute.restart_seconds=-1"),
])
def test_bad_deadline_and_interval_settings_are_refused_at_launch(bad, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        compose_config(["recipe=sft", *bad])


def composed(storage, backend, *extra):
    return compose_config(["recipe=sft", f"backend={backend}", *storage, "run.name=job",
                           "compute.spot=true", "run.deadline=52h", "checkpoint.every=auto", "compute.cloud=gcp",
                           "backend.image=img:1", *extra])


def decide_on_demand(store):
    ledger = Ledger(store, "job")
    ledger.begin_attempt(host="h", pid=1, instance_type="cpu", gpu_type="none", gpus=0, spot=True, checkpoint_step=0)
    ledger.record_capacity({"capacity": ON_DEMAND, "previous": SPOT, "reason": "behind the line by 3.0 h: on-demand",
                            "locked": False, "at_risk": False, "action": "the next submission ...", "step": 10})


@pytest.mark.e2e
@pytest.mark.slurm
def test_the_next_submission_renders_on_demand_when_the_ledger_says_so(s3_server, s3_bucket):
    from orchestrator.backends import kubernetes, skypilot, slurm
    from orchestrator.storage import open_store

    storage = [f"storage.uri={s3_bucket}", f"storage.endpoint_url={s3_server.endpoint_url}"]
    sky = composed(storage, "skypilot")
    k8s = composed(storage, "kubernetes")
    sbatch = composed(storage, "slurm", "backend.partition=spot", "backend.on_demand_partition=ondemand")
    assert yaml.safe_load(skypilot.render(sky, []))["resources"]["use_spot"] is True
    assert "nodeSelector" in yaml.safe_load(kubernetes.render(k8s, []))["spec"]["template"]["spec"]
    assert "#SBATCH --partition=spot" in slurm.render(sbatch, [])

    decide_on_demand(open_store(s3_bucket, endpoint_url=s3_server.endpoint_url))
    text = skypilot.render(sky, [])
    task = yaml.safe_load(text)
    assert task["resources"]["use_spot"] is False and task["envs"]["ORCH_CAPACITY"] == ON_DEMAND
    assert "# capacity: on-demand, as the ledger's newest decision (run.deadline) says: behind the line" in text
    pod = yaml.safe_load(kubernetes.render(k8s, []))["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod
    assert {"name": "ORCH_CAPACITY", "value": ON_DEMAND} in pod["containers"][0]["env"]
    script = slurm.render(sbatch, [])
    assert "#SBATCH --partition=ondemand" in script and "# capacity: on-demand" in script
    assert 'sbatch --parsable --partition="$target" "$0"' in script


def test_status_explains_the_interval_and_the_capacity_decisions(tmp_path):
    decide_on_demand(LocalStore(tmp_path / "runs"))
    ledger = Ledger(LocalStore(tmp_path / "runs"), "job")
    ledger.fence = 1
    ledger.set_attempt_extra(checkpoint_interval={"explanation": "checkpoint every 53s: T = sqrt(2 x C x M) ..."})
    text = format_ledger(LedgerRecord.decode(ledger.load(), ledger.uri))
    assert "checkpoint interval (attempt 1, checkpoint.every=auto)\n  checkpoint every 53s: T = sqrt(2 x C x M)" in text
    assert "[spot -> on-demand] the next submission ...: behind the line by 3.0 h: on-demand" in text
