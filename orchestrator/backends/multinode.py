"""What a backend gives every node of a multi-node job: the contract with the multi-node runtime.

Each node runs the ordinary entry, ``python -m orchestrator.worker <overrides>``, with four variables (their
names are ``orchestrator.process.multinode``'s):

- ``ORCH_NODE_RANK``: this node's rank, 0..N-1 (Slurm's ``SLURM_NODEID``, SkyPilot's
  ``SKYPILOT_NODE_RANK``, the Kubernetes Job's completion index);
- ``ORCH_NNODES``: N;
- ``ORCH_STORE``: ``host:port`` of the rendezvous and heartbeat store;
- ``ORCH_RDZV_ID``: the rendezvous id, fresh for every attempt of the job.

The store is a process of its own, ``python -m orchestrator.process.multinode.store --host H --port P``, started
by the backend where losing a training node cannot take it: never inside a node's torchrun agent
(Slurm: the batch shell on the allocation's first host; SkyPilot: beside the head node's worker;
Kubernetes: a pod of its own). Recovery is restart-the-world: any node lost ends the attempt for every
node, and the engine starts all of them again from the last committed checkpoint.
"""

from __future__ import annotations

import shlex

STORE_MODULE = "orchestrator.process.multinode.store"
STORE_PORT = 29400  # where a node has a host of its own (SkyPilot's VMs, Kubernetes pods): a fixed port
# how long the other nodes may run on after the first one ended (Slurm's srun --wait): the emergency
# checkpoint's commit (preemption.grace), then this margin to upload and exit
NODE_EXIT_MARGIN_SECONDS = 60


def store_command(python: str, host: str, port: str) -> str:
    """The shell command that starts the store; ``host`` and ``port`` are shell words (may be "$var")."""
    return f"{shlex.quote(python)} -m {STORE_MODULE} --host {host} --port {port}"


def store_argv(python: str, port: int) -> list[str]:
    """The store's argv where it has a host of its own (listening on every address)."""
    return [python, "-m", STORE_MODULE, "--host", "0.0.0.0", "--port", str(port)]
