"""The records floor beyond the ledger: the spend index (its entries, holds and leases), GRPO's reward cache shards
and a multi-node attempt's node entries each decode into their type, or are one clear error naming the object.

Property tests (hypothesis) feed each record documents that storage could hold after a bad write or an edit:
truncated, wrong-typed, NaN, infinite, 1e300, missing keys. Whatever they are, the decode gives a value whose fields
hold their types and bounds, or ``CorruptRecord`` naming the object; never anything else. Then what a user relies
on: a bad document degrades only its own job, shard or node entry.
"""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.money.spend import INDEX_KEY, SpendIndexCorrupt, parse_index
from orchestrator.records.fields import LATEST_TIME, MAX_USD, CorruptRecord, Fields
from orchestrator.records.node_record import NodeRecord
from orchestrator.records.reward_record import REWARD_BOUND, RewardShard, RewardShardManifest
from orchestrator.records.spend_record import SpendIndexRecord
from orchestrator.storage import LocalStore
from tests.helpers.ledgers import JUNK, corrupted

WHERE = "s3://b/runs/_spend/index.json"
ENTRY = {"month": "2026-12", "base": 0.0, "spent": 0.5, "through": 0.75, "updated_at": 1.7e9}
HOLD = {"month": "2026-12", "base": 0.0, "spent": 0.0, "through": 0.1, "updated_at": 1.7e9}
JOB = {"experiment": "x", "months": {"2026-11": 1.0}, "open": {"2": ENTRY, "hold:h:42:1": HOLD}}
INDEX = {"jobs": {"a": JOB, "b": {"experiment": "y", "months": {"2026-12": 2.0}, "open": {}}},
         "alerts": {"2026-12/monthly_cap_50": 1.7e9}}
A, B = "a" * 32, "b" * 32
SHARD = {"entries": [["f", A, B, 0.5], ["g", B, A, -3]]}
NODE = {"node": 1, "host": "n2", "pid": 4242, "started_at": 1.7e9, "ended_at": 1.7e9 + 60, "exit": 137}


def _copy(doc):
    return json.loads(json.dumps(doc))


def _named(err: CorruptRecord, where: str) -> None:
    assert str(err).startswith(where) and "is corrupt: " in str(err), str(err)


# ---- the spend index ---------------------------------------------------------------------------------------------
def _index_decoded_or_named(doc) -> None:
    """The one contract: a typed index within its bounds, or CorruptRecord naming the field's path."""
    try:
        index = SpendIndexRecord.decode(doc)
    except CorruptRecord as err:
        assert err.where and err.problem and "\x1b" not in err.where
        return
    for job in index.jobs.values():
        assert isinstance(job.experiment, str)
        assert all(0 <= usd <= MAX_USD for usd in job.months.values())
        for entry in job.open.values():
            assert all(isinstance(v, float) and 0 <= v <= MAX_USD for v in (entry.base, entry.spent, entry.through))
            assert 0 <= entry.updated_at <= LATEST_TIME and entry.charge() >= 0
    assert all(0 <= when <= LATEST_TIME for when in index.alerts.values())
    assert SpendIndexRecord.decode(_copy(index.encode())) == index  # what a writer stores reads back the same


def test_a_sound_index_decodes_into_attributes_and_encodes_to_its_stored_shape():
    index = SpendIndexRecord.decode(_copy(INDEX))
    a = index.jobs["a"]
    assert (a.experiment, a.months, a.open["2"].through, a.open["hold:h:42:1"].through) == ("x", {"2026-11": 1.0},
                                                                                          0.75, 0.1)
    assert index.month_usd("2026-12") == pytest.approx(0.85 + 2.0) and index.experiment_usd("x") == pytest.approx(1.85)
    assert index.month_usd("2026-12", held=False) == pytest.approx(2.5)
    assert index.encode() == INDEX  # the stored format is unchanged
    old = {"jobs": {"a": {"experiment": "x", "months": {"2026-12": 1.0}}}}  # written before "open" and "alerts"
    assert SpendIndexRecord.decode(old).jobs["a"].open == {} and parse_index(json.dumps(old).encode(), "w", "s")


