"""This attempt's record in the job's ledger: begin (with the caps and budget refusal), heartbeat,
checkpoints, quality, repro, end; and the fence (an attempt that lost the job's fence stops).

Only the main rank writes the ledger. Other ranks get a ``FollowerRecord``: the
same methods, none of which touch storage.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, Optional, Sequence

from orchestrator.attempt.money import start_up_refusal
from orchestrator.core.errors import BudgetExhausted, Fenced
from orchestrator.core.exitcodes import ExitClass
from orchestrator.policy.history import last_restart_seconds
from orchestrator.policy.requeue import RequeuePolicy, start_refusal
from orchestrator.policy.restart import start_up_seconds
from orchestrator.records.ledger import Ledger
from orchestrator.records.ledger_record import AttemptEntry, LedgerRecord

log = logging.getLogger(__name__)


class AttemptRecord:
    """The main rank's view of the ledger for one attempt.

    Args:
        ledger: the job's ledger (``<storage>/<run>/ledger.json``).
        policy: the requeue caps and crash-loop breaker, asked before an attempt starts.
        compute: the ``compute`` config (what this attempt runs on, for the bill).
        budget_max_usd: the job's hard budget, or None.
        spend: the attempt's hold on the store's spend index (``orchestrator.attempt.money.SpendWatch``), or None.
        zone: where it landed (``orchestrator.attempt.zone.AttemptZone``), or None.
    """

    writes = True

    def __init__(
        self,
        ledger: Ledger,
        policy: RequeuePolicy,
        *,
        compute: Any,
        budget_max_usd: Optional[float],
        spend: Any = None,
        zone: Any = None,
    ):
        self.ledger = ledger
        self.zone = zone
        self.spend = spend
        self.policy = policy
        self.compute = compute
        self.budget_max_usd = budget_max_usd
        self.prior_cost_usd = 0.0
        self.prior_attempts: list[AttemptEntry] = []  # the job's attempts before this one, decoded

    @property
    def fence(self) -> Optional[int]:
        return self.ledger.fence

    def begin(self, newest_checkpoint_step: int, *, final_uri: str = "") -> AttemptEntry:
        """Take the next fence (fencing older attempts) or raise why not: AlreadyCompleted (exit 0),
        CapsReached, BudgetExhausted (``orchestrator.policy.requeue.start_refusal``; a spent monthly or experiment cap,
        from the spend index, then its first reservation), or CorruptRecord (exit 4: the job's own ledger does not
        decode, ``LedgerRecord``). Returns the new attempt, decoded."""
        compute = self.compute

        def refuse(record: LedgerRecord):
            refusal = start_refusal(record, self.policy, max_usd=self.budget_max_usd, final_uri=final_uri)
            if refusal is not None or self.spend is None:
                return refusal
            return self.spend.start_refusal(vanished_usd=_attempt_costs(record.attempts))

        self.ledger.begin_attempt(
            host=socket.gethostname(),
            pid=os.getpid(),
            instance_type=compute.name,
            gpu_type=compute.gpu_type,
            gpus=compute.gpus_per_node * compute.nodes,
            spot=bool(compute.spot),
            checkpoint_step=newest_checkpoint_step,
            refuse=refuse,
            # the spend index can be rebuilt from the ledgers (orchestrator storage repair-spend)
            extra={"experiment": self.spend.index.caps.experiment} if self.spend is not None else None,
            zone=self.zone.fields() if self.zone is not None else None,
        )
        fence = self.ledger.fence  # the one begin_attempt took
        stored = LedgerRecord.decode(self.ledger.load(), self.ledger.uri)
        attempt = next(a for a in stored.attempts if a.fence == fence)
        self.prior_attempts = [a for a in stored.attempts if a.fence != fence]
        self.prior_cost_usd = float(sum(a.cost_usd for a in self.prior_attempts))
        if self.spend is not None:  # BudgetExhausted when another job took the last dollars meanwhile
            startup_s = self.startup_seconds(stored.attempts)
            # the caps' first reservation holds a start-up even before one is measured (the start prior)
            self.spend.begin(
                fence,
                startup_s=start_up_seconds(startup_s, self.compute.restart_seconds),
                vanished_usd=_attempt_costs(self.prior_attempts),
            )
            # budget.max_usd must carry the start-up ahead too: a step is the first moment the guard can stop it
            refusal = start_up_refusal(
                self.budget_max_usd,
                prior_usd=self.prior_cost_usd,
                spent_usd=self.spend.spent(),
                usd_per_second=self.spend.usd_per_second,
                startup_s=startup_s,
            )
            if refusal:
                raise BudgetExhausted(refusal)
        log.info(
            "attempt with fence %d of job %r on %s (newest checkpoint: step %d)",
            fence,
            self.ledger.run_name,
            attempt.host,
            newest_checkpoint_step,
        )
        return attempt

    def startup_seconds(self, attempts: Sequence[Any]) -> float:
        """Process start to first step, as this attempt's first reservation counts it: the job's last measured,
        else ``compute.restart_seconds`` (a sweep's driver sets it from its trials' ledgers), else 0 (unknown)."""
        return last_restart_seconds(attempts) or float(self.compute.restart_seconds or 0.0)

    def load(self) -> dict:
        return self.ledger.load()

    def decode(self, ledger: dict) -> LedgerRecord:
        """``ledger`` (as ``load`` gave it) decoded; CorruptRecord (exit 4) names this job's ledger."""
        return LedgerRecord.decode(ledger, self.ledger.uri)

    def heartbeat(self, step: int, cost_usd: float) -> Optional[Exception]:
        """Record progress; returns the fencing error when another attempt took over (else None)."""
        try:
            self.ledger.heartbeat(step, cost_usd)
        except Fenced as err:
            return err
        return None

    def check_fence(self) -> None:
        """Raise Fenced when another attempt holds the job's fence."""
        self.ledger.check_fence()

    def record_checkpoint(self, step: int, key: str, size: int, *, cost_usd: float) -> None:
        self.ledger.record_checkpoint(step, key, size, cost_usd=cost_usd)

    def record_alert(self, name: str) -> bool:
        return self.ledger.record_alert(name)

    def set_mlflow_run_id(self, run_id: Optional[str]) -> None:
        """Remember the job's MLflow run (when it is new) so every attempt logs into the same one."""
        if run_id and run_id != self.decode(self.load()).mlflow_run_id:
            self.ledger.set_mlflow_run_id(run_id)

    def note(self, **fields: Any) -> None:
        """Measurements and decisions of this attempt, into its ledger entry's ``extra``."""
        self.ledger.set_attempt_extra(**fields)

    def record_capacity(self, decision: dict) -> None:
        self.ledger.record_capacity(decision)

    def quality(self) -> dict:
        return dict(self.ledger.load().get("quality") or {})

    def record_restart(self, split: dict) -> None:
        """This attempt's restart overhead, split by phase (``orchestrator.attempt.restart``), in its ledger entry;
        its total is the start to first step the policies read (``orchestrator.policy.history``)."""
        self.ledger.update(lambda ledger: self.ledger.current_attempt(ledger)["extra"].update(restart=dict(split)))

    def update_quality(self, metrics: dict) -> None:
        self.ledger.update(lambda ledger: ledger.setdefault("quality", {}).update(metrics))

    def record_eval(self, step: int, metrics: dict) -> None:
        """One evaluation's numbers (held-out, or ``bench/<task>/<metric>``), under ``quality.evals[<step>]``
        (a sweep's rung reads them)."""
        self.ledger.update(
            lambda ledger: (
                ledger.setdefault("quality", {}).setdefault("evals", {}).setdefault(str(step), {}).update(metrics)
            )
        )  # merged: the held-out numbers and the benchmark scores of one step

    def record_repro(self, record: dict, installed: Optional[dict] = None) -> dict:
        """Store this attempt's reproducibility record (and the job's, on the first attempt, with ``installed``: every
        installed distribution's version, which later attempts name their changes against); returns the first's."""
        first: dict = {}

        def fn(ledger):
            nonlocal first
            first = ledger.get("repro") or {}
            if not first:
                ledger["repro"] = {**record, INSTALLED: installed} if installed else record
            self.ledger.current_attempt(ledger)["extra"]["repro"] = record

        self.ledger.update(fn)
        return first

    def end(self, exit_class: ExitClass, step: int, cost_usd: float) -> LedgerRecord:
        """Close the attempt (its status: ``exitcodes.OUTCOMES``); settle its spend; returns the ledger as written,
        decoded (the cost report's and the closing figures' reading)."""
        self.ledger.end_attempt(exit_class, step, cost_usd)
        self._settle(cost_usd)
        return LedgerRecord.decode(self.ledger.load(), self.ledger.uri)

    def _settle(self, cost_usd: float) -> None:
        if self.spend is None:
            return
        try:
            self.spend.settle(cost_usd)
        except Exception as err:  # noqa: BLE001 - the reservation stays charged: the index over-counts, never under
            log.warning("could not settle this attempt's spend in the spend index: %s", err)

    def fail(self, exit_class: ExitClass, step: int, cost_usd: float) -> None:
        """Best effort: record a failed attempt; the ledger may be what failed."""
        if not self.fence:
            return
        try:
            self.ledger.end_attempt(exit_class, step, cost_usd)
        except Exception as err:  # noqa: BLE001
            log.warning("could not record the attempt's end in the ledger: %s", err)
        self._settle(cost_usd)


