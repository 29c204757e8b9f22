"""``orchestrator status <storage-uri>/<run-name> [--json]``: print a job's ledger;
``orchestrator status --spend <storage-uri>``: the spend index, this month's and each experiment's spend by job.

The table shows the job's status, step, cost and MLflow run, one row per
attempt (fence, host, start, duration, exit class, steps, cost), then the
committed checkpoints, and why it checkpoints as often as it does (``checkpoint.every=auto``) and runs
on the capacity it does (``run.deadline``'s decisions). An attempt still marked running while a later one has
taken the job over is shown as vanished (lost): nothing will record its end.
``--json`` prints the ledger, with the same correction.
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any, Mapping, Optional

from orchestrator.core.console import Parser, fail, format_bytes
from orchestrator.core.errors import UserError
from orchestrator.core.exitcodes import ExitClass
from orchestrator.records.ledger import Ledger
from orchestrator.records.ledger_record import LedgerRecord
from orchestrator.storage import TransientStorageError, open_store, split_run_uri

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # a text from storage reaches the terminal without them


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def corrected_json(raw: dict, record: LedgerRecord) -> dict:
    """The stored ledger as ``--json`` prints it: as stored, each attempt a later one took over shown as vanished
    (``LedgerRecord.with_lost_attempts``)."""
    fixed = record.with_lost_attempts().attempts
    attempts = [
        dict(stored, exit_class=typed.exit_class, ended_at=typed.ended_at)
        if typed.exit_class != was.exit_class
        else stored
        for stored, typed, was in zip(raw.get("attempts") or [], fixed, record.attempts)
    ]
    return dict(raw, attempts=attempts) if attempts else raw


def format_ledger(ledger: LedgerRecord, *, now: float | None = None) -> str:
    """The human-readable view of a ledger, as ``orchestrator status`` prints it."""
    now = time.time() if now is None else now
    ledger = ledger.with_lost_attempts()
    out = [
        f"run       {ledger.run_name}",
        f"status    {ledger.status}",
        f"step      {ledger.step}",
        f"cost      ${ledger.cost_usd:.4f}",
        f"mlflow    {ledger.mlflow_run_id or '-'}",
        f"fence     {ledger.fence}",
        f"created   {_when(ledger.created_at)}",
    ]
    if ledger.alerts:
        out.append("alerts    " + ", ".join(f"{k} ({_when(v)})" for k, v in ledger.alerts.items()))
    rows = []
    for a in ledger.attempts:
        end = a.ended_at or (now if a.running else a.last_seen)
        started = a.started_at or 0
        machine = f"{a.gpus}x{a.gpu_type or '-'}" if a.gpus else (a.gpu_type or "-")
        rows.append(
            [
                str(a.fence),
                a.host,
                _when(started),
                _duration((end or started) - started),
                a.exit_class + (" (lost)" if a.exit_class == ExitClass.VANISHED.value else ""),
                f"{a.step_start}->{a.step_end}",
                f"${a.cost_usd:.4f}",
                machine + (" spot" if a.spot else ""),
                a.zone or "-",
            ]
        )
    out += ["", f"attempts ({len(ledger.attempts)})"]
    out.append(
        _table(["fence", "host", "started", "duration", "exit class", "steps", "cost", "machine", "zone"], rows)
        if rows
        else "  none"
    )
    out += _node_table(ledger.attempts)
    out += zone_section(ledger.attempts)
    out += explain_decisions(ledger)
    checkpoints = ledger.checkpoints
    committed = ledger.checkpoints_committed
    kept = (
        f"{len(checkpoints)}"
        if committed == len(checkpoints)
        else f"newest {len(checkpoints)} of {committed} committed"
    )
    out += ["", f"checkpoints ({kept})"]
    if checkpoints:
        out.append(
            _table(
                ["step", "fence", "size", "saved", "key"],
                [[str(c.step), str(c.fence), format_bytes(c.size), _when(c.time), c.key] for c in checkpoints],
            )
        )
    else:
        out.append("  none")
    return "\n".join(out)


SHOWN_DECISIONS = 10


def zone_section(attempts) -> list[str]:
    """Where each attempt ran (``compute.zones``), at what hourly price and why; then the cost per zone."""
    from orchestrator.money.report import zone_costs, zone_lines

    placed = [a for a in attempts if a.zone]
    if not placed:
        return []
    out = ["", "zones"]
    for a in placed:
        price = f"${a.zone_usd_per_hour:.4f}/h" if a.zone_usd_per_hour is not None else "price unknown"
        where = f"{a.zone} ({a.zone_region})" if a.zone_region else a.zone
        out.append(f"  attempt {a.fence}  {where}  {price}: {a.zone_reason or '-'}")
    return out + zone_lines(zone_costs(attempts))


def _node_table(attempts) -> list[str]:
    """Each node of the multi-node attempts: its host, start, end and exit (the ledger's ``nodes``)."""
    rows = [
        [
            str(a.fence),
            str(n.node),
            n.host,
            _when(n.started_at),
            _when(n.ended_at),
            "-" if n.exit is None else str(n.exit),
        ]
        for a in attempts
        for n in a.nodes
    ]
    return ["", "nodes", _table(["fence", "node", "host", "started", "ended", "exit"], rows)] if rows else []


def explain_decisions(ledger: LedgerRecord) -> list[str]:
    """Why the job checkpoints as often as it does (checkpoint.every=auto) and runs where it runs (run.deadline)."""
    out = []
    chosen: Optional[tuple[int, Any]] = next(
        (
            (a.fence, a.extra.get("checkpoint_interval"))
            for a in reversed(ledger.attempts)
            if isinstance(a.extra.get("checkpoint_interval"), Mapping)
        ),
        None,
    )
    if chosen:
        fence, interval = chosen
        explanation = _CONTROL.sub("?", str(interval.get("explanation")))
        out += ["", f"checkpoint interval (attempt {fence}, checkpoint.every=auto)", f"  {explanation}"]
    decisions = ledger.capacity
    if decisions:
        out += [
            "",
            f"capacity (run.deadline; newest {min(len(decisions), SHOWN_DECISIONS)} of {len(decisions)} decisions)",
        ]
        for d in decisions[-SHOWN_DECISIONS:]:
            change = f"{_capacity(d.previous)} -> {_capacity(d.capacity)}"
            out.append(f"  {_when(d.time)}  attempt {d.fence} step {d.step}  [{change}] {d.action}: {d.reason}")
    return out


def _capacity(value) -> str:
    return "on-demand" if value == "on_demand" else str(value or "?")


def format_spend(index: dict, where: str, *, now: float | None = None) -> str:
    """The spend index as ``orchestrator status --spend`` prints it: the month's spend (UTC) and each
    experiment's (all time), by job; reservations not yet settled are included and counted apart."""
    from orchestrator.money.spend import (
        by_job,
        experiment_total_usd,
        job_month_usd,
        job_total_usd,
        month_of,
        month_total_usd,
    )

    month = month_of(time.time() if now is None else now)
    jobs = index.get("jobs") or {}
    out = [
        f"spend under {where} (reservations of running or lost attempts included)",
        "",
        f"month {month} (UTC): ${month_total_usd(index, month):.4f}",
    ]
    rows = [
        [name, str(job.get("experiment")), f"${job_month_usd(job, month):.4f}", str(len(job.get("open") or {}))]
        for name, job in sorted(jobs.items())
        if job_month_usd(job, month) > 0 or job.get("open")
    ]
    out.append(_table(["job", "experiment", "spent", "open attempts"], rows) if rows else "  none")
    for experiment in sorted({str(job.get("experiment")) for job in jobs.values()}):
        out += ["", f"experiment {experiment!r}: ${experiment_total_usd(index, experiment):.4f} (all months)"]
        out.append(
            _table(
                ["job", "spent"],
                [
                    [name, f"${job_total_usd(job):.4f}"]
                    for name, job in sorted(jobs.items())
                    if str(job.get("experiment")) == experiment
                ],
            )
        )
    months = sorted({m for job in jobs.values() for m in (job.get("months") or {})} - {month})
    if months:
        out += ["", "earlier months"] + [
            f"  {m}: ${month_total_usd(index, m):.4f} ({by_job(index, month=m)})" for m in months
        ]
    return "\n".join(out)


def spend_main(uri: str, *, endpoint_url: str | None, as_json: bool) -> int:
    from orchestrator.money.spend import INDEX_KEY, parse_index

    try:
        store = open_store(uri, endpoint_url=endpoint_url or None)
        index = parse_index(store.get_bytes(INDEX_KEY), store.get_uri(INDEX_KEY), store.uri)
    except FileNotFoundError:
        return fail(
            f"no spend index at {store.get_uri(INDEX_KEY)}: no job has started under {store.uri} yet. "
            "Give the jobs' storage.uri (not <storage.uri>/<run.name>), and --endpoint-url for "
            "S3-compatible stores."
        )
    except (ValueError, UserError, TransientStorageError) as err:  # SpendIndexCorrupt is a UserError
        return fail(err)
    print(json.dumps(index, indent=2) if as_json else format_spend(index, store.uri))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="orchestrator status",
        description="Print a job's ledger: status, attempts with exit classes, cost, checkpoints "
        "(--spend STORAGE_URI: the month's and each experiment's spend by job).",
    )
    parser.add_argument(
        "target",
        metavar="STORAGE_URI/RUN_NAME",
        help="e.g. s3://bucket/runs/exp1 or .cache/runs/exp1; with --spend, the jobs' storage.uri (s3://bucket/runs)",
    )
    parser.add_argument("--json", action="store_true", help="print the ledger (or the spend index) as JSON")
    parser.add_argument(
        "--spend",
        action="store_true",
        help="print the spend index of the jobs under STORAGE_URI: the month (UTC) and each experiment, by job",
    )
    parser.add_argument(
        "--endpoint-url",
        default=None,
        help="S3-compatible endpoint (MinIO, R2...); defaults to the AWS_ENDPOINT_URL environment variable",
    )
    args = parser.parse_args(argv)
    if args.spend:
        return spend_main(args.target, endpoint_url=args.endpoint_url, as_json=args.json)
    try:
        store_uri, run_name = split_run_uri(args.target)
        # endpoint_url None lets boto3 read AWS_ENDPOINT_URL itself.
        store = open_store(store_uri, endpoint_url=args.endpoint_url or None)
        from orchestrator.sweep.cli import status_text

        sweep = status_text(store, run_name, as_json=args.json)
        if sweep is not None:
            print(sweep)
            return 0
        ledger = Ledger(store, run_name)
        raw = ledger.load()
        if not raw:
            return fail(
                f"no ledger at {ledger.uri}: no job named {run_name!r} has started under {store.uri}. Check "
                "the run name (run.name) and the storage URI (storage.uri), and --endpoint-url for "
                "S3-compatible stores."
            )
        record = LedgerRecord.decode(raw, ledger.uri)
    except (ValueError, UserError, TransientStorageError) as err:  # CorruptRecord is a UserError
        return fail(err)
    print(json.dumps(corrected_json(raw, record), indent=2) if args.json else format_ledger(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
