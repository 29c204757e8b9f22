"""Slurm: an sbatch script that runs one attempt and requeues itself.

The script asks Slurm for ``--signal=B:USR1@<grace>`` (USR1 to the batch shell
<grace> seconds before the time limit), traps USR1, TERM and INT and forwards
them to the worker, which saves and exits 75. On 75, on a crash, or on a worker
killed by a signal it runs ``scontrol requeue $SLURM_JOB_ID``; the worker
checks the ledger's caps when it starts, and exits 5 when they are spent, so
the requeues end there. Final codes (0, 3, 4, 5, 6) end the job. As a bound of
its own (a worker that dies before reaching the ledger is never counted there)
the script stops requeueing after max_preemptions + max_failures restarts.
With ``distributed.nodes`` > 1 the worker runs on every node under one ``srun``,
with the rendezvous store on the first host (``orchestrator.backends.slurm_nodes``).

Secrets never enter the script: an override holding one reads
``${oc.env:ORCH_SECRET_<KEY>}`` instead, and ``submit`` puts the value in the
environment of ``sbatch``, which exports it to the job (``#SBATCH
--export=ALL,<names>``: the variables by name, never a value; Slurm keeps them for
requeues). ``HF_TOKEN``, when set where the launcher runs and the job reads from
the hub, is one of them. ``backend.image``, when set (a
job you run in a container through ``sbatch_args``, e.g. pyxis's
``--container-image``), is exported as ``ORCH_CONTAINER_IMAGE`` for the
reproducibility record.

With ``run.deadline`` and ``backend.on_demand_partition`` the script tells the
worker which capacity its partition is (``ORCH_CAPACITY``); a worker that
decides to change it names the capacity it wants in a request file, saves and
exits 75, and the script submits the job again to the other partition (Slurm
changes the partition of pending jobs only) instead of requeueing it. A new
submission of the job goes to the partition the ledger's newest decision names.

Settings read from the config: ``run.name`` (job name), ``backend.partition``, ``backend.on_demand_partition``, ``backend.image``,
``compute.gpus_per_node``, ``preemption.grace``, ``run.work_dir`` (logs), and
from ``backend.extra``: ``python`` (the interpreter on the compute node;
default: this launcher's, which suits a shared filesystem), ``output`` (the log
file; Slurm patterns like %j allowed), ``sbatch_args`` (more ``#SBATCH``
options, e.g. ["--time=04:00:00", "--mem=64G"]), ``zone_partitions`` (with ``compute.zones``: the partition of
each zone's nodes; the job asks for the zones' partitions in the placement's order, ``--partition=spot-b,spot-a``,
and ``ORCH_ZONE`` is the zone of the partition it starts in; a listed zone without one is refused at launch).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Optional, Sequence, cast

from orchestrator.backends import (
    entry_final_codes,
    grace_seconds,
    refuse_secrets_in_text,
    run_tool,
    submitted_by,
    worker_command,
    worker_invocation,
)
from orchestrator.backends.settings import backend_settings
from orchestrator.backends.slurm_nodes import node_options, nodes_parts, wait_loop
from orchestrator.backends.zones import ZONE_ENV, Placement, check_zone_settings, zone_order, zone_partitions
from orchestrator.core import exitcodes
from orchestrator.core.errors import ConfigError

SBATCH_TIMEOUT_SECONDS = 60
FINAL_CODES = (
    exitcodes.COMPLETED,
    exitcodes.BUDGET_EXHAUSTED,
    exitcodes.CONFIG_ERROR,
    exitcodes.CAPS_REACHED,
    exitcodes.FENCED,
)

_BODY = r"""
export PYTHONUNBUFFERED=1
{exports}cd {workdir}
{secret_check}
# bash runs a trap only after a foreground child exits, so the worker runs in
# the background and the shell waits on it: a signal then interrupts the wait,
# the trap forwards it at once, and the loop waits again for the real status.
worker_pid=""
signalled=0
forward() {{
  signalled=1
  echo "slurm job $SLURM_JOB_ID: got SIG$1; forwarding it to the worker (pid $worker_pid)" >&2
  [ -n "$worker_pid" ] && kill -s "$1" "$worker_pid" 2>/dev/null || true
}}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
trap 'forward INT' INT

