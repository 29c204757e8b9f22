"""The records floor for the sweep record, what a sweep reads of a trial's ledger, and benchmark results (issue 41
item 2, issue 42): whatever storage holds (truncated, wrong-typed, NaN, infinite, 1e300, missing keys), the decode
gives a value whose fields hold their types and bounds, or one CorruptRecord naming the object; never anything
else. A trial entry that does not decode is that trial's only: it reads as failed, with why, and its neighbours
read as they were."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.records.bench_result import BenchResult, digest
from orchestrator.records.fields import MAX_USD, CorruptRecord
from orchestrator.records.sweep_record import STATUSES, SweepBounds, SweepRecord, TrialLedger
from tests.helpers.ledgers import GOOD as GOOD_LEDGER
from tests.helpers.ledgers import corrupted
from tests.helpers.ledgers import GOOD_ATTEMPT, JUNK

WHERE = "s3://b/runs/sw/sweep.json"
GOOD_TRIAL = {"number": 0, "run_name": "sw-t0", "params": {"train.learning_rate": 1e-4, "recipe.lora_r": 8},
              "rung": 0, "status": "paused", "values": {"0": 0.75}, "launches": 1, "submitted": None,
              "launched_at": 1.7e9, "log_offset": 120, "launcher": {"host": "h1", "pid": 4242, "started": 1.7e9}}
GOOD_SWEEP = {"version": 1, "name": "sw", "space": {"train.learning_rate": ["choice", [1e-4, 2e-4]],
                                                    "recipe.lora_r": ["interval", 4, 64, False]},
              "fixed": ["train.max_steps=12"], "settings": {"sampler": "random", "seed": 0, "pruner": "none",
                                                            "max_steps": 12, "budget_usd": 1.0, "metric": "eval_loss"},
              "trials": [GOOD_TRIAL, dict(GOOD_TRIAL, number=1, run_name="sw-t1", status="running", values={})],
              "decisions": [{"trial": 0, "rung": 0, "value": 0.75, "decision": "complete", "at": 1.7e9}],
              "usage": {"slot_seconds": 10.0, "idle_seconds": 2.0}, "space_since": 0, "fence": 3,
              "driver": {"host": "h1", "pid": 99, "started": 1.7e9, "renewed_at": 1.7e9 + 5},
              "mlflow_run_id": "abc123"}
BOUNDS = SweepBounds(domains={"train.learning_rate": ("choice", (1e-4, 2e-4)),
                              "recipe.lora_r": ("interval", 4, 64, True)}, rungs={0: 1, 1: 1})


def fresh(doc: dict) -> dict:
    return json.loads(json.dumps(doc))


def _sweep_decoded_or_named(doc) -> None:
    try:
        record = SweepRecord.decode(doc, WHERE).within(BOUNDS)
    except CorruptRecord as err:
        assert str(err).startswith(WHERE) and "is corrupt: " in str(err)
        return
    assert 0 <= record.slot_seconds <= 1e10 and 0 <= record.idle_seconds <= 1e10
    assert all(math.isfinite(d.value) for d in record.decisions)
    assert not (record.settings.get("budget_usd") or 0) > MAX_USD
    for k, t in enumerate(record.trials):
        assert t.number == k and t.run_name == f"{record.name}-t{k}" and t.status in STATUSES
        assert isinstance(t.rung, int) and t.rung >= 0 and all(math.isfinite(v) for v in t.values.values())
        assert t.launched_at is None or 0 <= t.launched_at <= 4102444800.0
        assert all(not isinstance(v, float) or math.isfinite(v) for v in t.params.values())
        if k in record.broken:
            assert t.status == "failed" and t.refused.startswith("its entry in the sweep's record is corrupt")
    assert record.encode()["trials"] == [t.encode() for t in record.trials]


def test_a_sound_record_decodes_into_attributes_and_encodes_as_stored():
    record = SweepRecord.decode(fresh(GOOD_SWEEP), WHERE)
    t = record.trials[0]
    assert (t.number, t.status, t.values, t.launcher.pid, t.log_offset) == (0, "paused", {0: 0.75}, 4242, 120)
    assert (record.fence, record.driver.renewed_at, record.slot_seconds, record.broken) == (3, 1.7e9 + 5, 10.0, ())
    stored = fresh(GOOD_SWEEP)
    stored["trials"][0].pop("submitted"), stored["trials"][1].pop("submitted")  # None: not written
    assert record.encode() == stored  # an old record reads, and is written back, the same


def test_a_record_written_before_the_lease_and_the_launcher_still_reads():
    old = fresh(GOOD_SWEEP)
    for key in ("fence", "driver", "mlflow_run_id", "space_since"):
        del old[key]
    old["trials"] = [{k: GOOD_TRIAL[k] for k in ("number", "run_name", "params", "rung", "status", "values",
                                                 "launches")}]
    record = SweepRecord.decode(old, WHERE)
    assert (record.fence, record.driver, record.space_since, record.trials[0].launcher) == (0, None, 0, None)


@pytest.mark.parametrize("path, value, problem", [
    (("usage", "slot_seconds"), math.inf, "'slot_seconds' is inf"),
    (("settings", "budget_usd"), 1e300, "'budget_usd' is 1e+300, outside [0, 1e+07]"),
    (("decisions", 0, "value"), math.nan, "'value' is nan"),
    (("driver", "pid"), "99", "'pid' is '99', not a whole number"),
    (("space_since",), 5, "'space_since' is 5, outside [0, 2]"),
    (("trials", 1, "run_name"), "victim-t1", "run_name is 'victim-t1', not 'sw-t1'"),
    (("name",), None, "'name' is missing"),
    (("version",), 2, "'version' is '2', not 1"),
    (("mlflow_run_id",), "x;rm -rf /", "not a run id"),
])
def test_a_bad_record_as_a_whole_is_one_error_naming_it(path, value, problem):
    doc = corrupted(GOOD_SWEEP, path, value)
    with pytest.raises(CorruptRecord) as err:
        SweepRecord.decode(doc, WHERE)
    assert str(err.value).startswith(WHERE) and problem in str(err.value), str(err.value)


@pytest.mark.parametrize("key, value, problem", [
    ("launched_at", 1e300, "launched_at' is 1e+300"), ("values", {"0": math.nan}, "values '0' is nan"),
    ("status", "pwned", "'status' is 'pwned', not one of"), ("rung", -1, "'rung' is -1"),
    ("params", {"train.learning_rate": math.inf}, "'train.learning_rate' is inf"), ("launches", None, "missing"),
    ("launcher", {"host": "h"}, "'pid' is missing"),
])
def test_a_bad_trial_entry_refuses_that_trial_only(key, value, problem):
    doc = fresh(GOOD_SWEEP)
    if value is None:
        del doc["trials"][0][key]
    else:
        doc["trials"][0][key] = value
    record = SweepRecord.decode(doc, WHERE)
    bad, good = record.trials
    assert record.broken == (0,) and bad.status == "failed" and problem in bad.refused, bad.refused
    assert good == SweepRecord.decode(fresh(GOOD_SWEEP), WHERE).trials[1]
    assert record.encode()["trials"][0]["refused"] == bad.refused  # the next write keeps it failed


def test_the_space_and_the_schedule_bound_each_trial():
    doc = fresh(GOOD_SWEEP)
    doc["trials"][0]["params"] = dict(GOOD_TRIAL["params"], **{"compute.price_per_hour": 0.0})
    doc["trials"][1].update(rung=3, params={"train.learning_rate": "2e-4", "recipe.lora_r": 8})
    first, second = SweepRecord.decode(doc, WHERE).within(BOUNDS).trials
    assert "keys outside the sweep's space (compute.price_per_hour)" in first.params_problem
    assert first.rung_problem is None
    assert second.rung_problem == "its rung is 3, past its schedule of 1 rung(s)"
    assert "train.learning_rate='2e-4' is outside the sweep's space" in second.params_problem  # "2e-4" is not 2e-4
    sound = SweepRecord.decode(fresh(GOOD_SWEEP), WHERE).within(BOUNDS).trials
    assert all(t.params_problem is None and t.rung_problem is None for t in sound)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(GOOD_TRIAL)), JUNK, st.sampled_from(sorted(GOOD_SWEEP)), JUNK)
def test_any_field_of_the_record_turned_into_junk_decodes_or_is_named(trial_key, trial_value, key, value):
    doc = fresh(GOOD_SWEEP)
    doc["trials"][1][trial_key] = trial_value
    _sweep_decoded_or_named(doc)
    doc = fresh(GOOD_SWEEP)
    doc[key] = value
    _sweep_decoded_or_named(doc)


@settings(max_examples=200, deadline=None)
@given(st.recursive(JUNK, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(sorted({*GOOD_SWEEP, *GOOD_TRIAL})), inner,
                                                 max_size=6)), max_leaves=12))
def test_any_document_at_all_decodes_as_a_sweep_record_or_is_named(doc):
    _sweep_decoded_or_named(doc)


def test_truncated_bytes_are_one_error_naming_the_record(tmp_path):
    from orchestrator.storage.local import LocalStore
    from orchestrator.sweep.state import SweepState, SweepStateCorrupt

    state = SweepState(LocalStore(tmp_path), "sw")
    state.store.put_bytes(state.key, json.dumps(GOOD_SWEEP).encode()[:-9])
    with pytest.raises(SweepStateCorrupt) as err:
        state.load()
    assert state.uri in str(err.value) and "it is not JSON" in str(err.value) and err.value.exit_code == 4


# ---- what a sweep reads of a trial's ledger ------------------------------------------------------------------
LEDGER_WHERE = "s3://b/runs/sw-t0/ledger.json"
GOOD_TRIAL_LEDGER = dict(fresh(GOOD_LEDGER), status="budget_exhausted",
                         quality={"evals": {"4": {"eval_loss": 0.5, "bench/t/acc": 0.25}}})


def _ledger_decoded_or_named(doc) -> None:
    try:
        ledger = TrialLedger.decode(doc, LEDGER_WHERE)
    except CorruptRecord as err:
        assert str(err).startswith(LEDGER_WHERE) and "is corrupt: " in str(err)
        return
    assert all(isinstance(step, int) and step >= 0 for step in ledger.evals)
    assert all(isinstance(v, float) for at in ledger.evals.values() for v in at.values())
    assert 0 <= ledger.record.cost_usd <= MAX_USD


def test_a_trial_ledger_gives_its_rung_values_and_refuses_a_start_up_over_a_week():
    ledger = TrialLedger.decode(fresh(GOOD_TRIAL_LEDGER), LEDGER_WHERE)
    assert ledger.value(4, "eval_loss") == 0.5 and ledger.evaluated_at(4) and not ledger.evaluated_at(8)
    assert ledger.value(8, "eval_loss") is None and ledger.status == "budget_exhausted"
    doc = fresh(GOOD_TRIAL_LEDGER)
    doc["quality"]["evals"]["4"]["eval_loss"] = math.nan  # a diverged loss: no result at that rung, not corrupt
    assert math.isnan(TrialLedger.decode(doc, LEDGER_WHERE).value(4, "eval_loss"))
    doc["attempts"][0]["extra"] = {"restart": {"total_s": 1e300}}
    with pytest.raises(CorruptRecord, match=r"attempts\[0\] is corrupt: .*took 1e\+300 s, more than a week"):
        TrialLedger.decode(doc, LEDGER_WHERE)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(GOOD_ATTEMPT)), JUNK, JUNK, JUNK)
def test_any_trial_ledger_decodes_or_is_named(attempt_key, attempt_value, evals, metric_value):
    doc = fresh(GOOD_TRIAL_LEDGER)
    doc["attempts"][0][attempt_key] = attempt_value
    _ledger_decoded_or_named(doc)
    doc = fresh(GOOD_TRIAL_LEDGER)
    doc["quality"]["evals"] = evals
    _ledger_decoded_or_named(doc)
    doc = fresh(GOOD_TRIAL_LEDGER)
    doc["quality"]["evals"]["4"]["eval_loss"] = metric_value
    _ledger_decoded_or_named(doc)


# ---- benchmark results ---------------------------------------------------------------------------------------
BENCH_WHERE = "s3://b/runs/_bench/k1/base.json"
GOOD_RESULT = BenchResult.of(checkpoint="base", step=0, manifest_sha256="base:k1", harness_version="0.4.13",
                             task_hash="abc", seed=1234, scores={"t": {"acc": {"value": 0.5, "stderr": 0.25}}},
                             samples={"t": {"acc": [1.0, 0.0]}}, seconds=3.0, cost_usd=0.01)


def _rehashed(doc: dict) -> bytes:
    """``doc`` with its digest recomputed: what anyone who can write the bucket can store."""
    doc["sha256"] = digest({k: v for k, v in doc.items() if k not in ("sha256", "signature")})
    return json.dumps(doc).encode()


def _result_decoded_or_named(raw: bytes) -> None:
    try:
        result = BenchResult.decode(raw, BENCH_WHERE)
    except CorruptRecord as err:
        assert str(err).startswith(BENCH_WHERE) and "is corrupt: " in str(err)
        return
    for task, metrics in result.scores.items():
        for metric, score in metrics.items():
            assert 0.0 <= score.value <= 1.0 and (score.stderr is None or 0.0 <= score.stderr <= 1.0)
            items = result.items(task, metric)
            assert items is None or abs(sum(items) / len(items) - score.value) <= 1e-6
    assert isinstance(result.step, int) and result.step >= 0 and math.isfinite(result.seconds)
    assert result.cost_usd is None or 0 <= result.cost_usd <= MAX_USD


def test_a_result_reads_back_as_written_and_its_score_is_the_mean_of_its_items():
    raw = GOOD_RESULT.encode()
    assert BenchResult.decode(raw, BENCH_WHERE) == GOOD_RESULT
    doc = json.loads(raw)
    doc["scores"]["t"]["acc"]["value"] = 0.75
    with pytest.raises(CorruptRecord, match="score t/acc 0.75 is not the mean of its 2 items"):
        BenchResult.decode(_rehashed(doc), BENCH_WHERE)
    for cut in (1, 9, len(raw) // 2):
        with pytest.raises(CorruptRecord, match="it is not JSON"):
            BenchResult.decode(raw[:-cut], BENCH_WHERE)


@pytest.mark.parametrize("key, value, problem", [
    ("step", "ten", "step is 'ten', not a count"), ("seed", None, "seed is 'None', not a count"),
    ("cost_usd", 1e300, "cost_usd is not a finite non-negative number"), ("seconds", math.nan, "seconds or"),
    ("scores", {"t": {"acc": {"value": math.inf}}}, "score t/acc is 'inf', not a finite number"),
    ("samples", {"t": {"acc": [1.0, 1e300]}}, "an item of t/acc is 1e+300, outside [0, 1]"),
    ("checkpoint", "", "checkpoint is '', not a name"),
])
def test_each_bad_field_of_a_result_is_one_error_naming_it(key, value, problem):
    doc = json.loads(GOOD_RESULT.encode())
    doc[key] = value
    with pytest.raises(CorruptRecord) as err:
        BenchResult.decode(_rehashed(doc), BENCH_WHERE)
    assert str(err.value).startswith(BENCH_WHERE) and problem in str(err.value), str(err.value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(json.loads(GOOD_RESULT.encode()))), JUNK, JUNK, st.booleans())
def test_any_field_of_a_result_turned_into_junk_decodes_or_is_named(key, value, score, rehash):
    doc = json.loads(GOOD_RESULT.encode())
    doc[key] = value
    _result_decoded_or_named(_rehashed(doc) if rehash else json.dumps(doc).encode())
    doc = json.loads(GOOD_RESULT.encode())
    doc["scores"]["t"]["acc"]["value"] = score
    _result_decoded_or_named(_rehashed(doc))


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=64), st.recursive(JUNK, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(sorted(json.loads(GOOD_RESULT.encode()))), inner,
                                                 max_size=6)), max_leaves=12).map(lambda d: _rehashed(d) if isinstance(
                                                     d, dict) else json.dumps(d).encode())))
def test_any_bytes_at_all_decode_as_a_result_or_are_named(raw):
    _result_decoded_or_named(raw)