@pytest.mark.parametrize("path, value, problem", [
    (("jobs", "a", "open", "2", "through"), 1e300, "jobs.a.open.2: 'through' is 1e+300, outside [0, 1e+07]"),
    (("jobs", "a", "open", "2", "spent"), math.nan, "jobs.a.open.2: 'spent' is nan"),
    (("jobs", "a", "open", "2", "base"), None, "jobs.a.open.2: 'base' is missing"),
    (("jobs", "a", "open", "2", "month"), "December", "jobs.a.open.2: 'month' is 'December', not a month (YYYY-MM)"),
    (("jobs", "a", "open", "hold:h:42:1", "updated_at"), math.inf, "jobs.a.open.hold:h:42:1: 'updated_at' is inf"),
    (("jobs", "a", "months", "2026-11"), -1.0, "jobs.a.months: '2026-11' is -1.0, outside [0, 1e+07]"),
    (("jobs", "a", "months", "2026-11"), "1.0", "jobs.a.months: '2026-11' is '1.0', not a number"),
    (("jobs", "a", "open"), [ENTRY], "jobs.a: 'open' is a JSON list, not an object"),
    (("jobs", "b", "experiment"), None, "jobs.b: 'experiment' is missing"),
    (("alerts", "2026-12/monthly_cap_50"), 1e300, "alerts: '2026-12/monthly_cap_50' is 1e+300"),
])
def test_each_corruption_of_the_index_is_one_error_naming_the_object_and_the_field(path, value, problem):
    doc = corrupted(INDEX, path, value)
    raw = json.dumps(doc).encode()  # NaN and Infinity as Python's json writes them (and reads them back)
    with pytest.raises(SpendIndexCorrupt) as err:
        parse_index(raw, WHERE, "s3://b/runs")
    text = str(err.value)
    assert text.startswith(f"the spend index {WHERE} is unreadable: {problem}"), text
    assert "orchestrator storage repair-spend s3://b/runs" in text and err.value.exit_code == 3


def test_a_truncated_index_or_one_with_a_terminal_escape_in_a_name_is_named_safely():
    with pytest.raises(SpendIndexCorrupt, match="is unreadable: it is not JSON"):
        parse_index(json.dumps(INDEX).encode()[:-9], WHERE, "s3://b/runs")
    doc = {"jobs": {"\x1b[2Jevil": {"experiment": "x", "months": {"2026-12": "lots"}}}}
    with pytest.raises(SpendIndexCorrupt) as err:
        parse_index(json.dumps(doc).encode(), WHERE, "s3://b/runs")
    assert "jobs.?[2Jevil.months" in str(err.value) and "\x1b" not in str(err.value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(ENTRY)), JUNK, st.sampled_from(sorted(JOB)), JUNK, st.sampled_from(sorted(INDEX)), JUNK)
def test_any_field_of_the_index_turned_into_junk_decodes_or_is_named(entry_key, entry_value, job_key, job_value,
                                                                     index_key, index_value):
    for change in (lambda d: d["jobs"]["a"]["open"]["2"].__setitem__(entry_key, entry_value),
                   lambda d: d["jobs"]["a"].__setitem__(job_key, job_value),
                   lambda d: d["jobs"]["a"]["months"].__setitem__("2026-11", entry_value),
                   lambda d: d["alerts"].__setitem__("x", entry_value),
                   lambda d: d.__setitem__(index_key, index_value)):
        doc = _copy(INDEX)
        change(doc)
        _index_decoded_or_named(doc)


@settings(max_examples=200, deadline=None)
@given(st.recursive(JUNK, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["jobs", "alerts", "a", "experiment", "months", "open", "2026-12", "2", *ENTRY]),
                    inner, max_size=6)), max_leaves=14))
def test_any_document_at_all_decodes_as_an_index_or_is_named(doc):
    _index_decoded_or_named(doc)


def test_the_repair_writes_only_an_index_that_decodes(tmp_path):
    """A ledger whose attempts claim $9M each: their sum is past any budget, so that job is left out of the rebuilt
    index with the reason (it would make the whole index unreadable to every capped job); the others are kept."""
    from orchestrator.money.spend_repair import rebuild_index

    store = LocalStore(tmp_path / "runs")
    attempt = {"fence": 1, "exit_class": "preempted", "started_at": 1.7e9, "ended_at": 1.7e9 + 60, "cost_usd": 9e6}
    store.put_bytes("rich/ledger.json", json.dumps({"fence": 2, "attempts": [attempt, dict(attempt, fence=2)]}).encode())
    store.put_bytes("sane/ledger.json", json.dumps({"fence": 1, "attempts": [dict(attempt, cost_usd=0.5)]}).encode())
    repair = rebuild_index(store)
    assert sorted(repair.index["jobs"]) == ["sane"]
    assert any("jobs.rich.months" in s and "left out" in s for s in repair.skipped), repair.skipped
    assert SpendIndexRecord.decode(_copy(repair.index)).month_usd("2023-11") == pytest.approx(0.5)


