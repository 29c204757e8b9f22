"""The HMAC that binds a stored document to the machines allowed to write it.

``ORCH_MANIFEST_HMAC_KEY`` is a secret shared by the machines that write and read a job's documents (never stored
in the bucket or the config). When it is set, every signed document (checkpoint manifests, the sweep record,
benchmark results, evaluation job configs) carries ``signature``: an HMAC-SHA256 over the rest of the document in
canonical JSON; an unsigned or badly signed one is refused by its reader. It sits on the lowest floor so the
records floor can check a signature before it decodes anything.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any

SIGNING_KEY_VARIABLE = "ORCH_MANIFEST_HMAC_KEY"


def signing_key() -> bytes | None:
    """The key from the environment, or None when documents are not signed."""
    key = os.environ.get(SIGNING_KEY_VARIABLE)
    return key.encode() if key else None


def signature(document: dict[str, Any], key: bytes) -> str:
    """The HMAC-SHA256 of ``document`` without its ``signature``, over its canonical JSON."""
    body = {k: v for k, v in document.items() if k != "signature"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def signature_problem(document: dict[str, Any], what: str = "the manifest") -> str | None:
    """With ``ORCH_MANIFEST_HMAC_KEY`` set, why ``document`` (signed with ``signed``: its ``signature`` over the
    rest) is not soundly signed; None when it is, or no key is set."""
    key = signing_key()
    if key is None:
        return None
    given = document.get("signature")
    if not isinstance(given, str):
        return f"{what} is not signed, and {SIGNING_KEY_VARIABLE} is set"
    if not hmac.compare_digest(given, signature(document, key)):
        return f"{what}'s signature does not match (changed after signing, or signed with another key)"
    return None


def signed(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with its ``signature`` when ``ORCH_MANIFEST_HMAC_KEY`` is set (else without one)."""
    key = signing_key()
    body = {k: v for k, v in document.items() if k != "signature"}
    if key is not None:
        body["signature"] = signature(body, key)
    return body
