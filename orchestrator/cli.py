"""``orchestrator <command>``: the tools around a job (status, report, plan, simulate, checkpoints, storage init, eval).

Launching a job is ``python -m orchestrator.launch [overrides]``.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "status": ("orchestrator.status", "print a job's ledger (attempts, exit classes, cost, checkpoints); --spend URI: spend by month, experiment, job"),
    "report": ("orchestrator.report", "list jobs from MLflow with cost and quality; chart cost against quality"),
    "plan": ("orchestrator.plan", "estimate memory per GPU and cost for a job before running it"),
    "simulate": ("orchestrator.simulate", "replay spot traces through the interval, deadline and requeue policies"),
    "checkpoints": ("orchestrator.checkpoint.inspect", "list a job's committed checkpoints; --verify restores each"),
    "storage": ("orchestrator.storage.lifecycle", "storage init <s3-uri>: lifecycle rules for a bucket"),
    "eval": ("orchestrator.evaluation.job", "eval <storage-uri>/<run> [overrides]: benchmark scores of a job's checkpoints"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print("usage: orchestrator <command> [args]\n\ncommands:")
        for name, (_, doc) in COMMANDS.items():
            print(f"  {name:<12} {doc}")
        print("\nlaunch a job: python -m orchestrator.launch [hydra overrides]")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"orchestrator: unknown command {name!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
