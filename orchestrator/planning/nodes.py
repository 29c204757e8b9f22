"""The plan's answer for several nodes: from how many spot nodes on-demand is expected to cost less.

A job on N spot nodes loses its attempt when any one of them is preempted, so it is preempted N times as
often as one node (``cost.preemption_prior_per_hour``), and each preemption costs the whole world a restart
and the work since the last checkpoint. Its price and its work grow with N alike on both capacities, so what
tips the balance is the waste: past some N the restarts and lost work outweigh the spot discount.
``spot_break_even`` finds that N by pricing the job (``plan_spot.price_option``) at other node counts
(doubling, then bisecting; the waste grows with N), on the recommended GPU type.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

SPOT, ON_DEMAND = "spot", "on_demand"
MAX_NODES = 128  # the search stops here: "spot stays cheaper up to MAX_NODES nodes"

PriceAt = Callable[[int, str, str], Any]  # (nodes, gpu type, capacity) -> CapacityOption or None


def _spot_dearer(price: PriceAt, gpu_type: str, nodes: int) -> Optional[bool]:
    """Whether spot is expected to cost more than on-demand on ``nodes`` nodes; None: no price to compare."""
    spot, on_demand = price(nodes, gpu_type, SPOT), price(nodes, gpu_type, ON_DEMAND)
    if spot is None or on_demand is None or on_demand.expected_cost_usd is None:
        return None
    return spot.expected_cost_usd is None or spot.expected_cost_usd > on_demand.expected_cost_usd


def break_even_nodes(price: PriceAt, gpu_type: str, max_nodes: int = MAX_NODES) -> Optional[int]:
    """The fewest nodes at which spot is expected to cost more than on-demand (None: not up to ``max_nodes``,
    or no price). Raises ValueError when no count can be priced."""
    cheaper, dearer = 0, 1  # the largest count known cheaper on spot; the next count to try
    while dearer <= max_nodes:
        verdict = _spot_dearer(price, gpu_type, dearer)
        if verdict is None:
            raise ValueError(f"no spot and on-demand price for {gpu_type} on {dearer} nodes")
        if verdict:
            break
        cheaper, dearer = dearer, dearer * 2
    else:
        if cheaper >= max_nodes or not _spot_dearer(price, gpu_type, max_nodes):
            return None
        dearer = max_nodes
    while dearer - cheaper > 1:
        middle = (cheaper + dearer) // 2
        cheaper, dearer = (cheaper, middle) if _spot_dearer(price, gpu_type, middle) else (middle, dearer)
    return dearer


def spot_break_even(price: PriceAt, gpu_type: str, nodes: int, max_nodes: int = MAX_NODES) -> Optional[dict]:
    """``{"nodes", "gpu_type", "node_preemptions_per_hour", "break_even_nodes", "text"}`` for the job's ``nodes``
    on ``gpu_type`` (what ``plan --json`` prints under "nodes"); None when spot and on-demand cannot be priced."""
    here = price(nodes, gpu_type, SPOT)
    try:
        limit = break_even_nodes(price, gpu_type, max_nodes)
    except ValueError:
        return None
    if here is None:
        return None
    per_node = here.preemptions_per_hour / max(1, nodes)
    rate = f"{per_node:.2f} preemptions/h per node, any one of them ends the attempt"
    if limit is None:
        text = f"spot stays cheaper than on-demand on {gpu_type} up to {max_nodes} nodes ({rate})."
    elif limit <= nodes:
        text = (
            f"{nodes} spot nodes are expected to cost more than on-demand on {gpu_type}: from {limit} nodes "
            f"the restarts and lost work outweigh the spot discount ({rate}). Use compute.spot=false, or fewer "
            "nodes with more GPUs each."
        )
    else:
        text = (
            f"{nodes} spot node{'s' if nodes > 1 else ''} on {gpu_type} {'are' if nodes > 1 else 'is'} expected "
            f"to cost less than on-demand; from {limit} nodes on-demand would ({rate})."
        )
    return {
        "nodes": nodes,
        "gpu_type": gpu_type,
        "node_preemptions_per_hour": per_node,
        "break_even_nodes": limit,
        "text": text,
    }
