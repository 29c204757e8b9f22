"""The cheapest zone: the pure placement policy, the oracle's dynamic program by hand, and the 9-zone V100 replay."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.planning import zones as zs
from orchestrator.planning.spot_traces import load_traces
from orchestrator.policy import placement as pl
from tests.helpers.paths import REPO

ROOT = REPO
V100 = ROOT / "data" / "spot-traces" / "availability" / "1-node" / "aws-02-15-2023"
HOUR = 3600.0
JOB = pl.JobState(work_left_seconds=10 * HOUR, restart_seconds=360, transfer_seconds=60, checkpoint_cost_seconds=30,
                  on_demand_usd=3.06)


def zone(name: str, usd: float = 0.92, **kw) -> pl.Zone:
    return pl.Zone(name, usd, kw.pop("available", True), kw.pop("prior_per_hour", 0.44), **kw)


def test_the_cheaper_zone_per_useful_hour_wins_and_a_zones_own_preemptions_count_against_it():
    assert pl.choose([zone("a", 0.92), zone("b", 0.80)], JOB).zone == "b"
    # b is cheaper per hour, but the job saw 6 preemptions in 2 h there: a is cheaper per useful hour
    stormy = zone("b", 0.80, held_hours=2.0, preemptions=6)
    assert pl.preemption_rate(stormy) == pytest.approx((0.44 * 4 + 6) / 6)
    assert pl.choose([zone("a", 0.92), stormy], JOB).zone == "a"
    calm = zone("a", 0.92, held_hours=40.0, preemptions=0)
    assert pl.preemption_rate(calm) < pl.preemption_rate(zone("a"))


def test_losses_the_job_watched_in_a_zone_it_did_not_hold_count_against_that_zone():
    # both zones up now and priced alike; while the job trained elsewhere it watched b lose its capacity 5 times
    # in 3 h and a none in 10 h: a is the safer bet, and b's rate is the prior blended with what was watched
    watched_b = zone("b", 0.90, seen_hours=3.0, seen_losses=5)
    assert pl.preemption_rate(watched_b) == pytest.approx((0.44 * 4 + 5) / 7)
    assert pl.choose([zone("a", 0.92, seen_hours=10.0), watched_b], JOB).zone == "a"
    assert pl.choose([zone("a", 0.92), zone("b", 0.90)], JOB).zone == "b"  # unwatched: the cheaper one


def test_a_zone_that_just_preempted_the_job_is_avoided_for_the_cooldown_while_another_has_capacity():
    just = zone("a", 0.50, since_preempted_seconds=120)
    assert pl.choose([just, zone("b", 0.92)], JOB).zone == "b"
    assert pl.choose([just, zone("b", 0.92, available=False)], JOB).zone == "a"  # the only capacity there is
    later = zone("a", 0.50, since_preempted_seconds=pl.DEFAULT_COOLDOWN_SECONDS + 1)
    assert pl.choose([later, zone("b", 0.92)], JOB).zone == "a"


def test_a_move_costs_a_restart_and_the_checkpoints_transfer_so_a_held_zone_is_kept_for_a_small_saving():
    held = pl.JobState(**{**JOB.__dict__, "current": "a", "checkpoint_zone": "a", "training": True,
                          "transfer_seconds": 600})
    assert pl.choose([zone("a", 0.92), zone("b", 0.91)], held).zone == "a"
    assert pl.choose([zone("a", 0.92), zone("b", 0.60)], held).zone == "b"
    assert pl.move_seconds("b", held) == 30 + 360 + 600 and pl.move_seconds("a", held) == 0


def test_the_deadline_takes_on_demand_when_spot_can_no_longer_make_it_and_waits_while_it_can():
    ample = pl.JobState(**{**JOB.__dict__, "time_left_seconds": 14 * HOUR})
    assert pl.choose([zone("a")], ample).zone == "a"
    tight = pl.JobState(**{**JOB.__dict__, "time_left_seconds": 10 * HOUR + 600})
    assert pl.choose([zone("a")], tight).zone == pl.ON_DEMAND
    nothing = [zone("a", available=False), zone("b", available=False)]
    # waiting is free but burns slack: it waits while the slack is over three times spot's expected waste
    # (10 h x (1/u - 1) = 1.5 h at the prior), and takes on-demand below that
    assert pl.choose(nothing, pl.JobState(**{**JOB.__dict__, "time_left_seconds": 16 * HOUR})).zone == pl.WAIT
    assert pl.choose(nothing, ample).zone == pl.ON_DEMAND
    assert pl.choose(nothing, JOB).zone == pl.WAIT  # no deadline: wait


def test_on_demand_when_spot_is_dearer_per_useful_hour():
    assert pl.choose([zone("a", 2.9, prior_per_hour=3.0)], JOB).zone == pl.ON_DEMAND
    # and waiting for that spot to come back would be pointless
    assert pl.choose([zone("a", 2.9, prior_per_hour=3.0, available=False)], JOB).zone == pl.ON_DEMAND


def _grid(available: list[list[int]], usd: list[float], on_demand: float = 10.0) -> zs.ZoneGrid:
    n = len(available[0])
    return zs.ZoneGrid([f"z{i}" for i in range(len(usd))], HOUR, [[bool(v) for v in row] for row in available],
                       [[p] * n for p in usd], [on_demand] * len(usd))


def test_the_oracle_by_hand():
    # hour ticks; z0 at $1/h is up at ticks 0-1 and 4-7, z1 at $3/h always; on-demand $10/h; 2 ticks of work
    grid = _grid([[1, 1, 0, 0, 1, 1, 1, 1], [1] * 8], [1.0, 3.0])
    # due in 5 h: z0 (start, train), then z1 (start, train): 1 + 1 + 3 + 3
    tight = zs.oracle(grid, zs.ZoneJob(work_seconds=2 * HOUR, deadline_seconds=5 * HOUR), [0])[0]
    assert tight.cost_usd == pytest.approx(8.0) and tight.paid_seconds == 4 * HOUR and tight.finished_at == 4 * HOUR
    # due in 6 h: z0, wait out its outage for free, z0 again (a second start)
    later = zs.oracle(grid, zs.ZoneJob(work_seconds=2 * HOUR, deadline_seconds=6 * HOUR), [0])[0]
    assert later.cost_usd == pytest.approx(4.0) and later.finished_at == 6 * HOUR and later.moves == 1
    # due in 7 h: wait for z0's second run and start once
    loose = zs.oracle(grid, zs.ZoneJob(work_seconds=2 * HOUR, deadline_seconds=7 * HOUR), [0])[0]
    assert loose.cost_usd == pytest.approx(3.0) and loose.finished_at == 7 * HOUR
    # no spot at all: on-demand, a start and two ticks
    none = zs.oracle(_grid([[0] * 8], [1.0]), zs.ZoneJob(work_seconds=2 * HOUR, deadline_seconds=5 * HOUR), [0])[0]
    assert none.cost_usd == pytest.approx(30.0)


def test_the_replay_pays_a_start_the_work_and_its_checkpoints():
    grid = _grid([[1] * 100], [1.0])
    job = zs.ZoneJob(work_seconds=3 * HOUR, restart_seconds=600, checkpoint_cost_seconds=60, transfer_seconds=0,
                     prior_per_hour=0.0)
    out = zs.replay(grid, job, 0)
    # no preemption expected: a checkpoint every hour (the upper bound), after the first and the second hour
    assert out.preemptions == 0 and out.on_demand_seconds == 0
    assert out.paid_seconds == pytest.approx(600 + 3 * HOUR + 2 * 60)
    assert out.cost_usd == pytest.approx(out.paid_seconds / HOUR)


def test_a_replay_pays_each_start_its_own_measured_restart():
    # z0 up for 2 ticks, down for 1, then up: a kill at tick 2; the first start takes 600 s, the second 900 s
    grid = _grid([[1, 1, 0] + [1] * 20], [1.0])
    job = zs.ZoneJob(work_seconds=2 * HOUR, restart_seconds=100, checkpoint_cost_seconds=0, transfer_seconds=0,
                     prior_per_hour=0.0, restart_schedule=(600.0, 900.0))
    out = zs.replay(grid, job, 0)
    assert out.preemptions == 1
    # first start: 600 s restart + 6600 s trained, of which the free checkpoint after the first hour kept 3600;
    # the tick down is free; then 900 s and the 3600 s left
    assert out.paid_seconds == pytest.approx(2 * HOUR + 900 + HOUR)
    assert out.lost_seconds == pytest.approx(6600 - HOUR)


def test_a_given_schedule_is_replayed_with_the_traces_preemptions_and_no_policy():
    # hour ticks; z0 at $1/h is up at ticks 0-1, down at 2, up after; z1 at $3/h always; 2 h of work
    grid = _grid([[1, 1, 0] + [1] * 20, [1] * 23], [1.0, 3.0])
    job = zs.ZoneJob(work_seconds=2 * HOUR, restart_seconds=600, checkpoint_cost_seconds=0, transfer_seconds=0,
                     prior_per_hour=0.0)
    dear = zs.replay_schedule(grid, job, 0, [(0, "z1", HOUR)])  # the policy would take z0; the schedule says z1
    assert dear.preemptions == 0 and dear.paid_seconds == pytest.approx(600 + 2 * HOUR)
    assert dear.cost_usd == pytest.approx((600 + 2 * HOUR) * 3 / HOUR)
    # z0, killed at tick 2 (the hour after the first checkpoint is lost), then z1 at tick 2
    moved = zs.replay_schedule(grid, job, 0, [(0, "z0", HOUR), (2, "z1", HOUR)])
    assert moved.preemptions == 1 and moved.lost_seconds == pytest.approx(HOUR - 600)
    assert moved.paid_seconds == pytest.approx(2 * HOUR + 600 + HOUR)
    assert moved.cost_usd == pytest.approx(2 + (600 + HOUR) * 3 / HOUR)


def test_on_the_9_zone_v100_set_placement_is_within_5_percent_of_the_oracle_and_misses_no_deadline():
    """The issue's bar: a 48 h job due in 52 h over 40 windows, preemptions noticed (AWS's two-minute notice;
    a 30 s checkpoint fits in it), 6 min restarts, 1 min transfers: placement costs at most 1.05x the oracle,
    misses nothing, and is far below staying in one zone."""
    grid = zs.zone_grid(load_traces(V100), 0.92, 3.06)
    job = zs.ZoneJob(work_seconds=48 * HOUR, deadline_seconds=52 * HOUR, notice_share=1.0)
    rows = {r["policy"]: r for r in zs.simulate_zones(grid, job, ["placement", "single-zone", "oracle"], 40)}
    placement, single, oracle = rows["placement"], rows["single-zone"], rows["oracle"]
    assert placement["windows"] == oracle["windows"] == 40
    assert placement["deadline_misses"] == oracle["deadline_misses"] == 0
    assert placement["cost_vs_on_demand"] <= 1.05 * oracle["cost_vs_on_demand"], rows
    assert placement["cost_vs_on_demand"] < single["best_zone_cost_vs_on_demand"] < single["cost_vs_on_demand"]


def test_without_notices_placement_keeps_within_1_3x_of_the_oracle_on_the_9_zone_v100_set():
    """The same job with no preemption notices (the default): every kill loses the work since the last commit,
    and spot's waste in the stormy windows outruns the 4 h of slack, so some on-demand is forced. Watching the
    zones it does not hold (their losses of capacity) brought it from 1.46x to 1.27x of the oracle; 1.05x is out
    of reach for a causal policy (docs/spot-economics.md, "The cheapest zone")."""
    grid = zs.zone_grid(load_traces(V100), 0.92, 3.06)
    job = zs.ZoneJob(work_seconds=48 * HOUR, deadline_seconds=52 * HOUR)
    rows = {r["policy"]: r for r in zs.simulate_zones(grid, job, ["placement", "oracle"], 40)}
    assert rows["placement"]["deadline_misses"] == 0
    assert rows["placement"]["cost_vs_on_demand"] <= 1.3 * rows["oracle"]["cost_vs_on_demand"], rows


def _write(path: Path, data, **meta) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600, **meta}, "data": data}))
    return path


def test_each_zones_price_comes_from_its_trace_and_the_cheaper_zone_is_taken(tmp_path):
    # SkyNomad's converted format: 1 = preempted, prices in the metadata (or one per tick)
    _write(tmp_path / "sky" / "dear.json", [0] * 200, price_info={"price": 1.5, "on_demand_price": 4.0})
    _write(tmp_path / "sky" / "cheap.json", [0] * 200, prices=[0.5] * 200, price_info={"on_demand_price": 3.0})
    (tmp_path / "conventions.json").write_text(json.dumps({"sky": {"available_value": 0}}))
    grid = zs.zone_grid(load_traces(tmp_path / "sky"), 0.92, 3.06)
    assert grid.cheapest_on_demand == 3.0
    out = zs.replay(grid, zs.ZoneJob(work_seconds=5 * HOUR, restart_seconds=600, transfer_seconds=0), 0)
    assert out.cost_usd == pytest.approx(out.paid_seconds * 0.5 / HOUR)  # all of it in the cheap zone


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", "simulate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.e2e
def test_cli_zones_json_and_bad_input(tmp_path):
    done = _cli("--traces", str(V100), "--zones", "us-west-2a,us-east-1c", "--job-hours", "4", "--deadline-hours",
                "6", "--policy", "placement,single-zone,oracle", "--windows", "3", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["policy"]: r for r in json.loads(done.stdout)}
    assert set(rows) == {"placement", "single-zone", "oracle"}
    for r in rows.values():
        assert {"windows", "deadline_misses", "cost_vs_on_demand", "goodput"} <= set(r)
    assert set(rows["single-zone"]["zones"]) == {"us-west-2a_v100_1", "us-east-1c_v100_1"}
    assert rows["oracle"]["cost_vs_on_demand"] <= rows["placement"]["cost_vs_on_demand"]
    unknown = _cli("--traces", str(V100), "--zones", "mars-1a", "--job-hours", "4")
    assert unknown.returncode != 0 and "mars-1a" in unknown.stderr and unknown.stderr.count("\n") == 1
    mixed = _cli("--traces", str(ROOT / "data" / "spot-traces" / "availability"), "--zones", "all", "--job-hours", "4")
    assert mixed.returncode != 0 and "one tick length" in mixed.stderr and "Traceback" not in mixed.stderr
