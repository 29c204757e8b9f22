"""Secrets out of everything the project writes: configs logged to MLflow, logs, manifests, generated scripts.

``redact`` replaces secret values in a config (by key: ``token``, ``password``, a webhook URL, ...; and by
shape: a URL's password, a ``?token=`` query, an AWS key, ``--x_token=`` items); ``scrub_text`` removes known
secrets and those shapes from free text; ``secrets_in`` lists what a config holds that must never be written.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional, cast

REDACTED = "***"


_SECRET_KEY_WORDS = {
    "key",
    "secret",
    "token",
    "password",
    "passwd",
    "pwd",
    "credential",
    "credentials",
    "auth",
    "apikey",
}
# query parameters that carry credentials: the words above plus signed-URL signatures (S3's X-Amz-Signature,
# Azure SAS "sig")
_SECRET_PARAM_WORDS = _SECRET_KEY_WORDS | {"sig", "signature"}
_POINTER_WORDS = {"name", "env", "file", "path"}
# a webhook URL is a credential as a whole: Slack, Discord and Teams keep the secret in its path
_WEBHOOK_KEY_WORDS = {"webhook", "webhooks", "hook", "hooks"}
# Split "aws_secret_access_key", "apiKey", "hf-token" into words, so "max_new_tokens"
# or "tokenizer" (harmless numbers and names) are not mistaken for secrets.
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@:]+:[^/\s@]+@")
# scheme://[userinfo@]host[:port] and the rest of the URL (path, query, fragment)
_URL = re.compile(r"(?P<base>[A-Za-z][A-Za-z0-9+.-]*://[^/\s?#'\"<>]+)(?P<rest>[^\s'\"<>]*)")
# hosts whose webhook URLs are recognised in free text, without a key naming them
_KNOWN_WEBHOOK = re.compile(
    r"(?P<base>https?://(?:hooks\.slack\.com|(?:[\w-]+\.)?discord(?:app)?\.com/api/webhooks|[\w.-]+\.webhook\.office\.com))"
    r"(?P<rest>/[^\s'\"<>]+)"
)
_QUERY_PARAM = re.compile(r"(?P<pre>[?&;])(?P<name>[^=&#;\s'\"]+)=(?P<value>[^&#;\s'\"]+)")
# key=value in free text and in list items ("--hf_token=...", "budget.webhook_url=...", "HF_TOKEN=...")
_ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9_.\-])(?P<key>-{0,2}[A-Za-z_][A-Za-z0-9_.\-]*)=(?P<value>'[^']*'|\"[^\"]*\"|[^\s'\",;&]+)"
)
_ENV_REFERENCE = re.compile(
    r"^['\"]?\$\{(?:[^{}]|\$\{[^{}]*\})*\}['\"]?$"
)  # ${oc.env:NAME}: names a secret, holds none
_AWS_ACCESS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")
# 40 chars of [A-Za-z0-9/+] with upper, lower and a digit: the shape of an AWS secret
# access key ("key=<secret>" included). Requiring mixed case spares 40-char hex digests (git SHAs).
_AWS_SECRET = re.compile(
    r"(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]{0,39}[a-z])(?=[A-Za-z0-9/+]{0,39}[A-Z])(?=[A-Za-z0-9/+]{0,39}[0-9])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"
)


def _words(key: str) -> set[str]:
    return {w.lower() for w in _WORD_SPLIT.split(str(key)) if w}


def is_secret_key(key: str) -> bool:
    words = [w.lower() for w in _WORD_SPLIT.split(str(key)) if w]
    if len(words) > 1 and words[-1] in _POINTER_WORDS:
        return False  # "secret_name", "hf_token_env", "key_file": says where a secret is, holds none
    return bool(set(words) & _SECRET_KEY_WORDS) or str(key).lower().endswith(("password", "secret", "token", "apikey"))


def is_webhook_key(key: str) -> bool:
    """True for keys such as ``webhook_url`` or ``slack_hook``: their URL (path and query) is a credential."""
    return bool(_words(key) & _WEBHOOK_KEY_WORDS)


def is_env_reference(value: Any) -> bool:
    """True for a value that only names an environment variable (``${oc.env:NAME}``): it holds no secret."""
    return isinstance(value, str) and bool(_ENV_REFERENCE.match(value.strip()))


def _remember(found: Optional[set[str]], secret: str) -> None:
    if found is None or not secret or secret == REDACTED:
        return
    found.add(secret)
    # "Bearer <token>": free text may show the long part alone
    found.update(part for part in secret.split() if len(part) >= 8 and part != secret)


def _redact_url_rest(text: str, found: Optional[set[str]]) -> str:
    """Every URL in ``text`` cut to scheme://host[:port]/*** (a webhook: the path and query are the secret)."""

    def cut(m: re.Match[str]) -> str:
        rest = m.group("rest")
        if not rest or rest in ("/", "/" + REDACTED):
            return m.group(0)
        _remember(found, rest.lstrip("/"))
        return cast(str, m.group("base") + "/" + REDACTED)

    return _URL.sub(cut, text)


