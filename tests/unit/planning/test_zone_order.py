"""``planning.zone_order.ranked_zones``: compute.zones in the placement policy's order, from the price cache in the
job's storage, the catalog and the job's own ledger (its preemptions per zone, its pace, its checkpoint's size)."""
from __future__ import annotations

import time

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.money.prices import FetchedPrice, write_cache
from orchestrator.planning.zone_order import ON_DEMAND, ranked_zones
from orchestrator.records.ledger_record import LedgerRecord
from orchestrator.storage.local import LocalStore
from tests.helpers.backends import compose

NOW = 1_800_000_000.0


def _cfg(tmp_path, *extra: str):
    cfg, _ = compose("local", f"storage.uri={tmp_path}/runs", "storage.endpoint_url=null", "compute.cloud=aws",
                     "compute.zones=[us-east-1a,us-east-1b,us-west-2a]", *extra)
    return cfg


def _prices(store, **usd_by_zone: float) -> None:
    """The price cache (``orchestrator prices refresh``'s) with one p5.48xlarge spot price per zone."""
    write_cache(store, [FetchedPrice("h100-80gb", "aws", "spot", zone[:-1], zone, "p5.48xlarge", 8, usd, NOW - 60,
                                     "aws ec2 spot price history") for zone, usd in
                        ((z.replace("_", "-"), u) for z, u in usd_by_zone.items())])


def _attempt(fence: int, zone: str, exit_class: str, *, started: float, ended: float, steps=(0, 10),
             restart_s: float = 5.0) -> dict:
    return {"fence": fence, "exit_class": exit_class, "host": "h", "started_at": started, "ended_at": ended,
            "last_seen": ended, "step_start": steps[0], "step_end": steps[1], "checkpoint_step_end": steps[1],
            "cost_usd": 1.0, "gpus": 8, "spot": True, "zone": zone,
            "extra": {"restart": {"total_s": restart_s},
                      "checkpoint_interval": {"checkpoint_cost_s": 30.0, "cost_source": "measured"}}}


# an attempt elsewhere that measured the job's pace: 10 steps in 100 s of training, 10 s a step
PACE = _attempt(1, "us-east-1c", "completed", started=NOW - 9000, ended=NOW - 8895, steps=(0, 11))


def _ledger(attempts: list[dict], *, step: int = 10, checkpoint_bytes: int = 0) -> LedgerRecord:
    checkpoints = [{"step": step, "key": "k", "size": checkpoint_bytes, "time": NOW - 100, "fence": 1}]
    return LedgerRecord.decode({"run_name": "exp1", "status": "running", "fence": len(attempts), "attempts": attempts,
                                "checkpoints": checkpoints if checkpoint_bytes else [], "step": step}, "ledger.json")


def test_unset_zones_rank_nothing(tmp_path):
    cfg = _cfg(tmp_path, "compute.zones=null")
    assert ranked_zones(cfg, LocalStore(tmp_path / "runs"), None, NOW) == []


def test_the_cheapest_zone_comes_first_with_its_fetched_price_and_a_reason(tmp_path):
    store = LocalStore(tmp_path / "runs")
    _prices(store, us_east_1a=40.0, us_east_1b=30.0, us_west_2a=35.0)
    ranked = ranked_zones(_cfg(tmp_path), store, None, NOW)
    assert [r.zone for r in ranked] == ["us-east-1b", "us-west-2a", "us-east-1a"]
    first = ranked[0]
    assert (first.region, first.usd_per_hour) == ("us-east-1", 30.0)
    assert first.usd_per_useful_hour > first.usd_per_hour  # restarts and checkpoints are paid for
    assert "per useful hour" in first.reason and "$30.000/h spot (fetched" in first.reason


def test_a_zone_that_just_preempted_the_job_cools_down(tmp_path):
    store = LocalStore(tmp_path / "runs")
    _prices(store, us_east_1a=30.0, us_east_1b=31.0, us_west_2a=32.0)
    cfg = _cfg(tmp_path, "compute.zone_cooldown=10m")
    # preempted in the cheapest zone 2 minutes ago
    recent = _ledger([_attempt(1, "us-east-1a", "preempted", started=NOW - 1000, ended=NOW - 120)])
    ranked = ranked_zones(cfg, store, recent, NOW)
    assert ranked[0].zone == "us-east-1b" and ranked[-1].zone == "us-east-1a"
    assert "preempted the job 2 min ago" in ranked[-1].reason
    # 20 minutes ago: the cooldown is over, and one preemption in 0.2 h does not outweigh $1/h
    older = _ledger([_attempt(1, "us-east-1a", "preempted", started=NOW - 2000, ended=NOW - 1200)])
    assert ranked_zones(cfg, store, older, NOW)[0].zone == "us-east-1a"


