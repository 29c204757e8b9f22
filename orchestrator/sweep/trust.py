"""What a sweep takes from its record in the bucket, and how far it trusts it (docs/trust.md, "The sweep record").

Whoever can write the bucket can write ``sweep.json`` and the trials' ledgers. So:

- a trial's command line is built from the sweep's own config: its parameters are the ones the sweep's space and
  seeded sampler give that trial (``launch_params``): keys exactly the space's, each value in the space's domain
  (``in_domain``), and, where the sampler re-derives it (``random`` and ``grid``, for trials sampled under the
  current space: ``space_since``), equal to the re-derived value. A trial whose stored parameters fail is refused
  (``TrialRefused``): it is not launched again, and the sweep's other trials go on;
- a swept secret (a key ``orchestrator.core.redaction`` redacts) is stored redacted (``stored_params``,
  ``stored_space``); its value at launch is the sampler's;
- with ``ORCH_MANIFEST_HMAC_KEY`` set the record is signed as a checkpoint manifest is (``sign``, ``verify``:
  ``orchestrator.checkpoint.manifest``'s own HMAC);
- what the sweep reads of a trial's ledger is checked (``trial_ledger``, ``start_ups``): a ledger that is not an
  object, or a start-up that is not a finite number of seconds up to a week, refuses that trial only.
"""
from __future__ import annotations

from typing import Any, Optional

from orchestrator.core.errors import UserError
from orchestrator.core.exitcodes import ExitClass
from orchestrator.core.signing import signature_problem as core_signature_problem
from orchestrator.core.signing import signed
from orchestrator.policy.history import MAX_RESTART_SECONDS as WEEK_S  # a start-up longer is corrupt, not slow
from orchestrator.sweep.space import in_domain


class TrialRefused(UserError):
    """One trial's stored record (its parameters, rung or ledger) cannot be used: that trial is not launched."""

    exit_class = ExitClass.CONFIG_ERROR


# ---- the record's signature ------------------------------------------------------------
def sign(doc: dict) -> dict:
    """``doc`` as stored: with its HMAC-SHA256 when ``ORCH_MANIFEST_HMAC_KEY`` is set (the manifests' signer)."""
    body = signed(doc)
    doc.clear()
    doc.update(body)
    return doc


def signature_problem(doc: dict) -> Optional[str]:
    """Why ``doc``'s signature fails (``ORCH_MANIFEST_HMAC_KEY`` set), or None."""
    return core_signature_problem(doc, "the record")


# ---- secrets ------------------------------------------------------------------------------
def _redacted(key: str, value: Any) -> Any:
    from orchestrator.core.redaction import redact

    if not isinstance(value, str):
        return value
    leaf = key.rsplit(".", 1)[-1]
    return redact({leaf: value})[leaf]


def stored_params(params: dict) -> dict:
    """A trial's parameters as the record keeps them: a secret's value (a token, a webhook URL) redacted."""
    return {k: _redacted(k, v) for k, v in params.items()}


def stored_space(space_json: dict) -> dict:
    """The space as the record keeps it: a secret key's choices redacted."""
    return {k: ([spec[0], [_redacted(k, v) for v in spec[1]]] if spec and spec[0] == "choice" else spec)
            for k, spec in space_json.items()}


# ---- parameters ---------------------------------------------------------------------------
def rederive(space, settings: dict, number: int) -> Optional[dict]:
    """Trial ``number``'s parameters as the seeded sampler gives them, where that depends on nothing but the
    space, the seed and the number (``random``: seed + number; ``grid``: Optuna's grid point ``number``); None for
    ``tpe`` (its draw depends on the results it had when it asked)."""
    import optuna
    from optuna.trial import TrialState

    from orchestrator.sweep.decide import _direction, _plain, _sampler

    if settings["sampler"] not in ("random", "grid"):
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=_direction(settings), sampler=_sampler(settings, space, number))
    for _ in range(number):  # placeholders: the trial asked is number ``number``, as it was when sampled
        study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
    asked = study.ask(space.distributions())
    return {key: _plain(asked.params[key]) for key in space.specs}


