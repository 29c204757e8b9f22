"""The records floor: a document from the bucket decodes into its type, or is one clear error naming it.

Property tests (hypothesis) feed each record type documents that storage could hold after a bad write or an
edit: truncated, wrong-typed, NaN, infinite, 1e300, missing keys. Whatever they are, the decode gives a value
whose fields hold their types and bounds, or ``CorruptRecord`` naming the object; never anything else.
"""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.records.fields import MAX_USD, CorruptRecord
from orchestrator.records.ledger_record import LedgerRecord
from tests.helpers.ledgers import GOOD, GOOD_ATTEMPT, JUNK, WHERE, corrupted


def _decoded_or_named(doc) -> None:
    """The one contract: a typed record with its bounds, or CorruptRecord naming the ledger."""
    try:
        record = LedgerRecord.decode(doc, WHERE)
    except CorruptRecord as err:
        assert str(err).startswith(WHERE) and "is corrupt: " in str(err)
        return
    assert 0 <= record.cost_usd <= MAX_USD and isinstance(record.step, int) and record.step >= 0
    for a in record.attempts:
        assert isinstance(a.fence, int) and a.fence >= 1 and 0 <= a.cost_usd <= MAX_USD
        assert a.started_at is None or math.isfinite(a.started_at)
        assert "\x1b" not in a.host


def test_a_sound_ledger_decodes_into_attributes():
    record = LedgerRecord.decode(json.loads(json.dumps(GOOD)), WHERE)
    a = record.attempts[0]
    assert (a.fence, a.exit_class, a.cost_usd, a.spot, a.gpus, a.step_end) == (1, "preempted", 0.25, True, 1, 40)
    assert record.checkpoints[0].key == "job/checkpoints/40-1" and record.checkpoints_committed == 3
    assert record.alerts == {"budget_80": 1.7e9} and record.newest_fence == 1


@pytest.mark.parametrize("path, value, problem", [
    (("attempts", 0, "fence"), None, "'fence' is missing"),  # the KeyError: 'fence' of the spend leases
    (("attempts", 0, "cost_usd"), 1e300, "'cost_usd' is 1e+300, outside [0, 1e+07]"),
    (("attempts", 0, "cost_usd"), math.nan, "'cost_usd' is nan"),
    (("step",), "40", "'step' is '40', not a whole number"),
    (("attempts", 0, "exit_class"), "pwned", "'exit_class' is 'pwned', not one of"),
    (("attempts",), {"0": GOOD_ATTEMPT}, "'attempts' is a JSON dict, not a list"),
    (("status",), 3, "'status' is '3', not one of"),
])
def test_each_corruption_is_one_error_naming_the_ledger_and_the_field(path, value, problem):
    doc = corrupted(GOOD, path, value)
    with pytest.raises(CorruptRecord) as err:
        LedgerRecord.decode(doc, WHERE)
    assert str(err.value).startswith(WHERE) and problem in str(err.value)


def test_a_json_list_or_a_truncated_document_is_named_too():
    with pytest.raises(CorruptRecord, match="is a JSON list, not an object"):
        LedgerRecord.decode([GOOD], WHERE)
    with pytest.raises(ValueError):  # truncated bytes fail JSON itself, before any decode; Ledger.load raises it
        json.loads(json.dumps(GOOD)[:-7])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(GOOD_ATTEMPT)), JUNK, st.sampled_from(sorted(GOOD)), JUNK)
def test_any_field_turned_into_junk_decodes_or_is_named(attempt_key, attempt_value, ledger_key, ledger_value):
    doc = json.loads(json.dumps(GOOD))
    doc["attempts"][0][attempt_key] = attempt_value
    _decoded_or_named(doc)
    doc = json.loads(json.dumps(GOOD))
    doc[ledger_key] = ledger_value
    _decoded_or_named(doc)


@settings(max_examples=200, deadline=None)
@given(st.recursive(JUNK, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                  st.dictionaries(st.sampled_from(sorted(GOOD)), inner, max_size=6)),
                    max_leaves=12))
def test_any_document_at_all_decodes_or_is_named(doc):
    _decoded_or_named(doc)