{capacity_env}{zone_env}{nodes_start}echo "slurm job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}) on $(hostname): starting the worker" >&2
{command} &
worker_pid=$!
{wait_loop}{nodes_exit}
case "$rc" in
  {final_codes})
    echo "slurm job $SLURM_JOB_ID: worker exited $rc (final); not requeued" >&2
    exit "$rc" ;;
  {preempted})
    echo "slurm job $SLURM_JOB_ID: worker exited $rc (preempted, checkpoint committed); requeueing" >&2 ;;
  *)
    echo "slurm job $SLURM_JOB_ID: worker exited $rc (crashed or killed); requeueing, the worker checks the caps" >&2 ;;
esac
{capacity_move}# a bound of its own: a worker that dies before it reaches the ledger is never counted there
if [ "${{SLURM_RESTART_COUNT:-0}}" -ge {max_restarts} ]; then
  echo "slurm job $SLURM_JOB_ID: not requeued: restarted $SLURM_RESTART_COUNT times" \
       "(requeue.max_preemptions + requeue.max_failures = {max_restarts})" >&2
  exit "$rc"
fi
scontrol requeue "$SLURM_JOB_ID"
exit "$rc"
"""


_CAPACITY_ENV = r"""# run.deadline: the worker decides spot or on-demand; this partition tells it which it is on, and it
# names the capacity it wants in the request file before it saves and exits 75 (orchestrator/attempt/capacity.py)
if [ "${{SLURM_JOB_PARTITION:-}}" = {on_demand} ]; then export ORCH_CAPACITY=on_demand; else export ORCH_CAPACITY=spot; fi
export ORCH_CAPACITY_ACTION=move
export ORCH_CAPACITY_REQUEST_FILE={request_dir}/"{name}-$SLURM_JOB_ID.capacity"
rm -f "$ORCH_CAPACITY_REQUEST_FILE"
"""

_CAPACITY_MOVE = r"""if [ "$rc" -eq {preempted} ] && [ -s "$ORCH_CAPACITY_REQUEST_FILE" ]; then
  case "$(cat "$ORCH_CAPACITY_REQUEST_FILE")" in on_demand) target={on_demand} ;; *) target={spot} ;; esac
  rm -f "$ORCH_CAPACITY_REQUEST_FILE"
  if [ "$target" != "${{SLURM_JOB_PARTITION:-}}" ]; then
    # Slurm changes the partition of a pending job only, and a requeued job is pending only once this script
    # has ended: the job is submitted again, to the other partition (the same script and environment)
    if new_job="$(env -u SLURM_RESTART_COUNT sbatch --parsable --partition="$target" "$0")"; then
      echo "slurm job $SLURM_JOB_ID: capacity: moved from partition $SLURM_JOB_PARTITION to $target as job ${{new_job%%;*}}" >&2
      exit 0
    fi
    echo "slurm job $SLURM_JOB_ID: capacity: could not submit to partition $target; requeueing here" >&2
  fi
fi
"""


def _capacity_parts(cfg: Any, spot: Optional[str]) -> tuple[str, str]:
    """The script's lines that move a job between the spot partition(s) and ``backend.on_demand_partition``."""
    on_demand = cfg.backend.on_demand_partition
    if not on_demand:
        return "", ""
    names = dict(on_demand=shlex.quote(str(on_demand)), spot=shlex.quote(str(spot)))
    request_dir = shlex.quote(str(Path(cfg.run.work_dir).expanduser().resolve() / "slurm"))
    return (
        _CAPACITY_ENV.format(request_dir=request_dir, name=cfg.run.name, **names),
        _CAPACITY_MOVE.format(preempted=exitcodes.PREEMPTED, **names),
    )


