"""The environment variables by which the orchestrator's processes hand each other their place.

A multi-node world's backend gives each node these (``orchestrator.process.multinode`` is the contract); they are
named here, on the lowest floor, because the ledger (which node an attempt's record came from) and the
ranks' process group (the collective timeout) read them too.
"""

from __future__ import annotations

NODE_RANK_ENV = "ORCH_NODE_RANK"
NNODES_ENV = "ORCH_NNODES"
STORE_ENV = "ORCH_STORE"
RDZV_ID_ENV = "ORCH_RDZV_ID"
NODE_ADDR_ENV = "ORCH_NODE_ADDR"
# optional: the name the ledger records for this node (default: ORCH_NODE_ADDR, else the hostname)
NODE_HOST_ENV = "ORCH_NODE_HOST"
# what the node launcher hands its ranks: the process group's collective timeout, in seconds
COLLECTIVE_TIMEOUT_ENV = "ORCH_COLLECTIVE_TIMEOUT_S"
# where the attempt runs (compute.zones): the backend (or the local supervisor's requeue loop, or a bench) sets it;
# else SkyPilot's cluster info, a JSON object with "zone" (orchestrator.attempt.zone)
ZONE_ENV = "ORCH_ZONE"
SKYPILOT_CLUSTER_INFO_ENV = "SKYPILOT_CLUSTER_INFO"
