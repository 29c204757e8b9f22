"""Launch checks of a multi-node job (run by ``orchestrator.app.checks.validate``)."""

from __future__ import annotations

from orchestrator.core.errors import ConfigError


def node_count(cfg) -> int:
    """The machines the job runs on: ``compute.nodes`` (which bills them) and ``distributed.nodes`` (which
    starts a worker on each) must agree, and several need a distributed strategy to span them.

    Raises:
        ConfigError: either is not so, naming the fix.
    """
    billed, started = int(cfg.compute.nodes), int(cfg.distributed.nodes)
    if billed != started:
        raise ConfigError(
            f"compute.nodes={billed} but distributed.nodes={started}: the machines trained on are the machines "
            "billed (the backend asks the engine for compute.nodes machines and starts a worker on "
            f"distributed.nodes of them). Set both to the same number, e.g. compute.nodes={max(billed, started)} "
            f"distributed.nodes={max(billed, started)}."
        )
    if billed > 1 and str(cfg.distributed.name) == "none":
        raise ConfigError(
            f"distributed.nodes={billed} with distributed=none trains on one process, which cannot span {billed} "
            "machines. Choose distributed=ddp, zero2, zero3 or fsdp (with distributed.processes_per_node set to "
            "the GPUs per node) for a multi-node job, or set compute.nodes=1 distributed.nodes=1."
        )
    return billed


def check_nodes(cfg) -> None:
    """More than one node needs a distributed mode, the machines it bills, and a usable heartbeat timeout."""
    from orchestrator.process.multinode.timeouts import heartbeat_timeout_s

    try:
        heartbeat_timeout_s(cfg.distributed.heartbeat_timeout)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if int(cfg.distributed.nodes) > 1:
        node_count(cfg)


CHECKS = (check_nodes,)