def test_a_capped_job_is_refused_by_an_index_holding_a_dollar_figure_past_any_budget(tmp_path):
    """1e300 was a finite non-negative amount, and its sums turned every cap's room into -inf or nan; now it is
    the index's one named error, and the capped job stops (exit 3) saying how to repair it."""
    from orchestrator.money.spend import Caps, SpendIndex

    store = LocalStore(tmp_path / "runs")
    doc = _copy(INDEX)
    doc["jobs"]["b"]["months"]["2026-12"] = 1e300
    store.put_bytes(INDEX_KEY, json.dumps(doc).encode())
    with pytest.raises(SpendIndexCorrupt, match=r"jobs\.b\.months: '2026-12' is 1e\+300, outside"):
        SpendIndex(store, Caps("a", "x", monthly_max_usd=10.0)).refusal()


# ---- the reward cache ------------------------------------------------------------------------------------------
def _shard_decoded_or_named(doc) -> None:
    try:
        shard = RewardShard.decode(doc, "s3://b/g/reward_cache/00001-000000/rewards.json")
    except CorruptRecord as err:
        _named(err, "s3://b/g/reward_cache/00001-000000/rewards.json")
        return
    for (func, prompt, completion), value in shard.rewards.items():
        assert isinstance(func, str) and len(prompt) == len(completion) == 32
        assert isinstance(value, float) and math.isfinite(value) and abs(value) <= REWARD_BOUND
    assert RewardShard.decode(_copy(shard.encode()), "again") == shard


def test_a_sound_shard_decodes_and_encodes_to_its_stored_shape():
    shard = RewardShard.decode(_copy(SHARD), "w")
    assert shard.rewards == {("f", A, B): 0.5, ("g", B, A): -3.0}
    assert shard.encode() == {"entries": [["f", A, B, 0.5], ["g", B, A, -3.0]]}
    manifest = {"run_name": "g", "meta": {"kind": "grpo_reward_cache", "shard": "00001-000000"},
                "files": [{"path": "rewards.json", "size": 1, "sha256": "0" * 64}]}
    RewardShardManifest.decode(manifest, "w").check("g", "00001-000000", "w")
    with pytest.raises(CorruptRecord, match="its manifest is that of job 'g', shard '00001-000000'"):
        RewardShardManifest.decode(manifest, "w").check("other", "00001-000000", "w")


@pytest.mark.parametrize("value, problem", [
    (math.nan, "entry 1: reward nan is not a finite number"), (math.inf, "entry 1: reward inf is not a finite"),
    (1e300, "entry 1: reward 1e+300 is beyond +-1e+06"), ("3", "entry 1: reward '3' is not a finite number"),
    (True, "entry 1: reward True is not a finite number"),
])
def test_each_bad_reward_is_one_error_naming_the_shard_and_the_entry(value, problem):
    doc = _copy(SHARD)
    doc["entries"][1][3] = value
    with pytest.raises(CorruptRecord) as err:
        RewardShard.decode(doc, "s3://b/g/reward_cache/x/rewards.json")
    assert str(err.value).startswith(f"s3://b/g/reward_cache/x/rewards.json is corrupt: {problem}"), str(err.value)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 3), JUNK, st.one_of(JUNK, st.lists(JUNK, max_size=5)))
def test_any_entry_turned_into_junk_decodes_or_is_named(position, value, entry):
    doc = _copy(SHARD)
    doc["entries"][0][position] = value
    _shard_decoded_or_named(doc)
    _shard_decoded_or_named({"entries": [entry]})
    _shard_decoded_or_named({"entries": value})
    _shard_decoded_or_named(value)


