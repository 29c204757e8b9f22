"""Slurm, several nodes: one ``srun`` of the worker across the allocation, and the store on its first host.

For ``distributed.nodes=N`` (N > 1) the sbatch script asks for ``--nodes=N --ntasks-per-node=1`` and:

1. finds the allocation's first host (``scontrol show hostnames``, the host the batch shell runs on) and its
   address (the node's ``NodeAddr``, what Slurm itself connects to; the name when Slurm gives none);
2. starts the rendezvous and heartbeat store there, in the background of the batch shell: a process of its
   own, outside every node's torchrun agent, so that losing any training node cannot take it;
3. runs one ``srun --nodes=N --ntasks-per-node=1`` step of the worker, each task with
   ``ORCH_NODE_RANK=$SLURM_NODEID`` (see ``orchestrator.backends.multinode``), ``ORCH_NODE_HOST`` its Slurm
   node name (what the ledger records for the node) and ``ORCH_RDZV_ID`` made of the job id and its restart
   count (fresh for every requeue);
4. takes node 0's exit code as the attempt's outcome (node 0 runs on the batch host and leaves it in a
   file there), so a final code of rank 0 (3, 4, 5, 6) is never outvoted by another node's 75; the
   script then requeues or stops exactly as for one node.

``srun --kill-on-bad-exit=0`` keeps a node that saved and exited 75 from killing the others while rank 0
still commits the emergency checkpoint; ``--wait`` (``preemption.grace`` plus a margin) bounds how long the
others run on once one node has ended.
"""

from __future__ import annotations

import shlex
from typing import Any

from orchestrator.backends import grace_seconds
from orchestrator.backends.multinode import NODE_EXIT_MARGIN_SECONDS, store_command
from orchestrator.process.multinode import NNODES_ENV, NODE_HOST_ENV, NODE_RANK_ENV, RDZV_ID_ENV, STORE_ENV
from orchestrator.process.multinode.checks import node_count

NODE_EXIT_FILE_ENV = "ORCH_NODE0_EXIT_FILE"
STORE_READY_SECONDS = 60

_NODES_START = r"""# {nodes} nodes: the rendezvous store runs here, on the allocation's first host, outside every node's agent
head_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
head_addr="$(scontrol show node "$head_node" --oneliner 2>/dev/null | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')"
head_addr="${{head_addr:-$head_node}}"
store_port="$({python} -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')"
{store} &
store_pid=$!
trap 'kill "$store_pid" 2>/dev/null' EXIT
for _ in $(seq {ready}); do (exec 3<>"/dev/tcp/$head_addr/$store_port") 2>/dev/null && break; sleep 1; done
export {nnodes}={nodes}
export {store_env}="$head_addr:$store_port"
export {rdzv}="$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}"
export {exit_env}="${{TMPDIR:-/tmp}}/orch-$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}.node0-exit"
rm -f "${exit_env}"
echo "slurm job $SLURM_JOB_ID: store at ${store_env} (pid $store_pid), {nodes} nodes: $SLURM_JOB_NODELIST" >&2
"""

# one task per node: the worker in the background so that a signal is forwarded at once (as the batch shell
# does), then node 0 leaves its exit code for the batch shell, which runs on the same host
_NODE_TASK = r"""export {rank}="$SLURM_NODEID" {host}="$SLURMD_NODENAME"
{command} &
pid=$!
for s in USR1 TERM INT; do trap "signalled=1; kill -s $s $pid 2>/dev/null" "$s"; done
{wait_loop}if [ "$SLURM_NODEID" = 0 ]; then echo "$rc" > "${exit_env}"; fi
exit "$rc"
"""

_NODES_EXIT = r"""if [ -s "${exit_env}" ]; then
  echo "slurm job $SLURM_JOB_ID: srun exited $rc; node 0 exited $(cat "${exit_env}")" >&2
  rc="$(cat "${exit_env}")"
fi
rm -f "${exit_env}"
"""


def wait_loop(pid_var: str) -> str:
    """Bash that waits for ``$<pid_var>``'s real exit status into ``$rc``: a signal interrupts ``wait`` (its trap,
    which sets ``signalled=1``, forwards it), so the loop waits again until the process itself has ended."""
    return (
        'rc=""\nwhile :; do\n  signalled=0\n  wait "$' + pid_var + '"; status=$?\n'
        "  # 127: the status was already collected by an earlier wait\n"
        '  if [ "$status" -eq 127 ] && [ -n "$rc" ]; then break; fi\n  rc=$status\n'
        '  [ "$signalled" = 1 ] || break\ndone\n'
    )


def node_options(cfg: Any) -> list[str]:
    """The ``#SBATCH`` options for the job's nodes (ConfigError from ``node_count``)."""
    nodes = node_count(cfg)
    return ["--nodes=1", "--ntasks=1"] if nodes == 1 else [f"--nodes={nodes}", "--ntasks-per-node=1"]


def nodes_parts(cfg: Any, command: str, python: str) -> tuple[str, str, str]:
    """(lines before the worker starts, the command the batch shell runs in the background, lines after it
    ended): for one node ("", ``command``, "")."""
    nodes = node_count(cfg)
    if nodes == 1:
        return "", command, ""
    names = dict(
        nnodes=NNODES_ENV,
        store_env=STORE_ENV,
        rdzv=RDZV_ID_ENV,
        exit_env=NODE_EXIT_FILE_ENV,
        rank=NODE_RANK_ENV,
        host=NODE_HOST_ENV,
    )
    start = _NODES_START.format(
        nodes=nodes,
        python=shlex.quote(python),
        ready=STORE_READY_SECONDS,
        store=store_command(python, '"$head_addr"', '"$store_port"'),
        **names,
    )
    task = _NODE_TASK.format(command=command, wait_loop=wait_loop("pid"), **names)
    srun = shlex.join(
        [
            "srun",
            f"--nodes={nodes}",
            "--ntasks-per-node=1",
            "--kill-on-bad-exit=0",
            f"--wait={grace_seconds(cfg) + NODE_EXIT_MARGIN_SECONDS}",
            "bash",
            "-c",
            task,
        ]
    )
    return start, srun, _NODES_EXIT.format(**names)
