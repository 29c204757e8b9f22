"""SkyPilot: a managed-job task that SkyPilot recovers across spot preemptions.

SkyPilot relaunches the task when the spot VM is reclaimed (no charge against
the error cap), when the worker exits 75 (``recover_on_exit_codes``), and on
other errors up to ``requeue.max_failures`` times; the worker's own ledger
check (exit 5) has the last word. ``EAGER_NEXT_REGION`` moves to another
region right after a preemption, where spot capacity is more likely.

Settings read from the config: ``run.name``, ``compute.gpu_type``,
``compute.gpus_per_node``, ``compute.spot`` (with ``run.deadline``: on-demand when the
job's ledger says so, see ``orchestrator.attempt.capacity_contract``), ``compute.cloud``,
``backend.image`` (a Docker image with the project installed; without one the
project is synced as ``workdir`` and installed by ``setup`` with the locked versions:
``pip install -c constraints.txt "torch==<TORCH_VERSION>" -e .``, so every VM a recovery lands on runs the
same packages; ``submit`` refuses a workdir without constraints.txt),
``requeue.max_failures``, and from
``backend.extra``: ``region``, ``disk_size`` (GB), ``setup`` (a command
replacing the default one).

Secrets never enter the YAML: an override holding one reads
``${oc.env:ORCH_SECRET_<KEY>}``; every variable a secret is read from
(those, ``budget.webhook_url_env``, ``HF_TOKEN`` for a job that reads from the hub
when the launcher has it) is listed under ``secrets:`` with no value
and ``submit`` passes ``--secret NAME``, which SkyPilot fills from the
launcher's environment. The image (``ORCH_CONTAINER_IMAGE``) or, without one,
the launch directory's git commit (``ORCH_GIT_COMMIT``) travels in ``envs``
for the reproducibility record. No cloud credentials: the VM's own role or
service account reaches the bucket.

With ``compute.zones``: ``resources.ordered``, one entry per zone in the placement's order
(``orchestrator.backends.zones``), which SkyPilot tries in that order at the launch and again, from the top, at
every recovery of the managed job (docs/scale-out.md, "Zones", says why this and not a zone per attempt); the run
script first exports ``ORCH_ZONE``, the zone of ``SKYPILOT_CLUSTER_INFO``. ``backend.extra.region`` beside it is
refused.

With ``distributed.nodes`` > 1: ``num_nodes``, and the run script gives every node the multi-node contract
(``orchestrator.backends.multinode``) with the store on the head, the first of ``SKYPILOT_NODE_IPS``.
"""

from __future__ import annotations

import logging
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

from orchestrator.attempt.capacity_contract import RESUBMIT, capacity_env, planned_capacity
from orchestrator.backends import (
    render_yaml,
    run_tool,
    worker_command,
    worker_invocation,
)
from orchestrator.backends.multinode import STORE_PORT, store_argv
from orchestrator.backends.settings import backend_settings
from orchestrator.backends.zones import ZONE_ENV, check_zone_settings, zone_order
from orchestrator.core import exitcodes
from orchestrator.core.errors import ConfigError
from orchestrator.core.gpus import skypilot_name
from orchestrator.policy.deadline import SPOT
from orchestrator.process.multinode import NNODES_ENV, NODE_RANK_ENV, RDZV_ID_ENV, STORE_ENV
from orchestrator.process.multinode.checks import node_count

log = logging.getLogger(__name__)
RECOVERY_STRATEGY = "EAGER_NEXT_REGION"
LAUNCH_TIMEOUT_SECONDS = 1800  # sky jobs launch waits for the controller, which may need provisioning
# the workdir installed with the versions the project is tested with (constraints.txt, and torch, which scripts/setup.sh
# and containers/Dockerfile install first): plain ``pip install -e .`` takes the newest torch, transformers, TRL and
# PEFT the ranges allow, another set on each VM a recovery lands on, and a resume is bit-for-bit on one set only
TORCH_VERSION = "2.13.0"
CONSTRAINTS = "constraints.txt"
LOCK_PYTHON = (3, 11)  # the lock's packages (numpy 2.4, pandas 3) need Python 3.11 or later
DEFAULT_SETUP = (
    f"python -c 'import sys; sys.exit(sys.version_info < {LOCK_PYTHON})' || {{ echo \"setup: the locked versions "
    f"({CONSTRAINTS}) need Python {LOCK_PYTHON[0]}.{LOCK_PYTHON[1]} or later, and this VM has $(python -V 2>&1): set "
    f'backend.image (containers/Dockerfile) or a VM image with a newer python" >&2; exit 1; }}\n'
    f'python -m pip install -c {CONSTRAINTS} "torch=={TORCH_VERSION}" -e .\n'
)
LOST_PEER = 128 + 9  # SIGKILL: how a node ends whose peer was lost (restart-the-world)


