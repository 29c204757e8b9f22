"""``orchestrator storage repair-spend <storage.uri>``: rebuild the spend index from the jobs' ledgers.

The index (``orchestrator.money.spend``) is a summary: every attempt's cost is also in its job's
ledger (``<run>/ledger.json``, at the attempt's end or its last heartbeat). When the index is
unreadable (truncated, wrong types, an amount that is not a finite non-negative number) a capped
job refuses to start (exit 3) and this command writes a new one:

- an ended attempt's cost is settled into the month (UTC) it ended in;
- the newest attempt of a job still marked running keeps an open entry at its last heartbeat's cost,
  which that attempt, if it is alive, goes on extending (and the job's next attempt settles if not);
- each job's experiment comes from its ledger (``extra.experiment``), else from the old index when
  that part of it still parses, else ``tracking.experiment``'s default (said in the summary);
- each job's ``orchestrator eval`` bills (the ledger's ``evaluations``) go under ``<run>:eval`` with the job's
  experiment, as ``orchestrator.evaluation.billing`` charges them: a finished one settled into the month it
  ended in, one still marked running kept open under its own entry (``eval-<entry>``), which it settles;
- the caps' alert marks are kept when the old index has readable ones (else an alert may be sent again).

The new index replaces the old one by a conditional write, so a job writing meanwhile is not overwritten.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from orchestrator.core.exitcodes import RUNNING
from orchestrator.money.spend import INDEX_KEY, month_of, month_total_usd
from orchestrator.records.fields import LATEST_TIME, MAX_USD, CorruptRecord, Fields
from orchestrator.records.ledger import LEDGER_FILENAME, decode_ledger, evaluations
from orchestrator.records.spend_record import SpendJob
from orchestrator.storage.base import ObjectStore, PreconditionFailed

EVAL_SUFFIX = ":eval"  # evaluation.billing's (a floor above this one)
DEFAULT_EXPERIMENT = "spot-orchestrator"  # TrackingConfig.experiment's default
MAX_ROUNDS = 5


@dataclass
class Repair:
    """What ``rebuild_index`` made: the index, and what it could not use."""

    index: dict
    ledgers: int = 0
    skipped: list[str] = field(default_factory=list)
    guessed_experiment: list[str] = field(default_factory=list)


def _bounded(value, high: float) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if 0 <= value <= high else None


def _cost(value) -> Optional[float]:
    """A dollar figure the index may hold (``spend_record``: at most MAX_USD), else None."""
    return _bounded(value, MAX_USD)


def _time(value) -> Optional[float]:
    return _bounded(value, LATEST_TIME)


def _old_index(raw: Optional[bytes]) -> dict:
    """Whatever of the old index still parses as JSON objects (it is only a hint)."""
    try:
        old = json.loads(raw) if raw else {}
    except (ValueError, UnicodeDecodeError):
        return {}
    return old if isinstance(old, dict) else {}


def ledger_experiment(ledger: dict) -> Optional[str]:
    """The experiment the job's newest attempt that recorded one was charged to (None: none did)."""
    for attempt in reversed(ledger.get("attempts") or []):
        extra = attempt.get("extra") if isinstance(attempt, dict) else None
        name = extra.get("experiment") if isinstance(extra, dict) else None
        if isinstance(name, str) and name:
            return name
    return None


def _experiment(ledger: dict, old_job) -> Optional[str]:
    name = ledger_experiment(ledger)
    if name is not None:
        return name
    name = old_job.get("experiment") if isinstance(old_job, dict) else None
    return name if isinstance(name, str) else None


def _job_entry(ledger: dict, experiment: str, problems: list[str]) -> dict:
    """One job's index entry from its ledger."""
    job: dict[str, Any] = {"experiment": experiment, "months": {}, "open": {}}
    newest = ledger.get("fence")
    for attempt in ledger.get("attempts") or []:
        if not isinstance(attempt, dict):
            problems.append(f"an attempt is {type(attempt).__name__}, not an object")
            continue
        cost = _cost(attempt.get("cost_usd"))
        seen = _time(attempt.get("ended_at") or attempt.get("last_seen") or attempt.get("started_at"))
        if cost is None or seen is None:
            problems.append(f"attempt {attempt.get('fence')!r}: cost {attempt.get('cost_usd')!r} or time not a number")
            continue
        month = month_of(seen)
        if attempt.get("exit_class") == RUNNING and attempt.get("fence") == newest:
            job["open"][str(attempt["fence"])] = {
                "month": month,
                "base": 0.0,
                "spent": cost,
                "through": cost,
                "updated_at": seen,
            }
        else:
            job["months"][month] = job["months"].get(month, 0.0) + cost
    return job


