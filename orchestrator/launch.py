"""Entry point: ``python -m orchestrator.launch [hydra overrides]``.

1. compose ``conf/config.yaml`` with the overrides against the typed schemas;
2. validate everything up front, so a bad key fails before any GPU minute is paid;
3. print the pre-flight plan (memory per GPU, fit, cost);
4. hand the job to the chosen backend (local: the supervisor; slurm, skypilot,
   kubernetes: submit a script that runs ``python -m orchestrator.worker``).
"""
from __future__ import annotations

import logging
import sys

from omegaconf import DictConfig

from orchestrator.compose import absolutize, compose_config, with_default_storage
from orchestrator.hub_pins import pin_revisions
from orchestrator.errors import UserError
from orchestrator.logsetup import setup_logging

log = logging.getLogger("orchestrator.launch")  # __name__ is "__main__" under python -m


def print_plan(cfg: DictConfig) -> None:
    """The pre-flight estimate; a planner failure never stops a launch."""
    try:
        from orchestrator import plan

        print(plan.plan_text(cfg), flush=True)
    except Exception as err:  # noqa: BLE001 - the plan is advice, not a gate
        log.warning("pre-flight plan unavailable: %s", err)


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    overrides = absolutize(list(sys.argv[1:] if argv is None else argv))
    try:
        cfg = compose_config(overrides, launch_checks=False)  # only to read the defaults to pin
        overrides = with_default_storage(cfg, overrides)
        cfg = compose_config(overrides)
        pinned = pin_revisions(cfg, overrides)  # hub branches and tags -> the commits they name now
        if pinned != overrides:
            overrides, cfg = pinned, compose_config(pinned)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print_plan(cfg)
    from orchestrator.backends import run_backend

    try:
        return run_backend(cfg, overrides)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