def accelerator(cfg: Any) -> str | None:
    """ "<GPU>:<count>" for SkyPilot, or None for a CPU-only job."""
    count = int(cfg.compute.gpus_per_node)
    if count <= 0:
        return None
    gpu = str(cfg.compute.gpu_type)
    return f"{skypilot_name(gpu)}:{count}"


def task_config(cfg: Any, overrides: Sequence[str], capacity: Optional[str] = None) -> dict:
    """The managed-job task as a dict, in SkyPilot's task YAML schema; ``capacity`` (spot | on_demand)
    defaults to ``planned_capacity``: a spot job with ``run.deadline`` whose ledger says on-demand runs on-demand.

    Raises:
        ConfigError: compute.nodes and distributed.nodes that differ (``node_count``).
    """
    nodes = node_count(cfg)
    capacity = capacity or planned_capacity(cfg)[0]
    settings = backend_settings(cfg)
    invocation = worker_invocation(cfg, overrides)
    check_zone_settings(cfg)
    zones = zone_order(cfg)
    envs = {"PYTHONUNBUFFERED": "1", **invocation.env, **capacity_env(cfg, capacity, RESUBMIT), **_code_commit_env(cfg)}
    task: dict[str, Any] = {
        "name": str(cfg.run.name),
        "resources": _resources(cfg, capacity, settings),
        "num_nodes": nodes,
        "envs": envs,
        "run": _run_script(worker_command(invocation.overrides), nodes, bool(zones)),
    }
    if zones:
        # tried in this order at the launch and at every recovery (see the module's docstring)
        task["resources"]["ordered"] = [{"zone": z.zone, **({"region": z.region} if z.region else {})} for z in zones]
    if invocation.secret_names:
        # null: the value is given at launch (``sky jobs launch --secret NAME`` reads it from the launcher's
        # environment) and SkyPilot keeps it out of its dashboard and logs
        task["secrets"] = {name: None for name in invocation.secret_names}
    if settings.file_mounts:
        task["file_mounts"] = {remote: _mount_source(local) for remote, local in settings.file_mounts.items()}
    if cfg.backend.image:
        # the image has the project installed (containers/Dockerfile); its entrypoint is not used by SkyPilot
        task["setup"] = backend_settings(cfg).setup or "python -c 'import orchestrator'"
    else:
        task["workdir"] = os.getcwd()
        task["setup"] = backend_settings(cfg).setup or DEFAULT_SETUP
        if not backend_settings(cfg).setup and not workdir_has_lock():
            log.warning(
                "backend=skypilot: %s has no %s, which the setup installs the locked versions with on the VM: "
                "launch from the repository root, or set backend.image or backend.extra.setup",
                os.getcwd(),
                CONSTRAINTS,
            )
    return task


_NODES_RUN = """\
# {nodes} nodes: the store runs on the head (the first of SKYPILOT_NODE_IPS) as a process of its own, beside
# (not inside) the head's torchrun agent; SkyPilot relaunches every node when any is lost (restart-the-world)
head="$(echo "$SKYPILOT_NODE_IPS" | head -n 1)"
export {rank}="$SKYPILOT_NODE_RANK" {nnodes}="$SKYPILOT_NUM_NODES"
export {store_env}="$head:{port}" {rdzv}="$SKYPILOT_TASK_ID"
if [ "$SKYPILOT_NODE_RANK" = 0 ]; then
  {store} &
  trap "kill $! 2>/dev/null" EXIT
fi
{command}
"""


# the zone SkyPilot launched this cluster in (SKYPILOT_CLUSTER_INFO, set for the task's run), for the ledger
_ZONE_RUN = (
    "export {env}=\"$(python -c 'import json, os; "
    'print(json.loads(os.environ.get("SKYPILOT_CLUSTER_INFO") or "{{}}").get("zone") or "")\')"\n'
)


def _run_script(command: str, nodes: int, zoned: bool = False) -> str:
    """The task's ``run``: the worker; with zones, first ``ORCH_ZONE``; on several nodes, first the contract's
    variables and the head's store."""
    zone = _ZONE_RUN.format(env=ZONE_ENV) if zoned else ""
    if nodes == 1:
        return zone + command
    return zone + _NODES_RUN.format(
        nodes=nodes,
        rank=NODE_RANK_ENV,
        nnodes=NNODES_ENV,
        store_env=STORE_ENV,
        rdzv=RDZV_ID_ENV,
        port=STORE_PORT,
        command=command,
        store=shlex.join(store_argv("python", STORE_PORT)),
    )


