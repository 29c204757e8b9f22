"""What every ``orchestrator <command>`` shares: one parser, one error prefix, one exit code per kind of error,
one size unit. The rules are in docs/cli.md.

- Errors go to stderr as one paragraph starting ``error: ``, argparse's own included, with no traceback.
- Exit codes: 0 done; 1 the command ran and its answer is a failure (``checkpoints --verify`` found a bad
  checkpoint); 2 a user error in the command line or in what it names (an unknown flag, a URI with nothing
  there, an unreachable store or server); 4 a bad job config (the Hydra overrides ``plan`` composes: the code a
  launch gives for the same config).
- Sizes are decimal: kB = 1e3, MB = 1e6, GB = 1e9 bytes.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from orchestrator.core.exitcodes import FAILED as FAILED  # the commands' codes, re-exported
from orchestrator.core.exitcodes import USAGE_ERROR as USAGE_ERROR

GB = 1e9


class Parser(argparse.ArgumentParser):
    """argparse with the shared ``error:`` prefix (argparse writes ``<prog>: error:``) and exit code."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"error: {message} (see {self.prog} --help)\n")


def fail(message: object, code: int = USAGE_ERROR) -> int:
    """Print ``error: message`` on stderr; return ``code`` for the command to exit with."""
    print(f"error: {message}", file=sys.stderr)
    return code


def format_bytes(n: float | None) -> str:
    """``n`` bytes in the shared decimal unit: ``512 B``, ``118.0 kB``, ``3.4 MB``, ``15.2 GB``."""
    if n is None:
        return "-"
    for scale, unit in ((GB, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
