"""Where an attempt landed (``attempt.zone``): read from the environment only, checked, and kept in the ledger
within bounds (``records.ledger_record``: the ledger is untrusted input)."""
from __future__ import annotations

import json

import pytest

from orchestrator.attempt.zone import AttemptZone, landed_zone, zone_tags
from orchestrator.records.ledger_record import CorruptRecord, LedgerRecord


def test_orch_zone_wins_over_skypilots_cluster_info():
    info = json.dumps({"cluster_name": "c", "cloud": "AWS", "region": "us-west-2", "zone": "us-west-2b"})
    assert landed_zone({"ORCH_ZONE": "us-east-1a", "SKYPILOT_CLUSTER_INFO": info}) == ("us-east-1a", None)
    assert landed_zone({"SKYPILOT_CLUSTER_INFO": info}) == ("us-west-2b", "us-west-2")


@pytest.mark.parametrize("environ", [{}, {"SKYPILOT_CLUSTER_INFO": "not json"}, {"SKYPILOT_CLUSTER_INFO": "[1]"},
                                     {"SKYPILOT_CLUSTER_INFO": json.dumps({"zone": None})},
                                     {"ORCH_ZONE": "us-east-1a; rm -rf /"}, {"ORCH_ZONE": "x" * 100}])
def test_no_zone_or_a_bad_one_records_none(environ):
    assert landed_zone(environ) == (None, None)


def _ledger(**attempt_fields) -> dict:
    attempt = {"fence": 1, "exit_class": "running", "host": "h", **attempt_fields}
    return {"run_name": "r", "status": "running", "fence": 1, "attempts": [attempt]}


def test_the_ledger_keeps_an_attempts_zone_price_and_reason():
    placed = AttemptZone("us-east-1a", "us-east-1", 0.15, "us-east-1a: $0.2 per useful hour expected")
    attempt = LedgerRecord.decode(_ledger(**placed.fields()), "ledger.json").attempts[0]
    assert (attempt.zone, attempt.zone_region, attempt.zone_usd_per_hour, attempt.zone_reason) == (
        "us-east-1a", "us-east-1", 0.15, placed.reason)
    # a reason longer than the record allows is cut when written, never refused later
    long = AttemptZone("us-east-1a", None, 0.15, "x" * 1000).fields()["zone_reason"]
    assert len(long) == 400 and LedgerRecord.decode(_ledger(zone_reason=long), "l").attempts[0].zone_reason == long


@pytest.mark.parametrize("fields, needle", [({"zone_usd_per_hour": 1e300}, "zone_usd_per_hour"),
                                            ({"zone_usd_per_hour": -1}, "zone_usd_per_hour"),
                                            ({"zone_usd_per_hour": "cheap"}, "zone_usd_per_hour"),
                                            ({"zone": "z" * 65}, "zone"), ({"zone_reason": "y" * 401}, "zone_reason")])
def test_a_corrupt_zone_field_is_one_error_naming_it(fields, needle):
    with pytest.raises(CorruptRecord) as err:
        LedgerRecord.decode(_ledger(**fields), "s3://b/runs/r/ledger.json")
    assert f"'{needle}'" in str(err.value) and "s3://b/runs/r/ledger.json" in str(err.value)


def test_a_zone_from_storage_reaches_the_terminal_without_control_characters():
    attempt = LedgerRecord.decode(_ledger(zone="us-east-1a\x1b[2J", zone_reason="ok\x07"), "l").attempts[0]
    assert attempt.zone == "us-east-1a?[2J" and attempt.zone_reason == "ok?"


def test_mlflow_tags_name_this_attempts_zone_and_every_earlier_ones():
    earlier = LedgerRecord.decode(_ledger(zone="us-east-1a"), "l").attempts
    tags = zone_tags(AttemptZone("us-east-1b", "us-east-1", 0.18, "why"), earlier, 2)
    assert tags == {"zones": "1:us-east-1a 2:us-east-1b", "zone": "us-east-1b", "zone_usd_per_hour": "0.1800",
                    "zone_reason": "why"}
    assert zone_tags(None, [], 1) == {}
