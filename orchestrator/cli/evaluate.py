"""``orchestrator eval <storage.uri>/<run.name> [overrides]``: score a job's committed checkpoints and final weights.

The job's own config is the default: its model (name, revision, dtype, shape) and recipe come from its newest
sound checkpoint manifest (``orchestrator.evaluation.jobconfig``), and an override changes only what it names (a
model that is not the checkpoint's is refused, exit 4). The overrides are composed and checked like a launch
(exit 4 with the fix); the store is the composed ``storage`` group's (``storage.endpoint_url``, region, profile,
checksum options, ``storage.retry_for``; ``--endpoint-url`` is ``storage.endpoint_url``). The evaluation itself is
``orchestrator.evaluation.job``; with a ``backend`` other than local it runs as a job of its own on that backend
(``orchestrator.app.eval_remote``). A preemption signal or a storage outage longer than ``storage.retry_for``
exits 75 (requeued), its bill settled as far as storage lets it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional, cast

from orchestrator.app.compose import compose_config
from orchestrator.core.console import USAGE_ERROR, Parser, fail
from orchestrator.core.errors import BudgetExhausted, ConfigError, DataError, UserError
from orchestrator.core.exitcodes import PREEMPTED, outcome
from orchestrator.evaluation.job import EvalPreempted, billed_evaluation
from orchestrator.storage import split_run_uri, store_from_config
from orchestrator.storage.base import TransientStorageError


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="orchestrator eval", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("run_uri", help="<storage.uri>/<run.name>, e.g. s3://bucket/runs/job1 or .cache/runs/job1")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the job's config (eval.tasks=[...], ...)")
    parser.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint (as storage.endpoint_url)")
    return parser.parse_intermixed_args(argv)  # options before, between or after the overrides


def job_config(overrides: list[str], storage_uri: str, run_name: str):
    """(the config, the store): the overrides composed over the job's own stored config (``jobconfig``)."""
    from orchestrator.evaluation import jobconfig

    fixed = [f"storage.uri={storage_uri}", f"run.name={run_name}"]
    cfg = compose_config([*overrides, *fixed])
    if cfg.backend.name != "local":  # the eval job's machine reads the job's config itself
        return cfg, None
    store = store_from_config(cfg.storage)
    job = jobconfig.stored(store, run_name)
    if job is not None:
        cfg = compose_config([*job.overrides(overrides, cfg), *overrides, *fixed])
    jobconfig.check_model(cfg, job)
    return cfg, store


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_name = args.run_uri
    overrides = [*args.overrides, *([f"storage.endpoint_url={args.endpoint_url}"] if args.endpoint_url else [])]
    try:
        storage_uri, run_name = split_run_uri(args.run_uri)
        cfg, store = job_config(overrides, storage_uri, run_name)
        if not cfg.eval.tasks:
            raise ConfigError("eval.tasks is empty; give the tasks, e.g. 'eval.tasks=[tiny_arith_mc]'.")
        if store is None:  # an eval job of its own on that backend's machine (app/eval_remote.py)
            from orchestrator.app.eval_remote import submit_eval

            return submit_eval(cfg, overrides)
        counts, spent = billed_evaluation(cfg, store, run_name)
    except EvalPreempted as err:  # requeued by the backend (75); the rerun skips every stored result
        print(f"{run_name}: {err}; the evaluation in flight is lost, a rerun skips the stored results", flush=True)
        return PREEMPTED
    except TransientStorageError as err:  # an outage past storage.retry_for: as a preemption, requeued
        print(
            f"{run_name}: storage unreachable past storage.retry_for ({err}); stopped with exit {PREEMPTED} for "
            "the backend to requeue, a rerun skips the stored results",
            flush=True,
        )
        return PREEMPTED
    except BudgetExhausted as err:  # a cap of budget.* spent: the budget's code, as a job's
        return fail(err, cast(int, outcome(err.exit_class).exit_code))
    except (ConfigError, DataError) as err:  # the job's config: the code a launch gives (docs/cli.md)
        return fail(err, err.exit_code)
    except (ValueError, UserError) as err:  # the URI, the store
        return fail(err, USAGE_ERROR)
    left = (
        f", {counts['left']} left: run.deadline={cfg.run.deadline} reached (a rerun with a later one goes on)"
        if counts["left"]
        else ""
    )
    print(
        f"{run_name}: {counts['evaluated']} evaluated, {counts['skipped']} already done, "
        f"{counts['unusable']} unusable{left}; ${spent:.6f} at {cfg.compute.gpu_type} prices, billed to the job's "
        "ledger and the spend index",
        flush=True,
    )
    return 0
