"""The ledger's readers outside the records package read it decoded (``LedgerRecord``), and a job whose own ledger
does not decode stops at its attempt's start with exit 4 and the fix (issue 41)."""
from __future__ import annotations

import ast
import json
import math
import re
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.exitcodes import ExitClass
from orchestrator.records.fields import MAX_USD, CorruptRecord
from orchestrator.records.ledger import Ledger
from orchestrator.records.ledger_record import LedgerRecord
from orchestrator.storage import LocalStore
from tests.helpers import jobs
from tests.helpers.ledgers import GOOD, GOOD_ATTEMPT, JUNK, WHERE
from tests.helpers.paths import REPO

RUN = "corrupt-own"


def _closed_attempt(store, run: str) -> Ledger:
    ledger = Ledger(store, run)
    ledger.begin_attempt(host=socket.gethostname(), pid=1, instance_type="cpu", gpu_type=None, gpus=0, spot=False,
                         checkpoint_step=0)
    ledger.end_attempt(ExitClass.PREEMPTED, step=5, cost_usd=0.01)
    return ledger


def _tamper(store, run: str, **fields) -> bytes:
    """The ledger of ``run`` with its first attempt's ``fields`` replaced, as anyone who can write the bucket can."""
    stored = json.loads(store.get_bytes(f"{run}/ledger.json"))
    stored["attempts"][0].update(fields)
    raw = json.dumps(stored).encode()
    store.put_bytes(f"{run}/ledger.json", raw)
    return raw


def test_begin_attempt_on_a_ledger_that_does_not_decode_raises_corrupt_record_and_writes_nothing(tmp_path):
    store = LocalStore(tmp_path / "store")
    ledger = _closed_attempt(store, "job")
    raw = _tamper(store, "job", cost_usd=1e300, exit_class="running")  # a "running" one would be marked vanished
    again = Ledger(store, "job")
    with pytest.raises(CorruptRecord) as err:
        again.begin_attempt(host="h", pid=2, instance_type="cpu", gpu_type=None, gpus=0, spot=False, checkpoint_step=0,
                            refuse=lambda record: None)
    assert err.value.exit_code == 4
    assert str(err.value).startswith(f"{ledger.uri} attempts[0] is corrupt: 'cost_usd' is 1e+300, outside [0, 1e+07]")
    assert "move it aside" in str(err.value)
    assert store.get_bytes("job/ledger.json") == raw and again.fence is None  # nothing written, no fence taken


@pytest.mark.e2e
def test_a_job_whose_own_ledger_does_not_decode_stops_at_its_attempt_start_with_exit_4_and_the_fix(tmp_path):
    storage = jobs.Storage(str(tmp_path / "runs"))
    store = storage.store()
    ledger = _closed_attempt(store, RUN)
    raw = _tamper(store, RUN, cost_usd=1e300)
    done = jobs.run_job(jobs.FAST + storage.overrides() + [f"run.name={RUN}"], tmp_path)
    text = done.stdout + done.stderr
    assert done.returncode == 4, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text[-4000:]  # one attempt, never requeued: a retry reads the same bytes
    assert f"{ledger.uri} attempts[0] is corrupt: 'cost_usd' is 1e+300" in errors[0], errors
    assert "move it aside" in errors[0] and "restore it from a copy" in errors[0], errors
    assert store.get_bytes(f"{RUN}/ledger.json") == raw  # the bytes stay for a person to look at


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(GOOD_ATTEMPT)), JUNK, st.sampled_from(["preempted", "crashed", "running", "completed"]))
def test_every_converted_reader_runs_on_any_ledger_that_decodes(key, value, last_class):
    """A ledger either is one CorruptRecord at its decode, or every reader converted to it runs on it: no KeyError,
    TypeError or overflow deep in a policy, a figure or a sweep."""
    from orchestrator.config.schema import RequeueConfig
    from orchestrator.money.cost import Price
    from orchestrator.money.report import JobFigures, build_report
    from orchestrator.money.spend_leases import _dead_cost
    from orchestrator.policy.history import read_attempts, spot_lifetimes, steady_seconds_per_step
    from orchestrator.policy.requeue import RequeuePolicy, start_refusal

    doc = json.loads(json.dumps(GOOD))
    doc["attempts"] = [dict(GOOD_ATTEMPT, **{key: value}), dict(GOOD_ATTEMPT, fence=2, exit_class=last_class)]
    try:
        record = LedgerRecord.decode(doc, WHERE)
    except CorruptRecord as err:
        assert str(err).startswith(WHERE)
        return
    policy = RequeuePolicy(RequeueConfig())
    policy.decide(record.attempts)
    policy.refuse_reason(record)
    start_refusal(record, policy, max_usd=1.0, final_uri="s3://b/job/final/")
    price = Price(usd_per_hour_total=1.0, usd_per_gpu_hour=1.0, on_demand_usd_per_hour_total=3.0, source="test")
    figures = JobFigures(price, record.attempts, step_at_start=40, fallback_tokens_per_step=10)
    out = figures.figures(step=50, attempt_cost_usd=0.1, attempt_gpu_hours=0.0, mean_step_seconds=1.0)
    assert all(math.isfinite(v) for v in out.values())
    build_report(job="job", status=record.status, ledger=record, price=price, figures=out, quality_metric="q",
                 quality=None, tokens_per_step=10, tokens_measured=False)
    read_attempts(record.attempts), list(spot_lifetimes(record.attempts)), steady_seconds_per_step(record.attempts)
    for a in record.attempts:
        cost = _dead_cost(a, record.newest_fence, now=1.8e9)
        assert cost is None or 0 <= cost <= MAX_USD


