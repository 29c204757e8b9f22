"""``orchestrator <command>``: launch a job, and the tools around one (status, report, plan, simulate, checkpoints,
storage, eval).

``orchestrator launch [overrides]`` is ``python -m orchestrator.launch [overrides]``. Every command parses with argparse, prints
errors as ``error: ...`` and exits 2 on a user error, 4 on a bad job config (docs/cli.md).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from orchestrator.core.console import Parser

COMMANDS = {
    "launch": ("orchestrator.launch", "run a job (or a sweep with -m): compose, check, plan, hand it to the backend"),
    "status": (
        "orchestrator.cli.status",
        "print a job's ledger (attempts, exit classes, cost, checkpoints); --spend: spend by month, experiment, job",
    ),
    "report": ("orchestrator.cli.report", "list jobs from MLflow with cost and quality; chart cost against quality"),
    "plan": ("orchestrator.cli.plan", "estimate memory per GPU and cost for a job before running it"),
    "simulate": ("orchestrator.cli.simulate", "replay spot traces through the interval, deadline and requeue policies"),
    "checkpoints": ("orchestrator.cli.checkpoints", "list a job's committed checkpoints; --verify restores each"),
    "storage": (
        "orchestrator.cli.storage",
        "storage init: lifecycle rules for a bucket; storage repair-spend: rebuild the spend index",
    ),
    "eval": ("orchestrator.cli.evaluate", "benchmark scores of a job's committed checkpoints (lm-evaluation-harness)"),
    "ls": ("orchestrator.cli.ls", "list the jobs and sweeps under a store: status, attempts, step, cost"),
    "logs": ("orchestrator.cli.logs", "print a job's log (-f follows), or the backend's command for it"),
    "cancel": ("orchestrator.cli.cancel", "cancel a job through its backend so that it is not requeued"),
    "prices": (
        "orchestrator.cli.prices",
        "prices refresh: current spot and on-demand prices per zone, cached in storage for the plan and the meter",
    ),
}


def _parser() -> Parser:
    listing = "\n".join(f"  {name:<12} {doc}" for name, (_, doc) in COMMANDS.items())
    parser = Parser(
        prog="orchestrator",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The tools around a job.",
        usage="orchestrator [-h] <command> [args]",
        epilog=f"commands:\n{listing}\n\n`orchestrator <command> --help` for each one's arguments.\n"
        "`orchestrator launch` is `python -m orchestrator.launch` (the same flags, overrides and exit codes).",
    )
    parser.add_argument("command", choices=list(COMMANDS), metavar="<command>", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Only the first word is the top level's; the rest, --help included, belongs to the command.
    parser = _parser()
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        parser.error(f"unrecognized arguments: {argv[0]}; the command comes first")
    name = parser.parse_args(argv[:1]).command
    module = importlib.import_module(COMMANDS[name][0])
    if name == "launch":
        return int(module.main(argv[1:], prog="orchestrator launch") or 0)
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
