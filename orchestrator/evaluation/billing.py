"""What ``orchestrator eval`` costs, billed like an attempt of its job: metered at the price of ``compute`` (the
machine it runs on) from its start, recorded in the job's ledger (``evaluations``, counted in its ``cost_usd``)
and in the store's spend index under ``<run>:eval``, so the monthly and experiment caps count it: under the
job's own experiment (its ledger's), not the composed ``tracking.experiment``.

It is no attempt of the training job (it takes no fence and fences nothing: it may run while the job trains), so
it has its own entry in the spend index: a training attempt's reservation never settles it. The index is written
after every evaluation, so a SIGKILL leaves its charge up to the last one (the next ``orchestrator eval`` of the job
settles it). A cap already spent refuses it before anything is evaluated; one reached meanwhile stops it after the
evaluation in flight (exit 3, the budget's code), with the numbers.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any, Callable, Iterable, Optional

from orchestrator.core.errors import BudgetExhausted
from orchestrator.money.spend_repair import EVAL_SUFFIX  # the index entry of a job's evaluations
from orchestrator.records.fields import CorruptRecord
from orchestrator.records.ledger_record import AttemptEntry, LedgerRecord

log = logging.getLogger(__name__)


def training_cost_until(attempts: Iterable[AttemptEntry], when: Optional[float]) -> Optional[float]:
    """The job's training cost up to ``when`` (a checkpoint's commit, fence seconds): of the ledger's attempts
    (decoded: ``LedgerRecord.attempts``), every one that ended before it in full, the one running then pro rata of
    its time (its price is constant), none started after (nor one with no start); the evaluations' own bills
    (``evaluations``) not. None without a time or an attempt running by then."""
    from orchestrator.money.report import entry_seconds

    if when is None:
        return None
    total, seen = 0.0, False
    for attempt in attempts:
        started = attempt.started_at
        if started is None or started > when:
            continue
        seconds = entry_seconds(attempt)
        share = 1.0 if seconds <= 0 or started + seconds <= when else (when - started) / seconds
        total, seen = total + attempt.cost_usd * share, True
    return total if seen else None


def job_experiment(store: Any, run_name: str) -> Optional[str]:
    """The experiment the job's training was charged to (its ledger's), so that experiment's cap (and a sweep's,
    whose trials share it) counts its evaluations too; None without a ledger that records one."""
    from orchestrator.records.ledger import Ledger

    ledger = Ledger(store, run_name)
    try:
        record = LedgerRecord.decode(ledger.load(), ledger.uri)
    except (ValueError, CorruptRecord) as err:  # unreadable: the composed tracking.experiment, said so
        log.warning("%s/ledger.json unreadable (%s); the evaluation is billed to tracking.experiment", run_name, err)
        return None
    for attempt in reversed(record.attempts):  # the newest attempt that recorded one
        name = attempt.extra.get("experiment")
        if isinstance(name, str) and name:
            return name
    return None


class EvalBill:
    def __init__(self, cfg: Any, store: Any, run_name: str, *, clock: Callable[[], float] = time.time):
        from orchestrator.money.budget import spend_caps
        from orchestrator.money.cost import load_catalog, price_for
        from orchestrator.money.spend import SpendIndex

        self.store, self.run_name, self.clock = store, run_name, clock
        self.usd_per_second = price_for(cfg.compute, load_catalog()).usd_per_second
        self.started = clock()
        self.index_entry = int(self.started * 1000)  # this evaluation's entry in the spend index
        self.id = f"eval-{self.index_entry}"
        self.experiment = job_experiment(store, run_name) or str(cfg.tracking.experiment)
        self.index = SpendIndex(store, spend_caps(cfg.budget, f"{run_name}{EVAL_SUFFIX}", self.experiment))
        self.unreadable: Optional[str] = None  # uncapped under a corrupt index: why it stopped writing there
        self.evaluated = 0  # evaluations charged so far (what a preempted run closes with)

    def _index(self, call: Callable[[], Any]) -> Any:
        """``call()`` on the spend index. A corrupt index refuses an evaluation with a cap (SpendIndexCorrupt, exit
        3: it cannot check it); one with none is said once and runs on, billed to the job's ledger only, as an
        uncapped job does (``attempt.money.SpendWatch``)."""
        from orchestrator.money.spend import SpendIndexCorrupt

        if self.unreadable is not None:
            return None
        try:
            return call()
        except SpendIndexCorrupt as err:
            caps = self.index.caps
            if caps.monthly_max_usd is not None or caps.experiment_max_usd is not None:
                raise
            self.unreadable = str(err)
            log.warning("%s. This evaluation has no spend cap, so it runs on, billed to the job's ledger only", err)
            return None

    def spent(self) -> float:
        return max(0.0, self.clock() - self.started) * self.usd_per_second

    def open(self) -> None:
        """Refuses (BudgetExhausted) when a cap is already spent; else opens the entries."""
        refusal = self._index(self.index.refusal)
        if refusal:
            raise BudgetExhausted(f"orchestrator eval of {self.run_name!r} not started: {refusal}")
        self.charge(0, status="running")

    def charge(self, evaluated: int, *, status: str = "running") -> None:
        """What it has spent so far, into the spend index and the ledger; BudgetExhausted once a cap is reached."""
        self.evaluated = int(evaluated)
        spent = self.spent()
        grant = self._index(lambda: self.index.reserve(self.index_entry, spent, spent))
        self._record(spent, evaluated, status)
        if grant is not None and grant.refusal and status == "running":
            self.close(evaluated, status="budget_exhausted")
            raise BudgetExhausted(
                f"orchestrator eval of {self.run_name!r} stopped after {evaluated} evaluation(s) "
                f"(${spent:.6f}): {grant.refusal}"
            )

    def close(self, evaluated: int, *, status: str = "completed") -> float:
        spent = self.spent()
        self._index(lambda: self.index.settle(self.index_entry, spent))
        self._record(spent, evaluated, status)
        return spent

    def _record(self, spent: float, evaluated: int, status: str) -> None:
        from orchestrator.records.ledger import LEDGER_FILENAME, add_evaluation, decode_ledger
        from orchestrator.storage.transact import transact

        entry = {
            "id": self.id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": self.started,
            "seconds": round(max(0.0, self.clock() - self.started), 3),
            "cost_usd": spent,
            "evaluated": int(evaluated),
            "status": status,
        }

        def mutate(ledger):
            if ledger is None:  # no such job: nothing to bill it to (the caller found no checkpoints either)
                return None
            add_evaluation(ledger, entry)
            return ledger

        transact(self.store, f"{self.run_name}/{LEDGER_FILENAME}", mutate, decode=decode_ledger)
