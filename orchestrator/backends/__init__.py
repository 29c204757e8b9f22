"""Backends: where the job's attempts run.

Each backend is a module with the same two functions:

- ``render(cfg, overrides) -> str``: the exact text that would be submitted
  (an sbatch script, a SkyPilot task YAML, a Kubernetes Job manifest, or a
  JobSet for several nodes: ``multinode.py``). Pure: no files, no processes.
  ``backend.dry_run=true`` prints it.
- ``submit(cfg, overrides) -> str``: submit it and return the engine's job id.

``cfg`` is the composed job config and ``overrides`` the user's Hydra
overrides. Every remote job runs ``python -m orchestrator.worker
<overrides without backend.*>``: the worker composes the same config from the
same overrides, runs one attempt and exits with an ``exitcodes`` code, which
the engine keys on to requeue (75) or stop (3, 4, 5, 6).

The local backend (``local.py``) instead runs the supervisor in this process
and defines ``run(cfg, overrides) -> int`` (an exit code) besides ``render``.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import shlex
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Iterator, Optional, Sequence, cast

from orchestrator.core.choices import Backend as BackendChoice
from orchestrator.core.choices import choices
from orchestrator.core.durations import parse_duration
from orchestrator.core.errors import ConfigError
from orchestrator.process.distributed import worker_argv

BACKEND_NAMES = choices(BackendChoice)
WORKER_PYTHON = "python"  # inside an image or a provisioned VM, the environment's own python


@dataclass(frozen=True)
class Backend:
    """One backend's entry points; see the module docstring for their contract."""

    name: str
    module: ModuleType
    render: Callable[[Any, Sequence[str]], str]
    submit: Optional[Callable[[Any, Sequence[str]], str]]
    run: Optional[Callable[[Any, Sequence[str]], int]]


def get_backend(name: str) -> Backend:
    """The backend called ``name``.

    Raises:
        ValueError: ``name`` is not one of BACKEND_NAMES (the message lists them).
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend {name!r} is unknown; choose one of: {', '.join(BACKEND_NAMES)}.")
    module = importlib.import_module(f"{__name__}.{name}")
    return Backend(
        name=name,
        module=module,
        render=module.render,
        submit=getattr(module, "submit", None),
        run=getattr(module, "run", None),
    )


def run_backend(cfg: Any, overrides: Sequence[str]) -> int:
    """Hand the job to ``cfg.backend.name``; returns the launcher's exit code.

    With ``backend.dry_run`` the text that would be submitted is printed and
    nothing runs. A blocking backend (local) returns its attempts' outcome; a
    remote one prints the job id and returns 0 once the engine accepted it.

    Raises:
        ConfigError: an unknown backend name.
    """
    try:
        backend = get_backend(cfg.backend.name)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.backend.dry_run:
        print(backend.render(cfg, list(overrides)), flush=True)
        return 0
    if backend.run is not None:
        if int(cfg.train.trial_steps) <= 0:  # a trial (plan against measurement) writes nothing to storage
            record_submission(cfg, backend.name, None)  # the supervisor is this process
        return int(backend.run(cfg, list(overrides)))
    submit = cast(Callable[[Any, Sequence[str]], str], backend.submit)  # a backend without run has submit
    job_id = submit(cfg, list(overrides))
    print(f"submitted {cfg.run.name!r} to {backend.name}: job {job_id}", flush=True)
    record_submission(cfg, backend.name, job_id)
    return 0


def record_submission(cfg: Any, backend: str, job_id: Optional[str]) -> None:
    """Store the job's handle under its run's folder (``orchestrator.records.submission``) for ``orchestrator logs``
    and ``orchestrator cancel``; a store that refuses it is only warned about (the job runs without it)."""
    import logging

    from orchestrator.backends.handles import submission_record
    from orchestrator.records.submission import write_submission
    from orchestrator.storage import store_from_config

    try:
        write_submission(store_from_config(cfg.storage, retry=False), submission_record(cfg, backend, job_id))
    except Exception as err:  # noqa: BLE001 - the job is handed over already; logs and cancel then say so
        logging.getLogger(__name__).warning(
            "could not record the job's submission under %s (%s: %s); "
            "`orchestrator logs` and `cancel` will not find it",
            cfg.storage.uri,
            type(err).__name__,
            str(err)[:200],
        )


# -- helpers shared by the remote backends ------------------------------------


def _override_key(override: str) -> str:
    key = override.split("=", 1)[0]
    return key.lstrip("+~")


def worker_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides a remote worker needs: the user's, less ``backend`` and ``backend.*``.

    The worker always runs locally inside the job, so the launcher's choice of
    backend must not travel with it.
    """
    return [o for o in overrides if not (_override_key(o) == "backend" or _override_key(o).startswith("backend."))]