# ---- node entries ----------------------------------------------------------------------------------------------
def _node_decoded_or_named(doc) -> None:
    try:
        node = NodeRecord.decode(Fields(doc, "ledger.json attempts[0] nodes[0]"))
    except CorruptRecord as err:
        _named(err, "ledger.json attempts[0] nodes[0]")
        return
    assert isinstance(node.node, int) and 0 <= node.node and (node.pid is None or node.pid >= 0)
    assert node.exit is None or -255 <= node.exit <= 255
    assert all(t is None or 0 <= t <= LATEST_TIME for t in (node.started_at, node.ended_at))
    assert "\x1b" not in node.host
    assert NodeRecord.decode(Fields(_copy(node.encode()), "again")) == node


def test_a_sound_node_entry_decodes_encodes_and_merges():
    node = NodeRecord.decode(Fields(_copy(NODE), "w"))
    assert node.encode() == NODE
    seen = NodeRecord(node=1, host="127.0.0.9", pid=9, started_at=1.7e9, ended_at=999.0, exit=-9)
    assert node.merged(seen, fill_only=True) == node  # a node's own record wins
    lost = NodeRecord(node=1, host="n2", pid=None, started_at=1.7e9, ended_at=None, exit=None)
    assert lost.merged(seen, fill_only=True) == NodeRecord(1, "n2", 9, 1.7e9, 999.0, -9)


@pytest.mark.parametrize("key, value, problem", [
    ("node", -1, "'node' is -1, outside [0, 100000]"), ("node", None, "'node' is missing"),
    ("exit", 300, "'exit' is 300, outside [-255, 255]"), ("pid", "42", "'pid' is '42', not a whole number"),
    ("started_at", 1e300, "'started_at' is 1e+300, outside"), ("ended_at", math.nan, "'ended_at' is nan"),
])
def test_each_corruption_of_a_node_entry_is_one_error_naming_it(key, value, problem):
    doc = _copy(NODE)
    if value is None:
        del doc[key]
    else:
        doc[key] = value
    with pytest.raises(CorruptRecord) as err:
        NodeRecord.decode(Fields(doc, "ledger.json attempts[0] nodes[1]"))
    assert str(err.value).startswith(f"ledger.json attempts[0] nodes[1] is corrupt: {problem}"), str(err.value)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(NODE)), JUNK, JUNK)
def test_any_node_field_turned_into_junk_decodes_or_is_named(key, value, doc):
    node = _copy(NODE)
    node[key] = value
    _node_decoded_or_named(node)
    _node_decoded_or_named(doc)


def test_a_corrupt_node_entry_degrades_only_itself_when_a_node_records_itself(tmp_path, monkeypatch, caplog):
    """Another writer left node 0's entry with an exit of 1e300 and a non-object beside it: node 1 still records
    itself, node 0's odd entry is dropped with a warning naming it, and the attempt's other fields are untouched."""
    from orchestrator.process.multinode.records import record_nodes
    from orchestrator.records.ledger import Ledger
    from orchestrator.records.ledger_record import LedgerRecord

    ledger = Ledger(LocalStore(tmp_path / "runs"), "mn")
    monkeypatch.setenv("ORCH_RDZV_ID", "job-1-0")
    begun = ledger.begin_attempt(host="h", pid=1, instance_type=None, gpu_type=None, gpus=2, spot=True,
                                 checkpoint_step=0)
    doc = json.loads(ledger.store.get_bytes("mn/ledger.json"))
    doc["attempts"][0]["nodes"] = [dict(NODE, node=0, exit=1e300), "junk"]
    ledger.store.put_bytes("mn/ledger.json", json.dumps(doc).encode())
    mine = dict(NODE, started_at=begun["started_at"], ended_at=None, exit=None)
    assert record_nodes(ledger, "job-1-0", [mine])
    stored = json.loads(ledger.store.get_bytes("mn/ledger.json"))["attempts"][0]
    assert stored["nodes"] == [mine] and stored["fence"] == begun["fence"]
    assert f"{ledger.uri} attempts[0] nodes[0]: 'exit' is" in caplog.text and "outside [-255, 255]" in caplog.text
    assert f"{ledger.uri} attempts[0] nodes[1]: it is a JSON str, not an object; dropped" in caplog.text
    assert LedgerRecord.decode(json.loads(ledger.store.get_bytes("mn/ledger.json")), ledger.uri).attempts[0].nodes