def test_the_jobs_own_preemptions_in_a_zone_raise_its_expected_cost(tmp_path):
    store = LocalStore(tmp_path / "runs")
    _prices(store, us_east_1a=30.0, us_east_1b=31.0)
    # a 10-minute restart after each preemption, 1000 steps of 10 s
    cfg = _cfg(tmp_path, "compute.zones=[us-east-1a,us-east-1b]", "compute.zone_cooldown=0",
               "compute.restart_seconds=600", "train.max_steps=1000")
    hours = 3600.0
    lossy = [_attempt(n, "us-east-1a", "preempted", started=NOW - (10 - n) * hours, ended=NOW - (10 - n) * hours + 600)
             for n in range(2, 8)]
    ranked = ranked_zones(cfg, store, _ledger([PACE, *lossy]), NOW)
    assert [r.zone for r in ranked] == ["us-east-1b", "us-east-1a"]
    assert "6 of the job's own" in ranked[1].reason


def test_egress_from_the_buckets_region_makes_a_far_zone_lose(tmp_path):
    store = LocalStore(tmp_path / "runs")
    _prices(store, us_east_1a=30.0, us_west_2a=29.0)
    big = _ledger([PACE], checkpoint_bytes=200 * 10**9)  # a 200 GB checkpoint: $4 per start across regions
    near = _cfg(tmp_path, "compute.zones=[us-east-1a,us-west-2a]", "storage.region=us-east-1", "train.max_steps=1000")
    ranked = ranked_zones(near, store, big, NOW)
    assert [r.zone for r in ranked] == ["us-east-1a", "us-west-2a"]
    assert "$4.00 egress per start from the bucket's us-east-1" in ranked[1].reason
    assert "aws.amazon.com" in ranked[1].reason  # the egress figure's source
    # the same zones with the bucket in us-west-2: the cheaper zone is also the near one
    far = _cfg(tmp_path, "compute.zones=[us-east-1a,us-west-2a]", "storage.region=us-west-2", "train.max_steps=1000")
    assert ranked_zones(far, store, big, NOW)[0].zone == "us-west-2a"


def test_a_deadline_spot_can_no_longer_make_ranks_every_zone_on_demand(tmp_path):
    store = LocalStore(tmp_path / "runs")
    _prices(store, us_east_1a=30.0, us_east_1b=31.0, us_west_2a=32.0)
    # 10 steps in 100 s of training: 10 s a step; 990 steps left = 9900 s of work, 2.75 h
    pace = [_attempt(1, "us-east-1a", "preempted", started=NOW - 3000, ended=NOW - 2895, steps=(0, 11))]
    tight = _cfg(tmp_path, "run.deadline=3h", "train.max_steps=1000")
    ranked = ranked_zones(tight, store, _ledger(pace), NOW)
    assert {r.capacity for r in ranked} == {ON_DEMAND}
    assert "deadline" in ranked[0].reason and ranked[0].reason.startswith("on-demand")
    roomy = _cfg(tmp_path, "run.deadline=30h", "train.max_steps=1000")
    assert {r.capacity for r in ranked_zones(roomy, store, _ledger(pace), NOW)} == {"spot"}


def test_auto_ranks_every_zone_with_a_cached_price(tmp_path):
    store = LocalStore(tmp_path / "runs")
    _prices(store, us_east_1a=30.0, eu_west_1b=20.0)
    ranked = ranked_zones(_cfg(tmp_path, "compute.zones=auto"), store, None, NOW)
    assert sorted(r.zone for r in ranked) == ["eu-west-1b", "us-east-1a"]


def test_auto_with_no_prices_says_to_refresh_them(tmp_path):
    with pytest.raises(ConfigError) as err:
        ranked_zones(_cfg(tmp_path, "compute.zones=auto"), LocalStore(tmp_path / "runs"), None, time.time())
    assert "orchestrator prices refresh" in str(err.value) and "compute.zones=[" in str(err.value)