def launch_params(space, settings: dict, trial: dict, *, since: int) -> dict:
    """The parameters trial ``trial`` runs with: the sweep's own (see the module's docstring). Raises
    TrialRefused naming what in the stored parameters is not the sweep's."""
    stored = trial["params"]
    number = trial["number"]
    if set(stored) != set(space.specs):
        extra, missing = sorted(set(stored) - set(space.specs)), sorted(set(space.specs) - set(stored))
        raise TrialRefused(f"its stored parameters name keys outside the sweep's space ({', '.join(extra) or '-'}) "
                           f"or lack some of it ({', '.join(missing) or '-'})")
    derived = rederive(space, settings, number) if number >= since else None
    out = {}
    for key, value in sorted(stored.items()):
        if derived is not None:
            if _redacted(key, derived[key]) != value:
                raise TrialRefused(f"its stored {key}={value!r} is not what the sweep's seeded sampler gives trial "
                                   f"{number} ({_redacted(key, derived[key])!r})")
            out[key] = derived[key]
        elif in_domain(space, key, value):
            out[key] = value
        else:
            out[key] = _secret_choice(space, key, value)
    return out


def _secret_choice(space, key: str, value: Any) -> Any:
    """The one choice of a secret key whose redacted form is ``value``; TrialRefused when none or several are."""
    from orchestrator.sweep.space import _values

    spec = space.specs[key]
    matches = [c for c in _values(spec) if c != _redacted(key, c) and _redacted(key, c) == value] \
        if spec[0] != "interval" else []
    if len(matches) != 1:
        raise TrialRefused(f"its stored {key}={value!r} is outside the sweep's space ({_show(spec)})")
    return matches[0]


def _show(spec) -> str:
    from orchestrator.sweep.space import _show as show

    return show(spec)


# ---- rungs and ledgers ------------------------------------------------------------------------
def rung_problem(settings: dict, trial: dict) -> Optional[str]:
    """Why trial ``trial``'s rung or rung results cannot be its (past its schedule), or None."""
    from orchestrator.sweep.decide import trial_steps

    n = len(trial_steps(settings, trial["number"]))
    if trial["rung"] >= n:
        return f"its rung is {trial['rung']}, past its schedule of {n} rung(s)"
    late = sorted(r for r in trial["values"] if int(r) >= n)
    return f"it holds results at rung(s) {', '.join(late)}, past its schedule of {n}" if late else None


def trial_ledger(store, run_name: str) -> dict:
    """The trial's ledger ({} before its first attempt); TrialRefused when it does not parse or is not an object."""
    from orchestrator.records.ledger import Ledger

    ledger = Ledger(store, run_name)
    try:
        doc = ledger.load()
    except (ValueError, UnicodeDecodeError) as err:
        raise TrialRefused(f"its ledger {ledger.uri} is not JSON ({str(err)[:80]})") from None
    if not isinstance(doc, dict):
        raise TrialRefused(f"its ledger {ledger.uri} is a JSON {type(doc).__name__}, not an object")
    attempts = doc.get("attempts", [])
    if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
        raise TrialRefused(f"its ledger {ledger.uri} holds attempts that are not a list of objects")
    return doc


def rung_value(ledger: dict, step: int, metric: str) -> Any:
    """The trial's ``metric`` at ``step`` as its ledger's ``quality.evals`` holds it (None when absent)."""
    quality = ledger.get("quality")
    evals = quality.get("evals") if isinstance(quality, dict) else None
    at = evals.get(str(step)) if isinstance(evals, dict) else None
    return at.get(metric) if isinstance(at, dict) else None


def evaluated_at(ledger: dict, step: int) -> bool:
    quality = ledger.get("quality")
    evals = quality.get("evals") if isinstance(quality, dict) else None
    return isinstance(evals, dict) and str(step) in evals


def start_ups(ledger: dict, where: str) -> list[float]:
    """The start-ups (process start to first step, seconds) the ledger's attempts measured (a value that is not a
    finite number counts as not measured, ``policy.history``); TrialRefused for one longer than a week."""
    from orchestrator.policy.history import claimed_restart_seconds, restart_seconds_measured

    claimed = claimed_restart_seconds(ledger.get("attempts") or [])
    if any(s > WEEK_S for s in claimed):
        raise TrialRefused(f"its ledger {where} says an attempt's start-up (extra.restart.total_s) took "
                           f"{max(claimed):g} s, more than a week: the ledger is corrupt")
    return restart_seconds_measured(ledger.get("attempts") or [])