def test_a_spot_attempt_held_past_a_year_has_no_lifetime_rather_than_a_type_error():
    """Found by the property test above: started at 0 (1970) and ended now, it is read as not ended."""
    from orchestrator.policy.history import AttemptHistory, spot_lifetimes

    doc = dict(GOOD, attempts=[dict(GOOD_ATTEMPT, started_at=0)])
    entry = LedgerRecord.decode(doc, WHERE).attempts[0]
    assert AttemptHistory.from_entry(entry).lifetime is None and list(spot_lifetimes([entry])) == []
    assert list(spot_lifetimes(doc["attempts"])) == []  # the raw reading too


# ---- the converted readers stay converted ----------------------------------------------------------------------
# The ledger's stored keys (``orchestrator.records.ledger``'s shape): outside the records package, the modules below
# read them as ``LedgerRecord`` / ``AttemptEntry`` attributes, never as ``.get("<key>")`` / ``["<key>"]`` of a raw
# ledger or attempt. Scoped to the modules converted so far (issue 41); the others still read raw dicts (listed in
# ``STILL_RAW`` so the list shrinks as they are converted).
LEDGER_KEYS = ("run_name", "status", "fence", "attempts", "checkpoints", "checkpoints_committed", "alerts",
               "mlflow_run_id", "cost_usd", "step", "created_at", "capacity", "repro", "host", "pid", "started_at",
               "ended_at", "last_seen", "exit_class", "step_start", "step_end", "checkpoint_step_at_start",
               "checkpoint_step_end", "instance_type", "gpu_type", "gpus", "spot", "extra", "launched_by", "nodes",
               "size", "key", "time")
CONVERTED = {
    "orchestrator/money/spend_leases.py": (),
    "orchestrator/policy/requeue.py": (),
    "orchestrator/process/supervisor.py": (),
    # attempt_seconds: the raw reading kept for evaluation.billing; format_report, _savings_line read the report
    "orchestrator/money/report.py": ("attempt_seconds", "format_report", "_savings_line"),
    "orchestrator/attempt/money.py": (),
    "orchestrator/attempt/build.py": (),
    "orchestrator/attempt/capacity.py": (),
    # the writer's read-modify-writes (``Ledger.update``'s functions: record_repro, quality) are not readers
    "orchestrator/attempt/record.py": ("record_restart", "record_repro", "update_quality", "record_eval"),
    "orchestrator/policy/history.py": ("from_ledger", "claimed_restart_seconds"),  # the raw entry, checked there
    "orchestrator/money/spend_holds.py": (),
    "orchestrator/process/multinode/timeouts.py": (),
    # capacity_plan, format_capacity_plan: the plan document this module builds (its options, nodes), not a ledger
    "orchestrator/planning/spot.py": ("capacity_plan", "format_capacity_plan"),
    "orchestrator/launch.py": (),
    "orchestrator/process/multinode/records.py": (),
    "orchestrator/attempt/capacity_contract.py": (),
    # replay_history: trainer_state.json's log; close_with_report, run_description: the cost figures and report
    "orchestrator/attempt/reporting.py": ("replay_history", "close_with_report", "run_description"),
    "orchestrator/evaluation/job.py": ("evaluate_run",),  # the checkpoint's manifest (checkpoint.manifest.loads)
    "orchestrator/evaluation/billing.py": (),
    "orchestrator/money/spend.py": (),
    "orchestrator/checkpoint/reward_cache.py": (),
    # a sweep reads its trials' ledgers through records.sweep_record.TrialLedger
    "orchestrator/sweep/trust.py": (),
    "orchestrator/sweep/backends.py": (),
    "orchestrator/sweep/driver.py": ("fn", "intent", "launched", "add_usage"),  # the record's writes (below)
}
STILL_RAW: tuple[str, ...] = ()
_RAW_READ = re.compile(r"""(?:\.get\(\s*|\[\s*)["'](%s)["']""" % "|".join(LEDGER_KEYS))