def _resources(cfg: Any, capacity: str, settings: Any) -> dict:
    """The task's ``resources``: spot or not, the recovery on preemption exits, accelerator, cloud, region, disk, image."""
    resources: dict[str, Any] = {
        "use_spot": capacity == SPOT,
        "job_recovery": {
            "strategy": RECOVERY_STRATEGY,
            "max_restarts_on_errors": int(cfg.requeue.max_failures),
            # several nodes: a node whose peer was lost stops its ranks and exits 128+SIGKILL (vanished, like
            # the peer's preemption it follows), recovered like 75; the ledger's max_preemptions still bounds it
            "recover_on_exit_codes": [exitcodes.PREEMPTED] + ([LOST_PEER] if int(cfg.compute.nodes) > 1 else []),
        },
    }
    if accelerator(cfg):
        resources["accelerators"] = accelerator(cfg)
    if cfg.compute.cloud and cfg.compute.cloud != "any":
        resources["cloud"] = str(cfg.compute.cloud)
    if settings.region:
        resources["region"] = settings.region
    if settings.disk_size:
        resources["disk_size"] = settings.disk_size
    if cfg.backend.image:
        resources["image_id"] = f"docker:{cfg.backend.image}"
    return resources


def _code_commit_env(cfg: Any) -> dict:
    """Without an image the code is this directory, synced as workdir (without .git): its commit, for the
    reproducibility record."""
    if cfg.backend.image:
        return {}
    from orchestrator.records.repro import GIT_COMMIT_ENV, GIT_DIRTY_ENV, git_state

    commit, dirty = git_state(Path.cwd())
    if not commit:
        return {}
    return {GIT_COMMIT_ENV: commit, **({} if dirty is None else {GIT_DIRTY_ENV: "true" if dirty else "false"})}


def workdir_has_lock() -> bool:
    """Whether the folder synced as the workdir (this one) holds the constraints the default setup installs with."""
    return (Path.cwd() / CONSTRAINTS).is_file()


def _mount_source(source: str) -> str:
    """A file mount's source as SkyPilot reads it: a bucket URI as given, a local path absolute."""
    return source if "://" in source else str(Path(source).expanduser().resolve())


def render(cfg: Any, overrides: Sequence[str]) -> str:
    """The task YAML that ``submit`` hands to ``sky jobs launch`` (``render_yaml``: ConfigError for a secret in it)."""
    names = worker_invocation(cfg, overrides).secret_names  # as submit passes them: names only, values from the env
    command = " ".join(["sky jobs launch -y", *(f"--secret {name}" for name in names)])
    return render_yaml(cfg, command, lambda capacity: task_config(cfg, overrides, capacity), "the SkyPilot task YAML")


def submit(cfg: Any, overrides: Sequence[str]) -> str:
    """Run ``sky jobs launch -y <task.yaml>``; returns the job's name (SkyPilot's handle for it).

    Raises:
        ConfigError: the sky CLI is missing or the launch failed (its output included).
    """
    if not cfg.backend.image and not backend_settings(cfg).setup and not workdir_has_lock():
        raise ConfigError(
            f"backend=skypilot syncs {os.getcwd()} to the VM and installs it there with the locked versions "
            f"(pip install -c {CONSTRAINTS} -e .), but it has no {CONSTRAINTS}: launch from the repository root, "
            "or set backend.image (containers/README.md), or backend.extra.setup=<your install command>."
        )
    text = render(cfg, overrides)
    invocation = worker_invocation(cfg, overrides)
    env = {**os.environ, **invocation.secret_values}  # --secret NAME reads the value from here
    secret_flags = [flag for name in invocation.secret_names for flag in ("--secret", name)]
    work = Path(cfg.run.work_dir).expanduser().resolve() / "skypilot"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix=f"{cfg.run.name}-", dir=work, delete=False) as f:
        f.write(text)
    done = run_tool(
        ["sky", "jobs", "launch", "-y", "--name", str(cfg.run.name), *secret_flags, f.name],
        env=env,
        timeout_seconds=LAUNCH_TIMEOUT_SECONDS,
        missing="backend=skypilot needs the sky CLI: pip install 'skypilot[aws]' (or [gcp], [azure], "
        "[kubernetes]), then run `sky check`.",
    )
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise ConfigError(f"sky jobs launch failed for {f.name}:\n{tail}")
    return str(cfg.run.name)
