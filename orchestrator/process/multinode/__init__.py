"""Multi-node attempts: every node runs ``python -m orchestrator.worker <overrides>``, and the world restarts as one.

The contract with every backend (local supervisor, Slurm, SkyPilot, Kubernetes):

- one process per attempt runs the rendezvous and heartbeat store,
  ``python -m orchestrator.process.multinode.store --host H --port P``, where losing a training
  node cannot take it (never inside a node's torchrun agent);
- each node runs the ordinary worker with ``ORCH_NODE_RANK`` (0..N-1), ``ORCH_NNODES``,
  ``ORCH_STORE=host:port`` and ``ORCH_RDZV_ID`` (fresh per attempt) in its environment,
  and optionally ``ORCH_NODE_ADDR`` (the address the node's agent advertises) and ``ORCH_NODE_HOST`` (the
  name the ledger records for the node: Slurm's node name, the Kubernetes node);
- each node's launcher records its host, start, end and exit in the attempt's ``nodes``
  (``orchestrator.process.multinode.records``);
- any node lost ends the attempt for every node (restart-the-world, see docs/scale-out.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

from orchestrator.core.env import (  # noqa: F401 - the contract's names, kept on core's floor
    COLLECTIVE_TIMEOUT_ENV,
    NNODES_ENV,
    NODE_ADDR_ENV,
    NODE_HOST_ENV,
    NODE_RANK_ENV,
    RDZV_ID_ENV,
    STORE_ENV,
)
from orchestrator.core.errors import ConfigError


@dataclass(frozen=True)
class NodeEnv:
    """This node's place in the world, as the backend gave it."""

    rank: int
    nnodes: int
    host: str
    port: int
    rdzv_id: str
    addr: Optional[str] = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def as_env(self) -> dict[str, str]:
        env = {
            NODE_RANK_ENV: str(self.rank),
            NNODES_ENV: str(self.nnodes),
            STORE_ENV: self.endpoint,
            RDZV_ID_ENV: self.rdzv_id,
        }
        if self.addr:
            env[NODE_ADDR_ENV] = self.addr
        return env


def node_env(cfg, environ: Mapping[str, str] = os.environ) -> Optional[NodeEnv]:
    """This node's ``NodeEnv`` when the config asks for more than one node (None for one node).

    Raises:
        ConfigError: ``distributed.nodes`` > 1 but the backend gave no (or a malformed) node environment,
            or one that disagrees with the config.
    """
    nodes = int(cfg.distributed.nodes)
    if nodes <= 1 or cfg.distributed.name == "none":
        return None
    missing = [name for name in (NODE_RANK_ENV, NNODES_ENV, STORE_ENV, RDZV_ID_ENV) if not environ.get(name)]
    if missing:
        raise ConfigError(
            f"distributed.nodes={nodes}: this worker was started without {', '.join(missing)} (set by the backend "
            "that starts every node). Launch the job with python -m orchestrator.launch (backend=local, slurm, "
            "skypilot or kubernetes), which starts the rendezvous store and every node."
        )
    host, _, port = environ[STORE_ENV].rpartition(":")
    try:
        rank, nnodes, port_number = int(environ[NODE_RANK_ENV]), int(environ[NNODES_ENV]), int(port)
    except ValueError:
        raise ConfigError(
            f"{NODE_RANK_ENV}, {NNODES_ENV} must be integers and {STORE_ENV} host:port; got "
            f"{environ[NODE_RANK_ENV]!r}, {environ[NNODES_ENV]!r}, {environ[STORE_ENV]!r}."
        ) from None
    if nnodes != nodes or not 0 <= rank < nnodes or not host:
        raise ConfigError(
            f"{NNODES_ENV}={nnodes}, {NODE_RANK_ENV}={rank} do not fit distributed.nodes={nodes} "
            f"(node ranks 0..{nodes - 1}, {STORE_ENV}=host:port)."
        )
    return NodeEnv(
        rank=rank,
        nnodes=nnodes,
        host=host,
        port=port_number,
        rdzv_id=environ[RDZV_ID_ENV],
        addr=environ.get(NODE_ADDR_ENV) or None,
    )
