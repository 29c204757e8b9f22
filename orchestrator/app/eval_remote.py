"""``orchestrator eval <uri>/<run> backend=slurm|skypilot|kubernetes``: the eval job through the training backends.

The job is rendered and submitted by the backend's own code (``orchestrator.backends``), inside
``job_entry``: the sbatch script, SkyPilot task or Kubernetes Job runs ``python -m orchestrator eval
<storage.uri>/<run.name> <overrides without backend.*>`` instead of the worker, with the same secrets handling
(names only, ``refuse_secrets_in_text``), the same requeue on preemption (the eval command exits 75 on SIGTERM,
SIGUSR1 or SIGINT, and is idempotent: a rerun skips every stored result) and none on a user error (its exit 2,
3 or 4 ends the job, as the worker's final codes do), and the machine of ``compute=``, whose
price the eval command bills on that machine. Its engine job is ``<run.name>-eval``, so it never collides with the
training job's (a Kubernetes Job of the same name, a SkyPilot managed job of the same name).
"""

from __future__ import annotations

from typing import Any, Sequence

EVAL_JOB_SUFFIX = "-eval"
EVAL_MODULE_ARGV = ("-m", "orchestrator", "eval")


def eval_argv(run_uri: str) -> list[str]:
    """The module argv of the remote eval command, before its overrides (``storage.*`` among them: the remote
    command opens the store from its composed ``storage`` group, as the local one does)."""
    return [*EVAL_MODULE_ARGV, run_uri]


def eval_job_config(cfg: Any) -> Any:
    """``cfg`` with the engine job's name, ``<run.name>-eval`` (the launch checks already refused a multi-process
    eval: ``eval.tasks`` needs ``distributed=none``, and one node)."""
    from omegaconf import OmegaConf

    job = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    OmegaConf.update(job, "run.name", f"{cfg.run.name}{EVAL_JOB_SUFFIX}")
    return job


def submit_eval(cfg: Any, overrides: Sequence[str]) -> int:
    """Render (``backend.dry_run``: print) or submit the eval job of ``cfg`` (the composed training config with
    ``storage.uri`` and ``run.name`` of the job to evaluate) through ``cfg.backend.name``; the launcher's code.

    Raises:
        ConfigError: a bad backend setting, a secret that would be written.
    """
    from orchestrator.backends import job_entry, run_backend
    from orchestrator.core.exitcodes import USAGE_ERROR

    run_uri = f"{str(cfg.storage.uri).rstrip('/')}/{cfg.run.name}"
    job = eval_job_config(cfg)
    # its user errors are final as a job's config errors are: 2 (the URI, the store) beside 3, 4 (and 5, 6)
    with job_entry(eval_argv(run_uri), final_codes=(USAGE_ERROR,)):
        return run_backend(job, list(overrides))