def _functions(source: str) -> list[tuple[tuple[str, ...], str]]:
    """(the ``def`` names enclosing it, outermost first; the line) for each line of ``source``: from the syntax
    tree, so a signature ``ruff format`` wraps over several lines still encloses its body."""
    spans = sorted((node.lineno, node.end_lineno or node.lineno, node.name) for node in ast.walk(ast.parse(source))
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return [(tuple(name for first, last, name in spans if first <= n <= last), line)
            for n, line in enumerate(source.splitlines(), 1)]


def _raw_reads(module: str, allowed: tuple[str, ...], pattern: re.Pattern) -> list[str]:
    found = []
    for n, (functions, line) in enumerate(_functions((REPO / module).read_text()), 1):
        code = line.split("#", 1)[0]
        if set(functions) & set(allowed) or code.lstrip().startswith(('"', "'")):
            continue
        for match in pattern.finditer(code):
            found.append(f"{module}:{n} ({'.'.join(functions) or 'module'}): {match.group(0)}")
    return found


@pytest.mark.parametrize("module", sorted(CONVERTED))
def test_a_converted_reader_reads_no_stored_ledger_key_from_a_raw_dict(module):
    found = _raw_reads(module, CONVERTED[module], _RAW_READ)
    assert not found, ("read the ledger through LedgerRecord.decode and its attributes "
                       "(orchestrator/records/ledger_record.py):\n" + "\n".join(found))


# ---- the sweep record and benchmark results (issue 41 item 2, issue 42) --------------------------------------
# Their readers in sweep/ and evaluation/ read ``SweepRecord`` / ``TrialEntry`` / ``TrialLedger``
# (orchestrator/records/sweep_record.py) and ``BenchResult`` (orchestrator/records/bench_result.py) attributes. The
# functions named beside a module are the record's writes: a conditional write's function changes the record as
# stored (``SweepState.update``), after the read decoded it.
SWEEP_KEYS = ("version", "space", "fixed", "settings", "trials", "decisions", "usage", "mlflow_run_id", "space_since",
              "fence", "driver", "number", "run_name", "params", "rung", "status", "values", "launches", "submitted",
              "launched_at", "log_offset", "launcher", "refused", "slot_seconds", "idle_seconds", "renewed_at",
              "started", "decision", "quality", "evals", "attempts", "host", "pid")
BENCH_KEYS = ("scores", "samples", "checkpoint", "manifest_sha256", "harness_version", "task_hash", "seed", "cost_usd",
              "seconds", "sha256", "signature", "step", "value", "stderr")
DOCUMENT_READERS = {
    "orchestrator/sweep/state.py": (SWEEP_KEYS, ("mutate", "fn")),
    "orchestrator/sweep/driver.py": (SWEEP_KEYS, ("fn", "intent", "launched", "add_usage")),
    "orchestrator/sweep/decide.py": (SWEEP_KEYS, ()),
    "orchestrator/sweep/trust.py": (SWEEP_KEYS, ()),
    "orchestrator/sweep/backends.py": (SWEEP_KEYS, ()),
    "orchestrator/sweep/cli.py": (SWEEP_KEYS, ()),
    "orchestrator/sweep/tracking.py": (SWEEP_KEYS, ("note",)),
    "orchestrator/sweep/dryrun.py": (SWEEP_KEYS, ()),
    # the lease changes the record inside its writes; ``me`` is this process
    "orchestrator/sweep/lease.py": (SWEEP_KEYS, ("same", "alive", "take", "renew", "release")),
    # kept_samples: the evaluation's tables before they are stored
    "orchestrator/evaluation/results.py": (BENCH_KEYS, ("kept_samples",)),
    "orchestrator/evaluation/watch.py": (BENCH_KEYS, ("read_progress",)),
    "orchestrator/evaluation/selection.py": (BENCH_KEYS, ()),
    # gain: two {value, stderr} pairs, whatever they are of; read_items and items_of: an MLflow artifact, checked there
    # from_history: a run's MLflow metrics, not a stored result
    "orchestrator/evaluation/curve.py": (BENCH_KEYS, ("read_items", "items_of", "items_payload", "from_history")),
    "orchestrator/evaluation/stats.py": (BENCH_KEYS, ("gain", "report_cell")),
}


@pytest.mark.parametrize("module", sorted(DOCUMENT_READERS))
def test_a_reader_of_the_sweep_record_or_a_benchmark_result_reads_no_stored_key_from_a_raw_dict(module):
    keys, allowed = DOCUMENT_READERS[module]
    found = _raw_reads(module, allowed, re.compile(r"""(?:\.get\(\s*|\[\s*)["'](%s)["']""" % "|".join(keys)))
    assert not found, ("read the sweep record and benchmark results decoded, through their attributes "
                       "(orchestrator/records/sweep_record.py, orchestrator/records/bench_result.py):\n"
                       + "\n".join(found))


def test_the_scope_of_the_reader_check_is_honest():
    """Every module named here exists, and the ones still reading raw ledgers do read them (so a conversion moves
    a module from ``STILL_RAW`` to ``CONVERTED``)."""
    for module in (*CONVERTED, *STILL_RAW, *DOCUMENT_READERS):
        assert (REPO / module).is_file(), module
    assert not set(CONVERTED) & set(STILL_RAW)


# ---- the other documents with a record type (issue 41) ---------------------------------------------------------
# The spend index (``records/spend_record.py``), a reward cache shard (``records/reward_record.py``) and a
# multi-node attempt's node entries (``records/node_record.py``): the modules that read and write them use the
# records' attributes and ``encode()``, never ``.get("<key>")`` / ``["<key>"]`` of the stored JSON. Still raw, and
# left so on purpose: ``money/spend_repair.py`` (it salvages what it can from ledgers and an index that do not
# decode, and writes only jobs that ``SpendJob.decode`` takes); outside this floor's helpers: ``cli/status.py``,
# ``cli/ls.py`` and ``sweep/`` hold ``spend.parse_index``'s decoded-then-encoded shape.
SPEND_KEYS = ("jobs", "alerts", "experiment", "months", "open", "month", "base", "spent", "through", "updated_at")
REWARD_KEYS = ("entries", "meta", "shard", "kind", "run_name", "files", "path")
NODE_KEYS = ("attempts", "nodes", "rdzv_id", "node", "host", "pid", "started_at", "ended_at", "exit")
DOCUMENTS = {
    "orchestrator/money/spend.py": ("records/spend_record.py", SPEND_KEYS),
    "orchestrator/money/spend_holds.py": ("records/spend_record.py", SPEND_KEYS),
    "orchestrator/money/spend_leases.py": ("records/spend_record.py", SPEND_KEYS),
    "orchestrator/checkpoint/reward_cache.py": ("records/reward_record.py", REWARD_KEYS),
    "orchestrator/process/multinode/records.py": ("records/node_record.py", NODE_KEYS),
}


@pytest.mark.parametrize("module", sorted(DOCUMENTS))
def test_a_converted_module_reads_no_key_of_its_document_from_raw_json(module):
    record, keys = DOCUMENTS[module]
    raw_read = re.compile(r"""(?:\.get\(\s*|\[\s*)["'](%s)["']""" % "|".join(keys))
    found = []
    for n, (functions, line) in enumerate(_functions((REPO / module).read_text()), 1):
        code = line.split("#", 1)[0]
        if code.lstrip().startswith(('"', "'")):
            continue
        for match in raw_read.finditer(code):
            found.append(f"{module}:{n} ({'.'.join(functions) or 'module'}): {match.group(0)}")
    assert not found, f"read it through orchestrator/{record}'s decode and attributes:\n" + "\n".join(found)
