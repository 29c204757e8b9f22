"""The pure decisions: Young/Daly interval from a blended preemption rate, and Uniform Progress under a deadline."""
import math

import pytest

from orchestrator.policy.deadline import ON_DEMAND, SPOT, DeadlineState, decide_capacity
from orchestrator.policy.interval import (Lifetime, checkpoint_interval, estimate_preemptions,
                                          expected_waste_fraction, young_daly_seconds)


def test_young_daly_is_sqrt_2cm():
    assert young_daly_seconds(10, 3600) == pytest.approx(math.sqrt(2 * 10 * 3600))
    assert young_daly_seconds(10, math.inf) == math.inf


def test_no_history_follows_the_prior_and_long_history_follows_the_job():
    prior = estimate_preemptions([], prior_per_hour=2.0)
    assert prior.per_hour == pytest.approx(2.0)
    calm = [Lifetime(seconds=3600 * 10, preempted=True)] * 10  # 100 h, 10 preemptions: 0.1/h
    est = estimate_preemptions(calm, prior_per_hour=2.0)
    assert 0.1 < est.per_hour < 0.2
    assert estimate_preemptions(calm, prior_per_hour=2.0, override_per_hour=5).per_hour == 5


def test_noticed_preemptions_lengthen_the_interval_and_hard_kills_shorten_it():
    kills = estimate_preemptions([Lifetime(1800, True, noticed=False)] * 6, prior_per_hour=1.0)
    notices = estimate_preemptions([Lifetime(1800, True, noticed=True)] * 6, prior_per_hour=1.0)
    t_kills = checkpoint_interval(5, kills, min_seconds=1, max_seconds=1e9).seconds
    t_notices = checkpoint_interval(5, notices, min_seconds=1, max_seconds=1e9).seconds
    assert t_notices > 2 * t_kills
    d = checkpoint_interval(5, kills, min_seconds=600, max_seconds=3600)
    assert d.seconds == 600 and d.bound == "min_every" and "C = 5.00s" in d.explain()


def test_the_bounded_interval_minimises_the_first_order_waste():
    est = estimate_preemptions([], prior_per_hour=1.5)
    best = checkpoint_interval(20, est, min_seconds=1, max_seconds=1e9).seconds
    waste = lambda t: expected_waste_fraction(t, 20, est, restart_seconds=60)  # noqa: E731
    assert waste(best) < waste(best * 2) and waste(best) < waste(best / 2)


def _state(**kw):
    base = dict(elapsed_seconds=0, deadline_seconds=100 * 3600, work_done_seconds=0, work_total_seconds=50 * 3600,
                restart_seconds=600)
    base.update(kw)
    return DeadlineState(**base)


def test_uniform_progress_spot_when_ahead_on_demand_when_behind_and_back_with_hysteresis():
    assert decide_capacity(_state()).capacity == SPOT
    # behind while waiting for spot: on-demand; behind while holding spot: keep it (the paper's rule)
    behind = decide_capacity(_state(elapsed_seconds=40 * 3600, work_done_seconds=10 * 3600, spot_available=False))
    assert behind.capacity == ON_DEMAND and "behind the line" in behind.reason and not behind.locked
    assert decide_capacity(_state(elapsed_seconds=40 * 3600, work_done_seconds=10 * 3600)).capacity == SPOT
    # on-demand and only just ahead: stays (a switch costs a restart)
    assert decide_capacity(_state(elapsed_seconds=40 * 3600, work_done_seconds=20 * 3600 + 300,
                                  current=ON_DEMAND)).capacity == ON_DEMAND
    assert decide_capacity(_state(elapsed_seconds=40 * 3600, work_done_seconds=22 * 3600,
                                  current=ON_DEMAND)).capacity == SPOT


