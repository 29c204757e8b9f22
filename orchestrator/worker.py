"""One training attempt: ``python -m orchestrator.worker [hydra overrides]``.

Every backend runs this same command (the local supervisor as a child process, forked from itself where
that is safe: ``orchestrator.process.warm_start``; Slurm from an sbatch script; SkyPilot and Kubernetes in the
container). It
composes the config, builds the attempt's parts (``orchestrator.attempt.build``)
and runs them (``orchestrator.attempt.runner``):
1. open the run's ledger, take a new fence (fencing), refuse if caps or budget are spent;
2. find the newest committed checkpoint, download it, verify its hashes, check its fingerprints;
3. build the recipe's TRL trainer with the orchestrator's callback;
4. train; the callback saves on time, steps, a preemption notice or an exhausted budget;
5. commit the final weights, close the ledger and the MLflow run, and exit with a
   code that says what happened (see ``orchestrator.core.exitcodes``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from orchestrator.tracking.run import quiet_telemetry

quiet_telemetry()  # before transformers/TRL/MLflow are imported (by the attempt's parts)

from orchestrator.attempt.failure import end_attempt_on_error  # noqa: E402
from orchestrator.process import distributed as dist  # noqa: E402
from orchestrator.process.training_stack import settle_deepspeed, skip_unused_deepspeed, skip_unused_quantisation_stack  # noqa: E402


def start_delay(environ=os.environ) -> None:
    """Test knob ``ORCH_TEST_WORKER_START_DELAY_SECONDS``: sleep that long before the attempt's parts are made
    (before its first reservation), so an e2e test's start-up is as long as a cloud machine's; unset: none."""
    seconds = float(environ.get("ORCH_TEST_WORKER_START_DELAY_SECONDS") or 0.0)
    if seconds > 0:
        time.sleep(seconds)


def job_log(cfg) -> Path:
    """Every record of this process also to the job's log file, ``<run.work_dir>/<run.name>/job.log`` (another
    rank's: ``job.rank<N>.log``), where the lines the console leaves out go (``core.logsetup``)."""
    import logging

    from orchestrator.core.logsetup import log_to_file
    from orchestrator.core.ranks import rank

    name = "job.log" if rank() == 0 else f"job.rank{rank()}.log"
    path = log_to_file(Path(cfg.run.work_dir).expanduser().resolve() / str(cfg.run.name) / name)
    logging.getLogger(__name__).info("the whole log (the evaluation harness's, every checkpoint's lines): %s", path)
    return path


def main(argv: list[str] | None = None) -> int:
    code = _run(argv)
    dist.report_exit(code)  # under torchrun, the launcher reads rank 0's code from here
    return code


def _run(argv: list[str] | None = None) -> int:
    from orchestrator.app.compose import compose_config
    from orchestrator.core.logsetup import setup_logging

    setup_logging()
    # paths as the backend wrote them: the launcher made local ones absolute where the worker shares its
    # filesystem; a relative one is the worker's own working directory's (a SkyPilot VM's synced workdir) and
    # stays relative, so the trajectory a resume checks does not depend on where a recovered VM puts it
    overrides = list(sys.argv[1:] if argv is None else argv)
    job = None
    try:
        cfg = compose_config(overrides, launch_checks=False)  # validated at launch; resolved here
        job_log(cfg)
        skip_unused_quantisation_stack(cfg)
        skip_unused_deepspeed(cfg)
        if dist.needs_launcher(cfg):
            from orchestrator.process.multinode import node_env

            node, work_root = node_env(cfg), Path(cfg.run.work_dir).expanduser().resolve() / cfg.run.name
            if node is not None:  # one node of a multi-node world: its ranks, watched on the attempt's store
                from orchestrator.process.multinode.node import run_node

                return run_node(cfg, overrides, work_root, node, main)
            from orchestrator.process.forked_ranks import launch_ranks

            return launch_ranks(cfg, overrides, work_root, main)
        settle_deepspeed(cfg)  # before this attempt starts a thread
        dist.init_process_group()
        start_delay()
        from orchestrator.attempt.build import build_attempt

        job = build_attempt(cfg)
        code = job.run()
        dist.report_exit(code)
        return code
    except Exception as err:  # noqa: BLE001 - classified: a user's error, out of memory, or a bug (traceback kept)
        return end_attempt_on_error(err, job)


if __name__ == "__main__":
    from orchestrator.core.exitcodes import exit_without_teardown

    exit_without_teardown(main())