def spot_partition(cfg: Any, zones: Sequence[Placement]) -> Optional[str]:
    """The partition(s) a spot attempt asks for: with ``compute.zones``, the zones' partitions in the placement's
    order (``p1,p2``: Slurm starts the job in the first that can run it), else ``backend.partition``."""
    return ",".join(zone_partitions(cfg, list(zones))) if zones else cfg.backend.partition


def _zone_env(cfg: Any, zones: Sequence[Placement]) -> str:
    """The script's line that names the attempt's zone (``ORCH_ZONE``) from the partition Slurm started it in."""
    if not zones:
        return ""
    mapping = backend_settings(cfg).zone_partitions or {}
    by_partition: dict[str, list[str]] = {}
    for zone in zones:
        by_partition.setdefault(mapping[zone.zone], []).append(zone.zone)
    cases = "".join(
        f"  {shlex.quote(p)}) export {ZONE_ENV}={shlex.quote(z[0] if len(z) == 1 else '')} ;;\n"
        for p, z in by_partition.items()
    )  # a partition of two zones does not say which
    return (
        f'# compute.zones: the zone of the partition this attempt runs in\ncase "${{SLURM_JOB_PARTITION:-}}" in\n'
        f"{cases}  *) export {ZONE_ENV}= ;;\nesac\n"
    )


def partition(cfg: Any, spot: Optional[str] = None) -> tuple[Optional[str], str]:
    """The partition to submit to, and why: the on-demand one when the job's ledger says so (run.deadline), else
    ``spot`` (``spot_partition``; default ``backend.partition``)."""
    spot = spot or cfg.backend.partition
    on_demand = cfg.backend.on_demand_partition
    if not on_demand:
        return spot, ""
    from orchestrator.attempt.capacity_contract import planned_capacity, stored_text
    from orchestrator.policy.deadline import ON_DEMAND

    capacity, decision = planned_capacity(cfg)
    if capacity == ON_DEMAND:
        return str(
            on_demand
        ), f"on-demand, as the ledger's newest capacity decision says: {stored_text(cast(Any, decision)['reason'])}"
    return spot, ""


def _output_path(cfg: Any) -> str:
    default = Path(cfg.run.work_dir).expanduser().resolve() / "slurm" / f"{cfg.run.name}-%j.out"
    return str(backend_settings(cfg).output or default)


def _secret_check(names: Sequence[str]) -> str:
    """Bash that stops the job (exit 4, not requeued) when a secret's variable did not reach it."""
    if not names:
        return ""
    return (
        "# secrets reach the worker only through the environment sbatch exports (never this file)\n"
        f"for name in {' '.join(shlex.quote(n) for n in names)}; do\n"
        '  if [ -z "${!name:-}" ]; then\n'
        "    echo \"slurm job $SLURM_JOB_ID: environment variable $name is not set (submit with sbatch's default"
        ' --export=ALL)" >&2\n'
        f"    exit {exitcodes.CONFIG_ERROR}\n"
        "  fi\n"
        "done\n"
    )


def _sbatch_args(cfg: Any, secret_names) -> list[str]:
    """``backend.extra.sbatch_args``, checked: long options only, and no ``--export`` that drops the secrets."""
    sbatch_args = list(backend_settings(cfg).sbatch_args)
    if isinstance(sbatch_args, str) or not all(str(a).startswith("--") for a in sbatch_args):
        raise ConfigError(
            f"backend.extra.sbatch_args={sbatch_args!r} must be a list of long sbatch options, "
            "e.g. ['--time=04:00:00', '--mem=64G']."
        )
    if secret_names and any(str(a).startswith("--export") and "ALL" not in str(a) for a in sbatch_args):
        raise ConfigError(
            f"backend.extra.sbatch_args={list(sbatch_args)!r}: --export without ALL would keep "
            f"{', '.join(secret_names)} (the secrets the worker reads) from the job. Drop --export "
            "or include ALL."
        )
    return [str(a) for a in sbatch_args]