def test_late_means_on_demand_for_good_and_at_risk_when_even_that_misses():
    late = decide_capacity(_state(elapsed_seconds=90 * 3600, work_done_seconds=40.3 * 3600))
    assert late.capacity == ON_DEMAND and late.locked and not late.at_risk
    assert decide_capacity(_state(elapsed_seconds=95 * 3600, work_done_seconds=40 * 3600, locked=True)).locked
    risk = decide_capacity(_state(elapsed_seconds=95 * 3600, work_done_seconds=40 * 3600))
    assert risk.at_risk and risk.capacity == ON_DEMAND


def test_restart_seconds_override_then_measured_median_then_estimate():
    from orchestrator.policy.restart import BASE_START_SECONDS, restart_seconds

    assert restart_seconds(override=30, measured=[100]) == (30.0, "compute.restart_seconds")
    assert restart_seconds(measured=[10, 200, 12]) == (12.0, "measured")
    est, source = restart_seconds(model_bytes=4e9, checkpoint_bytes=1e9)
    assert source == "estimated" and est > BASE_START_SECONDS + 10


def test_preemption_prior_override_catalog_default_and_on_demand():
    from orchestrator.config.schema import ComputeConfig
    from orchestrator.money.cost import DEFAULT_SPOT_PREEMPTIONS_PER_HOUR, load_catalog, preemption_prior_per_hour

    catalog = load_catalog()
    spot = ComputeConfig(spot=True, gpu_type="a100-80gb", cloud="aws")
    assert preemption_prior_per_hour(spot, catalog)[0] == DEFAULT_SPOT_PREEMPTIONS_PER_HOUR
    catalog["a100-80gb"]["clouds"]["aws"]["spot"]["preemptions_per_hour"] = 2.5
    assert preemption_prior_per_hour(spot, catalog) == (2.5, "price catalog")
    spot.preemptions_per_hour = 0.1
    assert preemption_prior_per_hour(spot, catalog) == (0.1, "compute.preemptions_per_hour")
    assert preemption_prior_per_hour(ComputeConfig(spot=False), catalog) == (0.0, "on-demand")


def test_least_waste_interval_over_lifetimes_that_end_young_is_longer_than_young_daly():
    from orchestrator.policy.interval import lifetime_waste_seconds

    # 25 min of training, checkpoint every 10 min costing 1: 2 checkpoints, killed 3 min after the second commit
    assert lifetime_waste_seconds(600, 60, Lifetime(1500, preempted=True)) == pytest.approx(120 + 180)
    assert lifetime_waste_seconds(600, 60, Lifetime(1500, preempted=True, noticed=True)) == pytest.approx(120)
    assert lifetime_waste_seconds(600, 60, Lifetime(1300, preempted=True)) == pytest.approx(60 + 600 + 40)
    # most lifetimes end within 5 min of training, one runs 10 h: kills land early, so checkpointing less often
    # loses little more; Young/Daly at the observed rate checkpoints far more often
    young = [Lifetime(240, True)] * 20 + [Lifetime(36000, True)]
    est = estimate_preemptions(young, prior_per_hour=0.64)
    yd = checkpoint_interval(30, est, min_seconds=60, max_seconds=7200)
    fit = checkpoint_interval(30, est, min_seconds=60, max_seconds=7200, lifetimes=young)
    assert fit.basis == "lifetimes" and fit.seconds > 2 * yd.seconds and "least expected waste" in fit.explain()


def test_the_safety_net_keeps_a_reserve_for_work_a_kill_would_take_back():
    # 3.3 h left for 3 h of work and two 6-min restarts: spot still; with 20 min uncommitted on spot, on-demand
    base = dict(elapsed_seconds=6.7 * 3600, deadline_seconds=10 * 3600, work_done_seconds=5 * 3600,
                work_total_seconds=8 * 3600, restart_seconds=360)
    assert not decide_capacity(DeadlineState(**base)).locked
    locked = decide_capacity(DeadlineState(**base, reserve_seconds=1200))
    assert locked.locked and locked.capacity == ON_DEMAND and "reserve" in locked.reason
