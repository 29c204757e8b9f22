"""Launch checks of a multi-node job (run by ``orchestrator.config.checks.validate``)."""
from __future__ import annotations

from orchestrator.errors import ConfigError


def check_nodes(cfg) -> None:
    """More than one node needs a distributed mode, the machines it bills, and a usable heartbeat timeout."""
    from orchestrator.multinode.timeouts import heartbeat_timeout_s

    nodes = int(cfg.distributed.nodes)
    try:
        heartbeat_timeout_s(cfg.distributed.heartbeat_timeout)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if nodes <= 1:
        return
    if cfg.distributed.name == "none":
        raise ConfigError(f"distributed.nodes={nodes} with distributed=none trains on one process. Choose "
                          "distributed=ddp, zero2, zero3 or fsdp for a multi-node job, or set distributed.nodes=1.")
    if int(cfg.compute.nodes) != nodes:
        raise ConfigError(f"distributed.nodes={nodes} but compute.nodes={cfg.compute.nodes}: the machines trained "
                          f"on are the machines billed. Set compute.nodes={nodes} (or distributed.nodes="
                          f"{cfg.compute.nodes}).")


CHECKS = (check_nodes,)