class FollowerRecord:
    """What a non-main rank has of the record: nothing it may write."""

    writes = False
    fence = None
    prior_cost_usd = 0.0
    prior_attempts: list = []

    def begin(self, newest_checkpoint_step: int, *, final_uri: str = "") -> None:
        return None

    def load(self) -> dict:
        return {}

    def decode(self, ledger: dict) -> LedgerRecord:
        return LedgerRecord.decode(ledger, "the ledger")

    def heartbeat(self, step: int, cost_usd: float) -> None:
        return None

    def check_fence(self) -> None:
        return None

    def record_checkpoint(self, *args, **kwargs) -> None:
        return None

    def record_alert(self, name: str) -> bool:
        return False

    def set_mlflow_run_id(self, run_id: Optional[str]) -> None:
        return None

    def note(self, **fields: Any) -> None:
        return None

    def record_capacity(self, decision: dict) -> None:
        return None

    def quality(self) -> dict:
        return {}

    def record_restart(self, split: dict) -> None:
        return None

    def update_quality(self, metrics: dict) -> None:
        return None

    def record_eval(self, step: int, metrics: dict) -> None:
        return None

    def record_repro(self, record: dict, installed: Optional[dict] = None) -> dict:
        return {}

    def end(self, *args, **kwargs) -> dict:
        return {}

    def fail(self, *args, **kwargs) -> None:
        return None


