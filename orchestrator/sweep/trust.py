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
- what the sweep reads of a trial's ledger is decoded once (``trial_ledger``: ``records.sweep_record.TrialLedger``,
  the ledger's own decode and no start-up over a week): a ledger that does not decode refuses that trial only.

The record itself is decoded in the records floor (``orchestrator.records.sweep_record``); ``bounds`` hands it the
sweep's space and schedule as plain data, so a parameter outside the space or a rung past the schedule marks its
trial there.
"""

from __future__ import annotations

from typing import Any, Optional

from orchestrator.core.errors import UserError
from orchestrator.core.exitcodes import ExitClass
from orchestrator.core.signing import signature_problem as core_signature_problem
from orchestrator.core.signing import signed
from orchestrator.records.fields import CorruptRecord
from orchestrator.records.sweep_record import SweepBounds, SweepRecord, TrialEntry, TrialLedger
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
    return {
        k: ([spec[0], [_redacted(k, v) for v in spec[1]]] if spec and spec[0] == "choice" else spec)
        for k, spec in space_json.items()
    }


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


def launch_params(space, settings: dict, trial: TrialEntry, *, since: int) -> dict:
    """The parameters trial ``trial`` runs with: the sweep's own (see the module's docstring). Raises
    TrialRefused naming what in the stored parameters is not the sweep's."""
    stored = trial.params
    number = trial.number
    if set(stored) != set(space.specs):
        extra, missing = sorted(set(stored) - set(space.specs)), sorted(set(space.specs) - set(stored))
        raise TrialRefused(
            f"its stored parameters name keys outside the sweep's space ({', '.join(extra) or '-'}) "
            f"or lack some of it ({', '.join(missing) or '-'})"
        )
    derived = rederive(space, settings, number) if number >= since else None
    out = {}
    for key, value in sorted(stored.items()):
        if derived is not None:
            if _redacted(key, derived[key]) != value:
                raise TrialRefused(
                    f"its stored {key}={value!r} is not what the sweep's seeded sampler gives trial "
                    f"{number} ({_redacted(key, derived[key])!r})"
                )
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
    matches = (
        [c for c in _values(spec) if c != _redacted(key, c) and _redacted(key, c) == value]
        if spec[0] != "interval"
        else []
    )
    if len(matches) != 1:
        raise TrialRefused(f"its stored {key}={value!r} is outside the sweep's space ({_show(spec)})")
    return matches[0]


def _show(spec) -> str:
    from orchestrator.sweep.space import _show as show

    return show(spec)


# ---- bounds and ledgers ------------------------------------------------------------------------
def bounds(record: SweepRecord) -> SweepBounds:
    """The record's space (each key's values, as stored: a secret redacted) and each trial's number of rungs (its
    bracket's: ``decide.trial_steps``), as plain data for ``SweepRecord.within``; no rung bound while the record's
    settings do not name a schedule."""
    from orchestrator.core.choices import Pruner, choices
    from orchestrator.sweep.decide import trial_steps
    from orchestrator.sweep.space import SearchSpace, _values

    space = SearchSpace.from_specs(dict(record.space))
    domains = {
        key: ("interval", spec[1], spec[2], isinstance(spec[1], int) and isinstance(spec[2], int))
        if spec[0] == "interval"
        else ("choice", tuple(_values(spec)))
        for key, spec in space.specs.items()
    }
    settings = record.settings
    scheduled = (
        settings.get("pruner") in choices(Pruner)
        and isinstance(settings.get("max_steps"), int)
        and (
            settings.get("pruner") == "none"
            or (
                isinstance(settings.get("reduction_factor"), int)
                and isinstance(settings.get("min_fraction"), (int, float))
            )
        )
    )
    rungs = {t.number: len(trial_steps(dict(settings), t.number)) for t in record.trials} if scheduled else {}
    return SweepBounds(domains=domains, rungs=rungs)


def trial_ledger(store, run_name: str) -> TrialLedger:
    """The trial's ledger decoded (empty before its first attempt); TrialRefused when it does not parse or decode
    (``TrialLedger``: the ledger's own checks, and no start-up over a week)."""
    from orchestrator.records.ledger import Ledger

    ledger = Ledger(store, run_name)
    try:
        return TrialLedger.decode(ledger.load(), ledger.uri)
    except (ValueError, UnicodeDecodeError) as err:
        raise TrialRefused(f"its ledger {ledger.uri} is not JSON ({str(err)[:80]})") from None
    except CorruptRecord as err:
        raise TrialRefused(f"its ledger {err.where} is corrupt: {err.problem}") from None


def start_ups(ledger: TrialLedger) -> list[float]:
    """The start-ups (process start to first step, seconds) the ledger's attempts measured (a value that is not a
    finite number counts as not measured, ``policy.history``; one over a week refused the ledger at its decode)."""
    from orchestrator.policy.history import restart_seconds_measured

    return restart_seconds_measured(ledger.record.attempts)
