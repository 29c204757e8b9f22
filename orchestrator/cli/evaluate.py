"""``orchestrator eval <storage.uri>/<run.name> [overrides]``: score a job's committed checkpoints and final weights.

The overrides are the training job's (at least the model and the ``eval.*`` keys); they are composed and
checked like a launch (exit 4 with the fix). The evaluation itself is ``orchestrator.evaluation.job``; with a
``backend`` other than local it runs as a job of its own on that backend (``orchestrator.app.eval_remote``).
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional

from orchestrator.core.console import USAGE_ERROR, Parser, fail
from orchestrator.app.compose import compose_config
from orchestrator.core.errors import BudgetExhausted, ConfigError, DataError, UserError
from orchestrator.core.exitcodes import PREEMPTED, outcome
from orchestrator.evaluation.job import EvalPreempted, billed_evaluation
from orchestrator.storage import open_store, split_run_uri


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="orchestrator eval", description=__doc__.splitlines()[0].split(': ', 1)[1])
    parser.add_argument("run_uri", help="<storage.uri>/<run.name>, e.g. s3://bucket/runs/job1 or .cache/runs/job1")
    parser.add_argument("overrides", nargs="*", help="the job's Hydra overrides (model=..., eval.tasks=[...], ...)")
    parser.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint (as storage.endpoint_url)")
    return parser.parse_intermixed_args(argv)  # --endpoint-url before, after or among the overrides


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        storage_uri, run_name = split_run_uri(args.run_uri)
        extra = [f"storage.endpoint_url={args.endpoint_url}"] if args.endpoint_url else []
        cfg = compose_config([*args.overrides, f"storage.uri={storage_uri}", f"run.name={run_name}", *extra])
        if not cfg.eval.tasks:
            raise ConfigError("eval.tasks is empty; give the tasks, e.g. 'eval.tasks=[tiny_arith_mc]'.")
        if cfg.backend.name != "local":  # an eval job of its own on that backend's machine (evaluation/remote.py)
            from orchestrator.app.eval_remote import submit_eval

            return submit_eval(cfg, args.overrides, args.endpoint_url)
        counts, spent = billed_evaluation(cfg, open_store(storage_uri, endpoint_url=args.endpoint_url), run_name)
    except EvalPreempted as err:  # requeued by the backend (75); the rerun skips every stored result
        print(f"{run_name}: {err}; the evaluation in flight is lost, a rerun skips the stored results", flush=True)
        return PREEMPTED
    except BudgetExhausted as err:  # a cap of budget.* spent: the budget's code, as a job's
        return fail(err, outcome(err.exit_class).exit_code)
    except (ConfigError, DataError) as err:  # the job's config: the code a launch gives (docs/cli.md)
        return fail(err, err.exit_code)
    except (ValueError, UserError) as err:  # the URI, the store
        return fail(err, USAGE_ERROR)
    left = (f", {counts['left']} left: run.deadline={cfg.run.deadline} reached (a rerun with a later one goes on)"
            if counts["left"] else "")
    print(f"{run_name}: {counts['evaluated']} evaluated, {counts['skipped']} already done, "
          f"{counts['unusable']} unusable{left}; ${spent:.6f} at {cfg.compute.gpu_type} prices, billed to the job's "
          "ledger and the spend index", flush=True)
    return 0
