"""Shared by the tests: spend indexes corrupted each way a bucket can hold one."""
from __future__ import annotations

import json

# what a truncated write, a careless edit or an attacker leaves at _spend/index.json
CORRUPT = {
    "truncated": b'{"jobs": {"a": {"experiment": "x", "mon',
    "nan month": b'{"jobs": {"a": {"experiment": "x", "months": {"2026-12": NaN}, "open": {}}}, "alerts": {}}',
    "negative": json.dumps({"jobs": {"a": {"experiment": "x", "months": {"2026-12": -100.0}}}}).encode(),
    "infinite through": b'{"jobs": {"a": {"experiment": "x", "months": {}, "open": {"1": {"month": "2026-12", '
                        b'"base": 0, "spent": 0, "through": Infinity, "updated_at": 1}}}}}',
    "string amount": json.dumps({"jobs": {"a": {"experiment": "x", "months": {"2026-12": "lots"}}}}).encode(),
    "jobs a list": json.dumps({"jobs": [1, 2]}).encode(),
    "job not an object": json.dumps({"jobs": {"a": 3}}).encode(),
    "not an object": b"[]",
    "boolean amount": json.dumps({"jobs": {"a": {"experiment": "x", "months": {"2026-12": True}}}}).encode(),
}
