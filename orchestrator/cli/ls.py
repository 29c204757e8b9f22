"""``orchestrator ls <storage.uri> [--json] [--sort time|name]``: the jobs and sweeps under a store, one row each.

A job is a folder holding ``ledger.json`` (read through ``LedgerRecord.decode``: status, attempts, step, cost); a
sweep one holding ``sweep.json`` (``parse_state``: the trials' statuses, and their spend from the spend index).
Folders whose names start with ``_`` (``_spend``, ``_bench``, ``_prepared``, ``_prices``...) are the store's own,
not jobs. A record that does not decode is one row, ``corrupt: <reason>``, and the others are listed.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional

from orchestrator.core.console import Parser, fail
from orchestrator.core.errors import UserError
from orchestrator.records.ledger import LEDGER_FILENAME
from orchestrator.records.ledger_record import LedgerRecord
from orchestrator.storage import LocalStore, TransientStorageError, open_store

SWEEP_FILENAME = "sweep.json"


@dataclass
class Row:
    name: str
    kind: str  # job | sweep
    status: str  # a ledger status, a sweep's summary, or "corrupt: <reason>"
    attempts: Optional[int]  # a sweep: its trials
    step: Optional[int]
    cost_usd: Optional[float]
    updated: Optional[float]  # the newest time the record holds (unix)


def _job_row(store, name: str) -> Row:
    key = f"{name}/{LEDGER_FILENAME}"
    try:
        record = LedgerRecord.decode(json.loads(store.get_bytes(key)), store.get_uri(key)).with_lost_attempts()
    except FileNotFoundError:
        return Row(name, "job", "gone: its ledger was deleted while listing", None, None, None, None)
    except (ValueError, UserError) as err:  # CorruptRecord is a UserError; bytes that are not JSON a ValueError
        return Row(name, "job", f"corrupt: {_reason(err)}", None, None, None, None)
    times = [t for a in record.attempts for t in (a.started_at, a.end)] + [record.created_at]
    return Row(
        name,
        "job",
        record.status,
        len(record.attempts),
        record.step,
        record.cost_usd,
        max((t for t in times if t), default=None),
    )


def _sweep_row(store, name: str, spent: dict) -> Row:
    from orchestrator.sweep.state import parse_state

    key = f"{name}/{SWEEP_FILENAME}"
    try:
        doc = parse_state(store.get_bytes(key), store.get_uri(key))
    except (ValueError, UserError) as err:  # SweepStateCorrupt is a UserError
        return Row(name, "sweep", f"corrupt: {_reason(err)}", None, None, None, None)
    trials = doc["trials"]
    counts: dict[str, int] = {}
    for t in trials:
        counts[t["status"]] = counts.get(t["status"], 0) + 1
    status = "running" if counts.get("running") else ("paused" if counts.get("paused") else "ended")
    if counts:
        status += " (" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")"
    driver: dict = doc["driver"] if isinstance(doc.get("driver"), dict) else {}
    launched = [
        v
        for v in [t.get("launched_at") for t in trials] + [driver.get("started"), driver.get("renewed_at")]
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    return Row(
        name,
        "sweep",
        status,
        len(trials),
        None,
        sum(spent.get(t["run_name"], 0.0) for t in trials),
        max(launched, default=None),
    )


def _reason(err: Exception) -> str:
    text = getattr(err, "problem", None) or str(err)
    return " ".join(str(text).split())[:200]


def _spent(store) -> dict:
    """Each job's spend from the spend index (a sweep's is its trials'); empty when there is none or it is unreadable."""
    from orchestrator.money.spend import INDEX_KEY, job_total_usd, parse_index

    try:
        index = parse_index(store.get_bytes(INDEX_KEY), store.get_uri(INDEX_KEY), store.uri)
    except (FileNotFoundError, ValueError, UserError):
        return {}
    return {name: job_total_usd(job) for name, job in (index.get("jobs") or {}).items()}


def list_store(store) -> list[Row]:
    """One row per job and sweep under ``store``, in no particular order."""
    names: dict[str, str] = {}
    for key in store.list(""):
        folder, slash, leaf = key.partition("/")
        if not slash or folder.startswith("_") or "/" in leaf:
            continue
        if leaf == LEDGER_FILENAME:
            names.setdefault(folder, "job")
        elif leaf == SWEEP_FILENAME:
            names[folder] = "sweep"
    spent = _spent(store) if "sweep" in names.values() else {}
    return [_sweep_row(store, n, spent) if kind == "sweep" else _job_row(store, n) for n, kind in names.items()]


def sort_rows(rows: list[Row], by: str) -> list[Row]:
    if by == "name":
        return sorted(rows, key=lambda r: r.name)
    return sorted(rows, key=lambda r: (r.updated is None, -(r.updated or 0.0), r.name))


def format_rows(rows: list[Row]) -> str:
    from orchestrator.cli.status import _table

    def when(ts):
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"

    return _table(
        ["name", "kind", "status", "attempts", "step", "cost", "updated"],
        [
            [
                r.name,
                r.kind,
                r.status,
                "-" if r.attempts is None else str(r.attempts),
                "-" if r.step is None else str(r.step),
                "-" if r.cost_usd is None else f"${r.cost_usd:.4f}",
                when(r.updated),
            ]
            for r in rows
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="orchestrator ls",
        description="List the jobs and sweeps under a store: status, attempts, "
        "step, cost; newest first (--sort name: by name).",
    )
    parser.add_argument(
        "uri", metavar="STORAGE_URI", help="the jobs' storage.uri, e.g. s3://bucket/runs or .cache/runs"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    parser.add_argument(
        "--sort", choices=("time", "name"), default="time", help="time: the newest activity first (default); name"
    )
    parser.add_argument(
        "--endpoint-url",
        default=None,
        help="S3-compatible endpoint (MinIO, R2...); defaults to the AWS_ENDPOINT_URL environment variable",
    )
    args = parser.parse_intermixed_args(argv)
    try:
        store = open_store(args.uri, endpoint_url=args.endpoint_url or None)
        if isinstance(store, LocalStore) and not store.root.is_dir():
            return fail(f"no store at {store.uri}: the folder does not exist. Give the jobs' storage.uri.")
        rows = sort_rows(list_store(store), args.sort)
    except (ValueError, UserError, TransientStorageError) as err:  # an unreachable store is a TransientStorageError
        return fail(err)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
    elif not rows:
        print(f"no jobs or sweeps under {store.uri}")
    else:
        print(format_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
