"""Entry point: ``python -m orchestrator.launch [flags] [hydra overrides]``, also ``orchestrator launch``.

Flags as a Hydra user knows them (``--help``, ``--cfg job``, ``--info``, ``-m``: ``orchestrator.app.launch_flags``).

1. compose ``conf/config.yaml`` with the overrides against the typed schemas, once; add the default
   folders and the pinned hub revisions to the config and to the overrides alike;
2. validate everything up front, once, so a bad key fails before any GPU minute is paid;
3. print the pre-flight plan (memory per GPU, fit, cost);
4. hand the job to the chosen backend (local: the supervisor; slurm, skypilot,
   kubernetes: submit a script that runs ``python -m orchestrator.worker``).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import cast

from omegaconf import DictConfig

from orchestrator.app.checks import validate
from orchestrator.app.compose import compose_config
from orchestrator.app.hub_pins import pin_revisions, resolve_commit
from orchestrator.config.compose import absolutize, with_default_storage
from orchestrator.core.errors import ConfigError, UserError
from orchestrator.core.logsetup import setup_logging

log = logging.getLogger("orchestrator.launch")  # __name__ is "__main__" under python -m


def print_plan(cfg: DictConfig) -> None:
    """The pre-flight estimate; a planner failure never stops a launch."""
    try:
        from orchestrator.planning import plan

        print(plan.short_plan_text(cfg), flush=True)
    except Exception as err:  # noqa: BLE001 - the plan is advice, not a gate
        log.warning("pre-flight plan unavailable: %s", err)


def check_deadline_ahead(cfg: DictConfig, now: float | None = None) -> None:
    """A ``run.deadline`` time already past refuses a fresh launch (exit 4): no capacity can meet it.

    A relaunch of a job that has run (its ledger has attempts) whose deadline passed meanwhile is not
    refused: it is told so and runs on-demand, as the capacity watch decides (``attempt/capacity.py``).
    """
    from orchestrator.core.durations import parse_deadline

    if cfg.run.deadline is None:
        return
    kind, at = parse_deadline(cfg.run.deadline)
    late = (time.time() if now is None else now) - at
    if kind != "at" or late < 0:
        return
    from orchestrator.records.ledger import Ledger
    from orchestrator.records.ledger_record import LedgerRecord
    from orchestrator.storage import store_from_config

    ledger = Ledger(store_from_config(cfg.storage), str(cfg.run.name))
    if LedgerRecord.decode(ledger.load(), ledger.uri).attempts:  # corrupt: CorruptRecord, exit 4 with the fix
        log.warning(
            "run.deadline=%s passed %.2f h ago, while job %r ran: it runs on-demand to the end",
            cfg.run.deadline,
            late / 3600,
            str(cfg.run.name),
        )
        return
    raise ConfigError(
        f"run.deadline={cfg.run.deadline} passed {late / 3600:.2f} h ago, before job {cfg.run.name!r} "
        "started: no capacity can meet it. Give a later time (ISO-8601, UTC if no zone), a duration "
        "from the job's first attempt (run.deadline=52h), or drop run.deadline."
    )


def compose_for_launch(overrides: list[str], resolve=resolve_commit) -> tuple[DictConfig, list[str]]:
    """Compose once, add the default ``storage.uri``/``run.work_dir`` and the pinned hub revisions to the
    config and to the overrides alike (the backend's worker composes the overrides again), validate once."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = compose_config(overrides, launch_checks=False)
    final = pin_revisions(cfg, with_default_storage(cfg, overrides), resolve=resolve)
    added = [item for item in final if item not in overrides]  # plain key=value of existing string keys
    try:  # a new config: the composed one is not changed in place; values as given (a commit stays a string)
        cfg = cast(DictConfig, OmegaConf.merge(cfg, dotlist_tree(added)))
    except OmegaConfBaseException as err:
        raise ConfigError(f"{' '.join(added)}: {err}") from None
    validate(cfg)
    return cfg, final


def dotlist_tree(items: list[str]) -> dict:
    """``["a.b=v", ...]`` as ``{"a": {"b": "v"}}``, every value the string given (no YAML parsing of it)."""
    tree: dict = {}
    for item in items:
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def main(argv: list[str] | None = None, prog: str = "python -m orchestrator.launch") -> int:
    """``python -m orchestrator.launch`` and ``orchestrator launch``: the flags (``orchestrator.app.launch_flags``),
    then one job, or a sweep with ``-m``/``sweep=...``."""
    from orchestrator.app import launch_flags

    setup_logging()
    args = launch_flags.parse(list(sys.argv[1:] if argv is None else argv), prog)
    if args.help or args.info:
        from orchestrator.config.compose import conf_dir

        print(launch_flags.usage(conf_dir(), prog) if args.help else launch_flags.info(conf_dir(), args.overrides))
        return 0
    if args.cfg:
        return print_job_config(args.overrides, resolve=args.resolve, package=args.package)
    argv = (["-m"] if args.multirun else []) + args.overrides
    from orchestrator.sweep.plan import wants_sweep

    if wants_sweep(argv):  # -m, sweep=..., sweep.*: many jobs (docs/sweeps.md)
        from orchestrator.sweep.cli import run_sweep

        return run_sweep(argv, compose_for_launch)
    overrides = absolutize(argv)
    try:
        cfg, overrides = compose_for_launch(overrides)
        check_deadline_ahead(cfg)
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


def print_job_config(argv: list[str], *, resolve: bool = False, package: str | None = None) -> int:
    """``--cfg job``: the composed config as YAML, as Hydra prints it; nothing is checked beyond composing, nothing
    runs. A sweep's overrides compose as its first point."""
    from omegaconf import OmegaConf

    from orchestrator.config.compose import split_sweep_overrides

    try:
        fixed, space = split_sweep_overrides(absolutize(argv))
        if space:
            from orchestrator.sweep.space import SearchSpace

            fixed += SearchSpace.from_specs(space).representative()
        cfg = compose_config(fixed, launch_checks=False)
        node = OmegaConf.select(cfg, package) if package else cfg
        if package and node is None:
            raise ConfigError(f"--package {package}: the config has no key {package!r}; give a group (train) or a key.")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print(OmegaConf.to_yaml(node, resolve=resolve) if OmegaConf.is_config(node) else f"{node}\n", end="", flush=True)
    return 0


if __name__ == "__main__":
    from orchestrator.core.exitcodes import exit_without_teardown

    exit_without_teardown(
        main()
    )  # the supervisor may have imported the training stack (orchestrator.process.warm_start)