def _scrub_patterns(text: str, found: Optional[set[str]] = None) -> str:
    """``text`` with secret-shaped parts replaced; each replaced part is added to ``found``."""

    def userinfo(m: re.Match[str]) -> str:
        _remember(found, m.group(0)[len(m.group("scheme")) : -1])
        return cast(str, m.group("scheme") + REDACTED + "@")

    def known_webhook(m: re.Match[str]) -> str:
        _remember(found, m.group("rest").lstrip("/"))
        return cast(str, m.group("base") + "/" + REDACTED)

    def query(m: re.Match[str]) -> str:
        if not (_words(m.group("name")) & _SECRET_PARAM_WORDS or is_secret_key(m.group("name"))):
            return m.group(0)
        _remember(found, m.group("value"))
        return f"{m.group('pre')}{m.group('name')}={REDACTED}"

    def assignment(m: re.Match[str]) -> str:
        key, value = m.group("key"), m.group("value")
        if is_env_reference(value) or value.strip("'\"") == REDACTED:
            return m.group(0)
        leaf = key.lstrip("-+~").rsplit(".", 1)[-1]
        if is_webhook_key(leaf):
            return f"{key}={_redact_url_rest(value, found)}"
        if is_secret_key(leaf):
            _remember(found, value.strip("'\""))
            return f"{key}={REDACTED}"
        return m.group(0)

    def pattern(m: re.Match[str]) -> str:
        _remember(found, m.group(0))
        return REDACTED

    text = _URL_USERINFO.sub(userinfo, text)
    text = _KNOWN_WEBHOOK.sub(known_webhook, text)
    text = _QUERY_PARAM.sub(query, text)
    text = _ASSIGNMENT.sub(assignment, text)
    text = _AWS_ACCESS_KEY_ID.sub(pattern, text)
    return _AWS_SECRET.sub(pattern, text)


def _redact_whole(value: Any, found: Optional[set[str]]) -> Any:
    """A value under a secret key: every scalar in it replaced (lists and dicts keep their shape)."""
    if isinstance(value, Mapping):
        return {k: _redact_whole(v, found) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_whole(v, found) for v in value]
    if value is None or isinstance(value, bool) or is_env_reference(value):
        return value
    if isinstance(value, str):
        _remember(found, value)
    return REDACTED


def redact(obj: Any, _found: Optional[set[str]] = None) -> Any:
    """A copy of ``obj`` (dicts, lists, scalars) with secrets replaced by ``"***"``.

    Replaced: values of keys whose words include key/secret/token/password/
    passwd/credential/auth (every item of a list or dict under such a key too);
    the path and query of URLs under webhook keys (``webhook_url``:
    ``https://hooks.slack.com/***``); the value of an ``{"name": "HF_TOKEN",
    "value": ...}`` pair; in any string: ``user:password@`` in URLs, URL query
    parameters named like tokens, keys, signatures or passwords,
    ``secret_key=value`` assignments, Slack/Discord/Teams webhook URLs, and
    strings shaped like AWS access keys or secret keys. A value that only names
    an environment variable (``${oc.env:NAME}``) is kept. ``_found`` collects
    every replaced value, for :func:`scrub_text`.
    """
    if isinstance(obj, Mapping):
        named_secret = is_secret_key(str(obj.get("name", ""))) and "value" in obj and "name" in obj
        out = {}
        for key, value in obj.items():
            if named_secret and key == "value":
                out[key] = _redact_whole(value, _found)
            elif is_webhook_key(key) and isinstance(value, str) and not is_env_reference(value):
                out[key] = _scrub_patterns(_redact_url_rest(value, _found), _found)
            elif value is not None and not isinstance(value, (bool, Mapping)) and is_secret_key(key):
                out[key] = _redact_whole(value, _found)
            else:
                out[key] = redact(value, _found)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact(v, _found) for v in obj]
    if isinstance(obj, str):
        # Secret-shaped substrings are found again by pattern in scrub_text, so only
        # the secret part goes, not the whole value (a URL keeps its host).
        return _scrub_patterns(obj, _found)
    return obj


def scrub_text(text: str, secrets: Any = ()) -> str:
    """``text`` with each of ``secrets`` (strings of 4+ chars) and secret-shaped strings replaced."""
    for secret in sorted({s for s in secrets if isinstance(s, str) and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return _scrub_patterns(text)


def secrets_in(obj: Any) -> set[str]:
    """Every value :func:`redact` would replace in ``obj`` (for checks that generated text holds none)."""
    found: set[str] = set()
    redact(obj, found)
    return {s for s in found if len(s) >= 4}