def _eval_entry(ledger: dict, experiment: str, problems: list[str]) -> Optional[dict]:
    """The index entry of the job's ``orchestrator eval`` bills (None: it has none)."""
    bills = evaluations(ledger)  # [] unless a list of bills with finite, non-negative costs
    if not bills:
        if ledger.get("evaluations"):
            problems.append("its evaluations are not a list of bills with a finite, non-negative cost")
        return None
    job: dict = {"experiment": experiment, "months": {}, "open": {}}
    for bill in bills:
        started, seconds = _time(bill.get("started_at")), _time(bill.get("seconds") or 0.0)
        cost = _cost(bill.get("cost_usd"))
        if started is None or seconds is None or cost is None or _time(started + seconds) is None:
            problems.append(f"evaluation {str(bill.get('id'))[:40]!r}: cost or time not a number in bounds")
            continue
        month = month_of(started + seconds)
        ident = str(bill.get("id", ""))
        entry = ident[len("eval-") :] if ident.startswith("eval-") and ident[5:].isdigit() else str(int(started * 1000))
        if bill.get("status") == "running":
            job["open"][entry] = {
                "month": month,
                "base": 0.0,
                "spent": cost,
                "through": cost,
                "updated_at": started + seconds,
            }
        else:
            job["months"][month] = job["months"].get(month, 0.0) + cost
    return job


def rebuild_index(store: ObjectStore, old_raw: Optional[bytes] = None) -> Repair:
    """The spend index the ledgers under ``store`` give (``old_raw``: the old index's bytes, for hints)."""
    old = _old_index(old_raw)
    old_jobs: Any = old.get("jobs") if isinstance(old.get("jobs"), dict) else {}
    alerts: Any = old.get("alerts") if isinstance(old.get("alerts"), dict) else {}
    alerts = {k: v for k, v in alerts.items() if _time(v) is not None}
    repair = Repair({"jobs": {}, "alerts": alerts})
    for key in store.list():
        run, _, name = key.partition("/")
        if name != LEDGER_FILENAME or run.startswith("_"):
            continue
        try:
            ledger = decode_ledger(store.get_bytes(key))
            if not isinstance(ledger, dict) or not isinstance(ledger.get("attempts", []), list):
                raise ValueError("not a ledger")
        except (ValueError, UnicodeDecodeError) as err:
            repair.skipped.append(f"{store.get_uri(key)}: unreadable ({str(err)[:80]})")
            continue
        experiment = _experiment(ledger, old_jobs.get(run))
        if experiment is None:
            repair.guessed_experiment.append(run)
        problems: list[str] = []
        entries = {
            run: _job_entry(ledger, experiment or DEFAULT_EXPERIMENT, problems),
            run + EVAL_SUFFIX: _eval_entry(ledger, experiment or DEFAULT_EXPERIMENT, problems),
        }
        for name, job in entries.items():
            try:  # what the index's readers decode (a sum past MAX_USD would make the whole index unreadable)
                if job is not None:
                    repair.index["jobs"][name] = SpendJob.decode(Fields(job, f"jobs.{name}")).encode()
            except CorruptRecord as err:
                problems.append(f"{err.where}: {err.problem}; left out")
        repair.skipped += [f"{store.get_uri(key)}: {p}" for p in problems]
        repair.ledgers += 1
    return repair


def repair_spend_index(store: ObjectStore) -> Repair:
    """Rebuild the index and write it in place of the old one (conditionally: a job that wrote meanwhile wins,
    and the rebuild is redone on top of the ledgers as they are then)."""
    for _ in range(MAX_ROUNDS):
        try:
            old_raw, version = store.get_versioned(INDEX_KEY)
        except FileNotFoundError:
            old_raw, version = None, None
        repair = rebuild_index(store, old_raw)
        try:
            store.put_if(INDEX_KEY, json.dumps(repair.index, indent=2).encode(), if_version=version)
            return repair
        except PreconditionFailed:
            continue
    raise PreconditionFailed(f"{store.get_uri(INDEX_KEY)} kept changing while it was rebuilt; run the command again")


def summary(repair: Repair, store: ObjectStore, *, now: float) -> str:
    month = month_of(now)
    lines = [
        f"rebuilt {store.get_uri(INDEX_KEY)} from {repair.ledgers} ledger(s): "
        f"{len(repair.index['jobs'])} job(s), ${month_total_usd(repair.index, month):.4f} in {month} (UTC)"
    ]
    if repair.guessed_experiment:
        lines.append(
            f"  no experiment recorded for {', '.join(sorted(repair.guessed_experiment))}: counted under "
            f"{DEFAULT_EXPERIMENT!r}"
        )
    lines += [f"  skipped {item}" for item in repair.skipped]
    return "\n".join(lines)