def render(cfg: Any, overrides: Sequence[str]) -> str:
    """The sbatch script for this job (text; nothing is written or run).

    Every interpolated value is shell-quoted (``#SBATCH`` lines too: sbatch
    honours quotes there); secrets are referenced by variable name only.

    Raises:
        ConfigError: node counts that differ, a bad grace, a malformed sbatch_args, or a secret in the script.
    """
    invocation = worker_invocation(cfg, overrides)
    grace = grace_seconds(cfg)
    check_zone_settings(cfg)
    zones = zone_order(cfg)
    spot = spot_partition(cfg, zones)
    options = [
        f"--job-name={cfg.run.name}",
        "--requeue",
        f"--signal=B:USR1@{grace}",
        "--open-mode=append",
        f"--output={_output_path(cfg)}",
        *node_options(cfg),
    ]
    chosen, why = partition(cfg, spot)
    if chosen:
        options.append(f"--partition={chosen}")
    if int(cfg.compute.gpus_per_node) > 0:
        options.append(f"--gpus-per-node={int(cfg.compute.gpus_per_node)}")
    user_args = _sbatch_args(cfg, invocation.secret_names)
    if invocation.secret_names and not any(a.startswith("--export") for a in user_args):
        # the names, never the values: sbatch exports each from the submitting environment (ALL: the rest too)
        options.append("--export=" + ",".join(["ALL", *invocation.secret_names]))
    options.extend(user_args)

    header = ["#!/bin/bash", *(f"#SBATCH {shlex.quote(opt)}" for opt in options)]
    header.append(f"# submitted by: {submitted_by('slurm', str(cfg.run.name))}")
    if why:
        header.append(f"# capacity: {why}".replace("\n", " "))
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in invocation.env.items())
    capacity_env, capacity_move = _capacity_parts(cfg, spot)
    python = backend_settings(cfg).python
    nodes_start, command, nodes_exit = nodes_parts(cfg, worker_command(invocation.overrides, python=python), python)
    body = _BODY.format(
        nodes_start=nodes_start,
        nodes_exit=nodes_exit,
        wait_loop=wait_loop("worker_pid"),
        exports=exports,
        capacity_env=capacity_env,
        zone_env=_zone_env(cfg, zones),
        capacity_move=capacity_move,
        secret_check=_secret_check(invocation.secret_names),
        workdir=shlex.quote(os.getcwd()),
        command=command,
        final_codes="|".join(str(c) for c in (*FINAL_CODES, *entry_final_codes())),  # the eval job's 2 too
        preempted=exitcodes.PREEMPTED,
        max_restarts=int(cfg.requeue.max_preemptions) + int(cfg.requeue.max_failures),
    )
    return refuse_secrets_in_text(cfg, "\n".join(header) + "\n" + body, "the sbatch script")


def submit(cfg: Any, overrides: Sequence[str]) -> str:
    """Write the script under ``run.work_dir/slurm/``, ``sbatch --parsable`` it, return the job id.

    Raises:
        ConfigError: sbatch is missing or refused the job (its message included).
    """
    script = render(cfg, overrides)
    # sbatch exports its own environment to the job (--export=ALL): the secrets taken out of the script go there
    env = {**os.environ, **worker_invocation(cfg, overrides).secret_values}
    out_dir = Path(_output_path(cfg)).parent
    out_dir.mkdir(parents=True, exist_ok=True)  # Slurm does not create it, and the job would fail silently
    script_path = Path(cfg.run.work_dir).expanduser().resolve() / "slurm" / f"{cfg.run.name}.sbatch"
    script_path.parent.mkdir(parents=True, exist_ok=True)
    script_path.write_text(script)
    done = run_tool(
        ["sbatch", "--parsable", str(script_path)],
        env=env,
        timeout_seconds=SBATCH_TIMEOUT_SECONDS,
        missing="backend=slurm needs the sbatch command on PATH; run the launcher on a Slurm login node.",
    )
    if done.returncode != 0:
        raise ConfigError(f"sbatch refused {script_path}: {done.stderr.strip() or done.stdout.strip()}")
    # --parsable prints "jobid" or "jobid;cluster"
    return done.stdout.strip().split(";")[0]
