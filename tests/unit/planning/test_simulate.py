"""orchestrator simulate: hand-computed replays, the policies' behaviour, the CLI's JSON, one real trace."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.planning import simulate as sim
from orchestrator.policy.deadline import ON_DEMAND, SPOT, DeadlineState, decide_capacity
from orchestrator.planning.spot_traces import load_trace, load_traces
from tests.helpers.paths import REPO

ROOT = REPO
V100 = ROOT / "data" / "spot-traces" / "availability" / "1-node" / "aws-02-15-2023"
MIN = 60.0

# 60 minutes of spot, 30 without, over and over (ticks of a minute)
CYCLE = sim.Trace.from_ticks("cycle", [0] * 60 + [1] * 30, 60, available_value=0)
# a 2 h job, 6 min restarts, a 1 min checkpoint after every 20 min of training
HAND = sim.Job(work_seconds=120 * MIN, restart_seconds=6 * MIN, checkpoint_cost_seconds=1 * MIN, every=20 * MIN)


def test_hard_kills_lose_the_work_since_the_last_commit():
    # each 60-min lifetime: 6 restart, 2 x (20 train + 1 checkpoint) = 40 committed, 12 more trained and lost;
    # the third: 6 restart + 20 + 1 + 20 = 47 min, done (80 + 40 = 120). Paid 60 + 60 + 47 = 167 min.
    out = sim.simulate_window(HAND, CYCLE, 0.0, "spot")
    assert out.finished and out.preemptions == 2
    assert out.lost_seconds == pytest.approx(24 * MIN)
    assert out.paid_spot_seconds == pytest.approx(167 * MIN) and out.paid_on_demand_seconds == 0
    assert out.elapsed_seconds == pytest.approx((180 + 47) * MIN)  # two 30-min waits, paid nothing
    assert out.goodput == pytest.approx(120 / 167)


def test_honoured_notices_lose_nothing():
    # every preemption noticed: the 12 trained minutes are saved; 52 + 52 after two lifetimes, 16 left:
    # 6 restart + 16 train = 22 min. Paid 60 + 60 + 22 = 142.
    out = sim.simulate_window(sim.Job(**{**HAND.__dict__, "notice_share": 1.0}), CYCLE, 0.0, "spot")
    assert out.lost_seconds == 0 and out.preemptions == 2
    assert out.paid_spot_seconds == pytest.approx(142 * MIN)
    assert out.goodput == pytest.approx(120 / 142)
    half = sim.simulate_window(sim.Job(**{**HAND.__dict__, "notice_share": 0.5}), CYCLE, 0.0, "spot")
    assert 0 < half.lost_seconds < 24 * MIN  # one of the two kills noticed


def test_on_demand_pays_one_start_and_its_checkpoints_and_is_the_cost_baseline():
    out = sim.simulate_window(HAND, None, 0.0, "on-demand")
    assert out.paid_on_demand_seconds == pytest.approx((6 + 120 + 5) * MIN)  # checkpoints at 20, 40, .., 100
    summary = sim.summarise(HAND, "on-demand", [out])
    assert summary.cost_vs_on_demand == pytest.approx(1.0)
    spot = sim.summarise(HAND, "spot", [sim.simulate_window(HAND, CYCLE, 0.0, "spot")])
    assert spot.cost_vs_on_demand == pytest.approx(167 * HAND.spot_usd / (131 * HAND.on_demand_usd))


def test_the_requeue_caps_stop_a_job_as_the_supervisor_would():
    out = sim.simulate_window(sim.Job(**{**HAND.__dict__, "max_preemptions": 2}), CYCLE, 0.0, "spot")
    assert not out.finished and "requeue.max_preemptions=2" in out.stopped
    assert out.work_seconds == pytest.approx(80 * MIN)  # what was committed


def test_auto_learns_the_lifetimes_and_lengthens_or_shortens_the_interval():
    job = sim.Job(**{**HAND.__dict__, "every": sim.AUTO, "checkpoint_cost_seconds": 30.0, "prior_per_hour": 0.64})
    out = sim.simulate_window(job, CYCLE, 0.0, "spot")
    first, later = out.intervals[0], out.intervals[-1]
    # the prior alone: Young/Daly sqrt(2 x 30 x 3600/0.64); the lifetimes seen (54 min each, then killed) differ
    assert first == pytest.approx((2 * 30 * 3600 / 0.64) ** 0.5, rel=1e-6)
    assert later != pytest.approx(first)


def test_deadline_policy_takes_on_demand_when_waiting_behind_the_line():
    no_spot = sim.Trace.from_ticks("never", [1] * 100, 60, available_value=0)
    job = sim.Job(work_seconds=60 * MIN, restart_seconds=6 * MIN, checkpoint_cost_seconds=30, every=20 * MIN,
                  deadline_seconds=180 * MIN)
    up = sim.simulate_window(job, no_spot, 0.0, "deadline")
    late = sim.simulate_window(job, no_spot, 0.0, "late-switch")
    # it waits (for free) while the slack is over half the work left: 180 - 60 = 120 min of slack until 90 min in
    assert up.finished and 90 * MIN <= up.elapsed_seconds - 66 * MIN < 95 * MIN
    assert late.finished and 170 * MIN < late.elapsed_seconds <= 180 * MIN  # waited for spot until the last moment
    assert up.paid_spot_seconds == late.paid_spot_seconds == 0
    tight = sim.simulate_window(sim.Job(**{**job.__dict__, "deadline_seconds": 80 * MIN}), no_spot, 0.0, "deadline")
    assert tight.finished and tight.elapsed_seconds < 2 * MIN + 67 * MIN  # little slack: on-demand at once


def test_uniform_progress_keeps_held_spot_and_leaves_on_demand_only_for_spot_that_is_there():
    behind = dict(elapsed_seconds=40 * 3600, deadline_seconds=100 * 3600, work_done_seconds=10 * 3600,
                  work_total_seconds=50 * 3600, restart_seconds=600)
    assert decide_capacity(DeadlineState(**behind)).capacity == SPOT  # holding spot: keep it
    assert decide_capacity(DeadlineState(**behind, spot_available=False)).capacity == ON_DEMAND
    ahead = {**behind, "work_done_seconds": 22 * 3600, "current": ON_DEMAND}
    assert decide_capacity(DeadlineState(**ahead)).capacity == SPOT
    assert decide_capacity(DeadlineState(**ahead, spot_available=False)).capacity == ON_DEMAND


def test_trace_reading_and_cyclic_availability(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 10}, "data": [0, 0, 1, 0, 1, 1]}))
    tr = load_trace(path, available_value=0)
    assert (tr.starts, tr.ends, tr.period) == ((0.0, 30.0), (20.0, 40.0), 60.0)
    assert tr.spot_at(5) == (True, 20.0) and tr.spot_at(45) == (False, 60.0) and tr.spot_at(65) == (True, 80.0)
    assert load_trace(path, available_value=1).starts == (20.0, 40.0)  # the same file, the other convention
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a spot trace"):
        load_traces(tmp_path, available_value=1)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", "simulate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.e2e
def test_cli_json_shape_and_bad_input():
    done = _cli("--traces", str(V100 / "us-east-1a_v100_1.json"), "--job-hours", "2", "--deadline-hours", "4",
                "--policy", "deadline", "--windows", "5", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert {"policy", "windows", "deadline_misses", "cost_vs_on_demand", "goodput"} <= set(doc)
    assert doc["policy"] == "deadline" and doc["windows"] == 5 and 0 < doc["goodput"] <= 1
    bad = _cli("--traces", str(V100), "--job-hours", "2", "--policy", "deadline")
    assert bad.returncode == 2 and "--deadline-hours" in bad.stderr and "Traceback" not in bad.stderr


def test_on_a_real_v100_trace_auto_matches_hindsight_and_the_deadline_policy_holds():
    """us-east-1c (47% spot, 0.67 preemptions per available hour, the 9-zone set): auto within a point of the best fixed interval in hindsight and
    3+ points above a fixed 30 minutes; Uniform Progress misses no deadline and, at a tight deadline, costs
    less than spot-until-late."""
    trace = load_trace(V100 / "us-east-1c_v100_1.json")
    job = sim.Job(work_seconds=8 * 3600)
    sweep = sim.interval_sweep(job, trace, windows=20, minutes=(5, 7, 10, 12, 15, 20, 30))
    assert sweep["auto"] >= sweep["best"] - 0.01, sweep
    assert sweep["auto"] >= sweep["fixed_30m"] + 0.03, sweep
    tight = sim.Job(work_seconds=8 * 3600, deadline_seconds=10 * 3600)
    up, late = (sim.simulate(tight, [trace], p, windows=20) for p in ("deadline", "late-switch"))
    assert up.deadline_misses == 0
    assert up.cost_vs_on_demand < late.cost_vs_on_demand


# ---------------------------------------------------------------- issue 43: the traces' declared convention


def test_the_public_v100_set_reads_one_as_available_us_east_1a_is_the_scarce_zone():
    """The source repository counts available instances: us-east-1a holds capacity 16.7% of the time, the
    us-west-2 zones 88-91%, and at 99.2% of the ticks at least one of the 9 zones has capacity."""
    traces = {Path(t.name).name.split("_")[0]: t for t in load_traces(V100)}
    assert traces["us-east-1a"].available_share == pytest.approx(0.167, abs=0.0005)
    assert "conventions.json" in traces["us-east-1a"].convention
    assert all(0.88 <= traces[z].available_share <= 0.91 for z in ("us-west-2a", "us-west-2b", "us-west-2c"))
    flags = [t.available_ticks() for t in traces.values()]
    union = sum(any(column) for column in zip(*flags)) / len(flags[0])
    assert union == pytest.approx(0.992, abs=0.0005)


def test_the_prior_is_the_median_of_the_13_v100_files_read_right():
    import statistics

    from orchestrator.money.cost import DEFAULT_SPOT_PREEMPTIONS_PER_HOUR

    sets = [V100, ROOT / "data" / "spot-traces" / "preemption" / "1-node" / "aws-04-22-2023"]
    rates = [t.preemptions_per_available_hour for s in sets for t in load_traces(s)]
    assert len(rates) == 13
    assert DEFAULT_SPOT_PREEMPTIONS_PER_HOUR == pytest.approx(statistics.median(rates), abs=0.005)


def _write(path: Path, data, **meta) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"gap_seconds": 60, **meta}, "data": data}))
    return path


def test_a_convention_is_found_in_a_parent_keyed_by_the_set_and_an_undeclared_set_is_refused(tmp_path):
    skynomad = _write(tmp_path / "sky" / "conv" / "z1.json", [1, 0, 0, 0],
                      price_info={"price": 0.5, "on_demand_price": 2.0})
    (tmp_path / "conventions.json").write_text(json.dumps({"sky/conv": {"available_value": 0}}))
    tr = load_trace(skynomad)
    assert tr.available_share == pytest.approx(0.75)  # SkyNomad's TraceEnv: 1 = preempted
    assert (tr.spot_usd, tr.on_demand_usd) == (0.5, 2.0)
    stray = _write(tmp_path / "other" / "z2.json", [1, 0, 0, 0])
    with pytest.raises(ValueError, match="no declared convention"):
        load_trace(stray)
    assert load_trace(stray, available_value=1).available_share == pytest.approx(0.25)


@pytest.mark.e2e
def test_cli_refuses_an_undeclared_trace_and_prints_each_traces_available_share(tmp_path):
    trace = _write(tmp_path / "set" / "z.json", [1] * 30 + [0] * 90)
    refused = _cli("--traces", str(tmp_path / "set"), "--job-hours", "1", "--policy", "spot", "--windows", "2")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert refused.stderr.count("\n") == 1 and "no declared convention" in refused.stderr
    assert "--available-value" in refused.stderr
    done = _cli("--traces", str(trace), "--available-value", "1", "--job-hours", "0.5", "--policy", "spot",
                "--windows", "2", "--per-trace", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["per_trace"][str(trace)][0]["available_share"] == 0.25