def record_repro(resolved: dict, record: Any, tracking: Any) -> list[str]:
    """Record what this attempt runs on (ledger and MLflow); warn about, and return, the ways it differs
    from the first attempt that can change results. ``resolved``: the resolved config (``attempt.resolved``),
    hashed into the record, its ``backend.image`` the record's image. With a zone (``compute.zones``), where this
    attempt and the earlier ones ran is tagged too (``attempt.zone.zone_tags``)."""
    if not record.writes:
        return []
    from orchestrator.attempt.zone import zone_tags
    from orchestrator.records.repro import collect_record, diff_records

    zones = zone_tags(record.zone, record.prior_attempts, record.fence)
    if zones:
        tracking.set_tags(zones)
    this = collect_record(resolved)  # packages_sha256: the digest of every installed name==version
    installed = installed_versions()
    first = record.record_repro(this, installed)
    differences = name_package_changes(diff_records(first, this), first, installed) if first else []
    for line in differences:
        log.warning("this attempt differs from the first one: %s", line)
    tracking.log_dict({**this, INSTALLED: installed}, f"repro/attempt-{record.fence}.json")
    if differences:
        tracking.set_tags({"repro_differs": "true"})
        tracking.log_text("\n".join(differences), f"repro/attempt-{record.fence}-differences.txt")
    return differences


INSTALLED = "installed"  # the first attempt's record: {distribution: version} of everything installed
NAMED_CHANGES = 25  # a warning names this many changed packages, then counts the rest


def installed_versions() -> dict[str, str]:
    """Every installed distribution (canonical name) and its version, as ``packages_sha256`` digests them."""
    import importlib.metadata as metadata
    import re

    from orchestrator.records.repro import name_and_version

    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name, version = name_and_version(dist)
        if name:
            out.setdefault(re.sub(r"[-_.]+", "-", name).lower(), str(version))
    return dict(sorted(out.items()))


def name_package_changes(differences: list[str], first: dict, installed: dict) -> list[str]:
    """``differences`` with its package lines (key packages by name, the rest by digest only) replaced by one
    line naming every package that changed since the first attempt, when the first attempt's record lists them
    (records written before it did keep the digest line)."""
    before = first.get(INSTALLED)
    if not isinstance(before, dict) or before == installed:
        return differences
    names = sorted(set(before) | set(installed))
    changed = [
        f"{n} {before.get(n, '(none)')} -> {installed.get(n, '(removed)')}"
        for n in names
        if before.get(n) != installed.get(n)
    ]
    more = f", and {len(changed) - NAMED_CHANGES} more" if len(changed) > NAMED_CHANGES else ""
    kept = [d for d in differences if not d.startswith(("package ", "other installed packages changed"))]
    return kept + [
        f"installed packages ({len(changed)} changed; a resume is bit-for-bit on the first attempt's "
        f"versions only): {', '.join(changed[:NAMED_CHANGES])}{more}"
    ]


def _attempt_costs(attempts) -> dict:
    """fence -> the ledger's cost of each (decoded) attempt (what settles its open entry in the spend index)."""
    return {str(a.fence): a.cost_usd for a in attempts}