# the module argv a remote job runs instead of the worker's (``orchestrator eval``: see ``job_entry``)
_ENTRY: ContextVar[Optional[tuple[str, ...]]] = ContextVar("orchestrator_job_entry", default=None)
# the exit codes that command ends a user error with, beyond the worker's final ones: never requeued
_ENTRY_FINAL: ContextVar[tuple[int, ...]] = ContextVar("orchestrator_job_entry_final", default=())


@contextmanager
def job_entry(module_argv: Sequence[str], final_codes: Sequence[int] = ()) -> Iterator[None]:
    """Within it, every backend renders and submits a job that runs ``python <module_argv> <overrides>`` instead
    of ``python -m orchestrator.worker <overrides>``, with the same secrets handling, requeue and resources
    (``orchestrator.app.eval_remote``: ``-m orchestrator eval <uri>/<run>``); ``final_codes``: the codes it
    exits with beyond the worker's that are final too (the eval command's 2, a bad URI), so the Slurm script ends
    the job on them and a Kubernetes Job fails at once, as on the worker's final codes."""
    token, final = _ENTRY.set(tuple(module_argv)), _ENTRY_FINAL.set(tuple(int(c) for c in final_codes))
    try:
        yield
    finally:
        _ENTRY_FINAL.reset(final)
        _ENTRY.reset(token)


def entry_final_codes() -> tuple[int, ...]:
    """The final exit codes of the ``job_entry`` in force beyond the worker's (none for the worker)."""
    return _ENTRY_FINAL.get()


def job_argv(overrides: Sequence[str], python: str = WORKER_PYTHON) -> list[str]:
    """``python -m orchestrator.worker <overrides>``, or the ``job_entry`` in force with the same overrides."""
    entry = _ENTRY.get()
    return worker_argv(list(overrides), python=python) if entry is None else [python, *entry, *overrides]


def submitted_by(backend: str, run_name: str) -> str:
    """The command that submits this job, for a comment in the generated text."""
    entry = _ENTRY.get()
    if entry is None:
        return f"python -m orchestrator.launch backend={backend} run.name={shlex.quote(run_name)}"
    return shlex.join([WORKER_PYTHON, *entry, f"backend={backend}"])


def worker_command(overrides: Sequence[str], python: str = WORKER_PYTHON) -> str:
    """The shell-quoted command that runs one attempt: ``python -m orchestrator.worker ...`` (see ``job_argv``).

    ``overrides`` go through :func:`worker_overrides`; pass ``WorkerInvocation.overrides``
    so that no secret is written into the command.
    """
    return shlex.join(job_argv(worker_overrides(overrides), python=python))


# -- secrets and the attempt's environment -----------------------------------------

