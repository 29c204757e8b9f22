"""Errors a user can cause. Each carries the exit code the process ends with.

They are printed as one clear paragraph, with no traceback; bugs keep theirs.
"""
from __future__ import annotations

from orchestrator import exitcodes


class UserError(Exception):
    """A problem the user can fix; ``str(err)`` names it and says how."""

    exit_code = exitcodes.CONFIG_ERROR


class ConfigError(UserError):
    """A bad key, type, choice or value in the composed config."""


class DataError(UserError):
    """A missing file or a dataset without the recipe's columns."""


class CapsReached(UserError):
    exit_code = exitcodes.CAPS_REACHED


class BudgetExhausted(UserError):
    exit_code = exitcodes.BUDGET_EXHAUSTED


class Fenced(UserError):
    """Another attempt of the same job took a newer epoch."""

    exit_code = exitcodes.FENCED


class JobAlreadyCompleted(CapsReached):
    """A launch of a job whose ledger says it completed: nothing to train."""
