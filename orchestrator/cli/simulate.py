"""``orchestrator simulate``'s command line: its options, their checks, the job they describe, and the tables and
JSON it prints. The model it drives (``Job``, ``simulate``, ``interval_sweep``) is ``orchestrator.planning.simulate``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Optional, Sequence, cast

from orchestrator.core.console import Parser, fail
from orchestrator.core.durations import parse_duration
from orchestrator.planning import simulate as model
from orchestrator.planning.simulate import (
    DEADLINE_POLICIES,
    ON_DEMAND_USD,
    POLICIES,
    SPOT_USD,
    Job,
    Summary,
    interval_sweep,
    simulate,
)
from orchestrator.planning.spot_traces import Trace, load_traces
from orchestrator.planning.zones import ZONE_POLICIES
from orchestrator.policy.interval import AUTO, MAX_EVERY, MIN_EVERY


def _parser() -> Parser:
    p = Parser(prog="orchestrator simulate", description=model.__doc__.split("\n\n")[0])
    p.add_argument("--traces", required=True, help="a trace file or a folder of them (data/spot-traces/...)")
    p.add_argument(
        "--available-value",
        type=int,
        choices=(0, 1),
        help="the value that means spot capacity in every trace read (default: each set's declared "
        "convention, conventions.json beside the traces or above them; undeclared sets are refused)",
    )
    p.add_argument("--job-hours", type=float, required=True, help="useful training the job needs, in hours")
    p.add_argument("--deadline-hours", type=float, help="deadline from the job's start (deadline, late-switch need it)")
    p.add_argument("--restart-minutes", type=float, default=6.0, help="one restart: start to first step (default 6)")
    p.add_argument("--checkpoint-cost-seconds", type=float, default=30.0, help="training time one checkpoint costs")
    p.add_argument("--checkpoint-every", default=AUTO, help="auto (Young/Daly, re-derived per attempt) or a duration")
    p.add_argument("--min-every", default=MIN_EVERY, help=f"auto's lower bound (default {MIN_EVERY})")
    p.add_argument("--max-every", default=MAX_EVERY, help=f"auto's upper bound (default {MAX_EVERY})")
    p.add_argument(
        "--policy",
        default="all",
        help=f"capacity policy: {', '.join(POLICIES)} or all (every one the options allow); with --zones "
        f"a comma list of {', '.join(ZONE_POLICIES)} (default: all three)",
    )
    p.add_argument(
        "--zones",
        help="place the job over the time-aligned traces of several zones: all, or a comma "
        "list of zone names (us-west-2a,us-east-1c)",
    )
    p.add_argument(
        "--transfer-minutes",
        type=float,
        default=1.0,
        help="with --zones: moving the checkpoint (and weights) to another zone (default 1)",
    )
    p.add_argument(
        "--cooldown-minutes",
        type=float,
        default=10.0,
        help="with --zones: a zone that just preempted the job is avoided this long (default 10)",
    )
    p.add_argument("--notice-share", type=float, default=0.0, help="share of preemptions with an honoured notice")
    p.add_argument("--preemptions-per-hour", type=float, help="auto's prior rate (default: the catalog's prior)")
    p.add_argument("--max-preemptions", type=int, help="requeue.max_preemptions (default: the config's)")
    p.add_argument("--spot-price", type=float, default=SPOT_USD, help="USD per hour on spot")
    p.add_argument("--on-demand-price", type=float, default=ON_DEMAND_USD, help="USD per hour on demand")
    p.add_argument("--windows", type=int, default=40, help="start windows per trace")
    p.add_argument("--per-trace", action="store_true", help="also print each trace's figures")
    p.add_argument(
        "--sweep-intervals",
        action="store_true",
        help="per trace: goodput of auto beside fixed intervals (best in hindsight, 30m)",
    )
    p.add_argument("--json", action="store_true", help="print JSON (one object for one policy, else a list)")
    return p


# each number option's range: (low, low included, high, high included)
OPTION_RANGES = {
    "job_hours": (0.0, False, None, False),
    "deadline_hours": (0.0, False, None, False),
    "restart_minutes": (0.0, True, None, False),
    "checkpoint_cost_seconds": (0.0, True, None, False),
    "notice_share": (0.0, True, 1.0, True),
    "preemptions_per_hour": (0.0, True, None, False),
    "max_preemptions": (0, True, None, False),
    "spot_price": (0.0, True, None, False),
    "on_demand_price": (0.0, False, None, False),
    "windows": (1, True, None, False),
    "transfer_minutes": (0.0, True, None, False),
    "cooldown_minutes": (0.0, True, None, False),
}


def _job_from_args(a: argparse.Namespace) -> Job:
    from orchestrator.config.schema import ComputeConfig, RequeueConfig
    from orchestrator.core.numbers import check_options
    from orchestrator.money.cost import preemption_prior_per_hour

    check_options(a, OPTION_RANGES)  # NaN, infinity and negative prices or times (--job-hours > 0)
    if a.deadline_hours is not None and a.deadline_hours < a.job_hours:
        raise ValueError(
            f"--deadline-hours {a.deadline_hours:g} is shorter than --job-hours {a.job_hours:g}: "
            "no capacity can meet it; give a later deadline."
        )
    every: str | float = (
        AUTO
        if str(a.checkpoint_every).strip().lower() == AUTO
        else parse_duration(a.checkpoint_every, key="--checkpoint-every")
    )
    if every != AUTO and cast(float, every) <= 0:
        raise ValueError("--checkpoint-every must be auto or a positive duration (15m, 900s)")
    low, high = parse_duration(a.min_every, key="--min-every"), parse_duration(a.max_every, key="--max-every")
    if low <= 0 or high < low:
        raise ValueError(
            f"--min-every {a.min_every} and --max-every {a.max_every}: auto's bounds need "
            "0 < --min-every <= --max-every (e.g. --min-every 1m --max-every 1h)."
        )
    compute = ComputeConfig(spot=True, gpu_type="v100", cloud="aws", preemptions_per_hour=a.preemptions_per_hour)
    prior, _ = preemption_prior_per_hour(compute, _catalog())
    requeue = RequeueConfig()
    return Job(
        work_seconds=a.job_hours * 3600,
        restart_seconds=a.restart_minutes * 60,
        checkpoint_cost_seconds=a.checkpoint_cost_seconds,
        every=every,
        deadline_seconds=a.deadline_hours * 3600 if a.deadline_hours is not None else None,
        notice_share=a.notice_share,
        prior_per_hour=prior,
        min_every_seconds=low,
        max_every_seconds=high,
        spot_usd=a.spot_price,
        on_demand_usd=a.on_demand_price,
        max_preemptions=a.max_preemptions if a.max_preemptions is not None else requeue.max_preemptions,
        max_failures=requeue.max_failures,
    )


def _catalog() -> dict:
    from orchestrator.money.cost import load_catalog

    try:
        return load_catalog()
    except (OSError, ValueError):
        return {}


def _row(s: Summary) -> str:
    return (
        f"  {s.policy:<12}{s.windows:>8}{s.deadline_misses:>8}{s.unfinished:>8}{s.cost_vs_on_demand:>10.3f}"
        f"{s.goodput:>9.3f}{s.lost_work_hours:>10.2f}{s.preemptions:>8.1f}"
    )


# misses: deadline missed or never finished; unfinished: stopped by the requeue caps (or never finished)
HEADER = (
    f"  {'policy':<12}{'windows':>8}{'misses':>8}{'unfin.':>8}{'cost/OD':>10}{'goodput':>9}{'lost h':>10}{'preempt':>8}"
)


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        job = _job_from_args(args)
        traces = load_traces(args.traces, args.available_value)
        if args.zones:
            return _zones_main(args, job, traces)
        if args.policy not in POLICIES + ("all",):
            raise ValueError(
                f"--policy {args.policy}: choose one of {', '.join(POLICIES)} or all (with --zones: "
                f"{', '.join(ZONE_POLICIES)})"
            )
        policies = (
            [args.policy]
            if args.policy != "all"
            else [p for p in POLICIES if job.deadline_seconds is not None or p not in DEADLINE_POLICIES]
        )
        if job.deadline_seconds is None and set(policies) & set(DEADLINE_POLICIES):
            raise ValueError(f"--policy {args.policy} needs --deadline-hours")
    except ValueError as err:
        return fail(err)
    results = [simulate(job, traces, p, args.windows) for p in policies]
    per_trace = (
        {tr.name: [simulate(job, [tr], p, args.windows) for p in policies] for tr in traces} if args.per_trace else {}
    )
    sweeps = [interval_sweep(job, tr, args.windows) for tr in traces] if args.sweep_intervals else []
    if args.json:
        doc = [r.as_json() for r in results]
        out: object = doc[0] if len(doc) == 1 else doc
        if per_trace or sweeps:
            share = {tr.name: round(tr.available_share, 4) for tr in traces}
            out = {
                "results": doc,
                "per_trace": {
                    k: [{**r.as_json(), "available_share": share[k]} for r in v] for k, v in per_trace.items()
                },
                "sweeps": sweeps,
            }
        print(json.dumps(out, indent=1))
        return 0
    print(_describe(job, traces, args.windows))
    print(HEADER)
    for r in results:
        print(_row(r))
    shares = {tr.name: tr.available_share for tr in traces}
    for name, rows in per_trace.items():
        print(f"{Path(name).name}: spot capacity {shares[name]:.1%} of the time")
        for r in rows:
            print(_row(r))
    if sweeps:
        print("checkpoint interval, spot policy, goodput per trace: auto | best fixed in hindsight | fixed 30m")
        for s in sweeps:
            print(
                f"  {Path(s['trace']).name:<24} auto {s['auto']:.3f} | {s['best_minutes']:g}m {s['best']:.3f} "
                f"(auto {100 * (s['auto'] - s['best']):+.1f} pts) | 30m {s['fixed_30m']:.3f} "
                f"(auto {100 * (s['auto'] - s['fixed_30m']):+.1f} pts)"
            )
    return 0


def _zones_main(args: argparse.Namespace, job: Job, traces: Sequence[Trace]) -> int:
    """``--zones``: the job placed over several zones' aligned traces (``planning.zones``)."""
    from orchestrator.planning import zones as zs

    wanted = [w.strip() for w in args.zones.split(",") if w.strip()]
    if wanted != ["all"]:
        names = {Path(t.name).stem: t for t in traces}
        unknown = [w for w in wanted if not any(n == w or n.startswith(w + "_") for n in names)]
        if unknown:
            raise ValueError(
                f"--zones {','.join(unknown)}: not among the traces' zones "
                f"({', '.join(sorted(names))}); give all or some of them"
            )
        traces = [t for n, t in names.items() if any(n == w or n.startswith(w + "_") for w in wanted)]
    policies = list(ZONE_POLICIES) if args.policy == "all" else [p.strip() for p in args.policy.split(",")]
    bad = [p for p in policies if p not in ZONE_POLICIES]
    if bad:
        raise ValueError(f"--policy {','.join(bad)}: with --zones choose from {', '.join(ZONE_POLICIES)}")
    grid = zs.zone_grid(traces, job.spot_usd, job.on_demand_usd)
    zone_job = zs.ZoneJob(
        work_seconds=job.work_seconds,
        deadline_seconds=job.deadline_seconds,
        restart_seconds=job.restart_seconds,
        transfer_seconds=args.transfer_minutes * 60,
        checkpoint_cost_seconds=job.checkpoint_cost_seconds,
        notice_share=job.notice_share,
        prior_per_hour=job.prior_per_hour,
        cooldown_seconds=args.cooldown_minutes * 60,
    )
    rows = zs.simulate_zones(grid, zone_job, policies, args.windows)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"simulate --zones: {len(grid.names)} zones x {args.windows} windows of {grid.gap_seconds:g} s ticks; job "
        f"{job.work_seconds / 3600:g} h"
        + (f", deadline {job.deadline_seconds / 3600:g} h" if job.deadline_seconds else "")
        + f", restart {job.restart_seconds:g}s, transfer {zone_job.transfer_seconds:g}s, checkpoint "
        f"{job.checkpoint_cost_seconds:g}s, {job.notice_share:.0%} noticed, prior {job.prior_per_hour:g}/h"
    )
    print(
        f"  {'policy':<13}{'windows':>8}{'misses':>8}{'cost/OD':>9}{'vs oracle':>11}{'goodput':>9}{'preempt':>9}"
        f"{'OD h':>7}"
    )
    for r in rows:
        print(
            f"  {r['policy']:<13}{r['windows']:>8}{r['deadline_misses']:>8}{r['cost_vs_on_demand']:>9.3f}"
            f"{r.get('vs_oracle', math.nan):>11.3f}{r['goodput']:>9.3f}{r['preemptions']:>9.2f}"
            f"{r['on_demand_hours']:>7.2f}"
        )
        if "best_zone" in r:
            print(f"  {'':<13}best single zone in hindsight: {r['best_zone']} {r['best_zone_cost_vs_on_demand']:.3f}")
    return 0


def _describe(job: Job, traces: Sequence[Trace], windows: int) -> str:
    every = (
        "auto (re-derived at every attempt from the lifetimes seen)"
        if job.every == AUTO
        else f"every {float(job.every):g}s"
    )
    deadline = f", deadline {job.deadline_seconds / 3600:g} h" if job.deadline_seconds else ""
    return (
        f"simulate: {len(traces)} trace(s) x {windows} windows; job {job.work_seconds / 3600:g} h{deadline}, "
        f"restart {job.restart_seconds:g}s, checkpoint {job.checkpoint_cost_seconds:g}s {every}, "
        f"{job.notice_share:.0%} noticed, prior {job.prior_per_hour:g}/h; spot ${job.spot_usd:g}/h, "
        f"on-demand ${job.on_demand_usd:g}/h"
    )


if __name__ == "__main__":
    sys.exit(main())