SECRET_ENV_PREFIX = "ORCH_SECRET_"
_ENV_REFERENCE_NAME = re.compile(r"\$\{oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class WorkerInvocation:
    """What a remote attempt runs, with its secrets passed by the name of an environment variable.

    overrides: the worker's overrides (no ``backend.*``); an override whose value
        is a secret (whatever ``redaction.redact`` would replace: a webhook URL, a
        ``?token=`` URL, a value under a key named like a token...) reads
        ``${oc.env:ORCH_SECRET_<KEY>}`` instead of the value.
    secret_values: ORCH_SECRET_<KEY> -> the value taken out of the overrides; the
        backend hands them to the engine through the submitting process's
        environment (never through the generated text).
    secret_names: every environment variable the worker reads a secret from: the
        moved ones, ``budget.webhook_url_env``, ``${oc.env:NAME}`` given by the
        user for a secret key, and ``HF_TOKEN`` (``hub_token_names``).
    env: plain (non-secret) variables for the attempt: ``ORCH_CONTAINER_IMAGE``
        (recorded in the ledger's reproducibility record).
    """

    overrides: list[str]
    secret_values: dict[str, str]
    secret_names: list[str]
    env: dict[str, str]
    secret_keys: list[str] = field(default_factory=list)  # the config keys whose values were moved out


def _secret_env_name(key: str) -> str:
    return SECRET_ENV_PREFIX + re.sub(r"[^A-Za-z0-9]+", "_", key).strip("_").upper()


def worker_invocation(cfg: Any, overrides: Sequence[str]) -> WorkerInvocation:
    """Split the worker's overrides into text that is safe to write and secrets passed by environment.

    Raises:
        ConfigError: a malformed override, or an input the worker's machine cannot reach.
    """
    from omegaconf import OmegaConf

    from orchestrator.backends.paths import placed_overrides
    from orchestrator.core.redaction import is_env_reference, is_secret_key, is_webhook_key, secrets_in

    safe: list[str] = []
    values: dict[str, str] = {}
    names: list[str] = []
    moved_keys: list[str] = []
    for item in worker_overrides(placed_overrides(cfg, overrides)):  # paths as the worker's machine sees them
        raw_key, sep, text = item.partition("=")
        key = raw_key.lstrip("+~")
        leaf = key.rsplit(".", 1)[-1]
        secret_key = is_secret_key(leaf) or is_webhook_key(leaf)
        if not sep or raw_key.startswith("~"):
            safe.append(item)
        elif is_env_reference(text) or not secrets_in({leaf: text}):
            if secret_key:
                names += _ENV_REFERENCE_NAME.findall(text)
            safe.append(item)
        else:
            name = _secret_env_name(key)
            value = OmegaConf.select(cfg, key)
            if isinstance(value, str):
                values[name] = value
                safe.append(f"{raw_key}='${{oc.env:{name}}}'")
            else:  # a list or dict holding a secret travels as JSON, decoded by the worker's OmegaConf
                plain = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
                values[name] = json.dumps(plain)
                safe.append(f"{raw_key}='${{oc.decode:${{oc.env:{name}}}}}'")
            names.append(name)
            moved_keys.append(key)
    if cfg.budget.webhook_url_env:
        names.append(str(cfg.budget.webhook_url_env))
    names += hub_token_names(cfg)
    env = {}
    if cfg.backend.image:
        from orchestrator.records.repro import CONTAINER_IMAGE_ENV

        env[CONTAINER_IMAGE_ENV] = str(cfg.backend.image)
    return WorkerInvocation(
        overrides=safe, secret_values=values, secret_names=list(dict.fromkeys(names)), env=env, secret_keys=moved_keys
    )


HUB_TOKEN_ENV = "HF_TOKEN"


def hub_token_names(cfg: Any) -> list[str]:
    """``["HF_TOKEN"]`` when the job downloads from the hub (``orchestrator.config.hub.hub_inputs``) and the launcher has the
    variable set: a secret passed by name like the others (Slurm: ``--export`` of the name, SkyPilot:
    ``secrets:``/``--secret``, Kubernetes: a ``secretKeyRef``), never its value in a generated file."""
    import os

    from orchestrator.config.hub import hub_inputs

    return [HUB_TOKEN_ENV] if os.environ.get(HUB_TOKEN_ENV) and hub_inputs(cfg) else []


def refuse_secrets_in_text(cfg: Any, text: str, what: str) -> str:
    """``text``, after checking that no secret value of ``cfg`` is in it (a last guard for every backend).

    Raises:
        ConfigError: naming the key whose secret would be written, and the fix.
    """
    from omegaconf import OmegaConf

    from orchestrator.core.redaction import secrets_in
    from orchestrator.tracking.run import flatten

    plain: Any = OmegaConf.to_container(cfg, resolve=True)
    for key, value in flatten(plain).items():
        if any(secret in text for secret in secrets_in({key.rsplit(".", 1)[-1]: value})):
            raise ConfigError(
                f"{key} holds a secret that would be written into {what}. Pass it through an environment "
                f"variable instead: {key}='${{oc.env:NAME}}' (for the budget webhook: budget.webhook_url_env=NAME)."
            )
    return text


def render_yaml(cfg: Any, command: str, document: Callable[[str], dict], what: str) -> str:
    """``document(capacity)`` as YAML (by the serialiser: every value quoted as YAML needs) under a comment saying
    how to submit it and which capacity it asks for (``run.deadline``'s newest decision, or the config's).

    Raises:
        ConfigError: a secret of the config would appear in the text (see :func:`refuse_secrets_in_text`).
    """
    import yaml

    from orchestrator.attempt.capacity_contract import capacity_comment, planned_capacity

    capacity, decision = planned_capacity(cfg)
    text = (
        f"# {command} <this file>\n"
        + capacity_comment(capacity, decision)
        + yaml.safe_dump(document(capacity), sort_keys=False)
    )
    return refuse_secrets_in_text(cfg, text, what)


def run_tool(argv: list[str], *, timeout_seconds: float, missing: str, env: Optional[dict] = None):
    """Run a backend's command-line tool (sbatch, sky, kubectl) and return its CompletedProcess.

    Raises:
        ConfigError: ``missing`` (what to install, where to run) when the tool is not on PATH.
    """
    import subprocess

    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_seconds)
    except FileNotFoundError:
        raise ConfigError(missing) from None


def grace_seconds(cfg: Any) -> int:
    """``preemption.grace`` in whole seconds (rounded up), as engines take it."""
    try:
        return int(math.ceil(parse_duration(cfg.preemption.grace, key="preemption.grace")))
    except ValueError as err:
        raise ConfigError(str(err)) from None
