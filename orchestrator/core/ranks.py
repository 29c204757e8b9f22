"""Where this process stands among the training ranks, and how the ranks agree.

Inside the ranks, rank 0 alone talks to storage, the ledger and MLflow; the others follow its decisions,
broadcast over the process group (which ``orchestrator.process.distributed.init_process_group`` joins). Every
function here is the identity, or rank 0's answer, when the job runs one process.
"""

from __future__ import annotations

import os
from typing import Any


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    return rank() == 0


def configured_world_size(cfg: Any) -> int:
    """Training processes the config asks for (one GPU each): distributed.processes_per_node x nodes;
    1 for distributed=none. The planner, the fingerprint and the cost figures all use this."""
    d = cfg.distributed
    if d.name == "none":
        return 1
    return max(1, int(d.processes_per_node)) * max(1, int(d.nodes))


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (identity when not distributed)."""
    import torch.distributed as dist

    if world_size() <= 1 or not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` when not distributed)."""
    import torch.distributed as dist

    if world_size() <= 1 or not dist.is_initialized():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    import torch.distributed as dist

    if world_size() > 1 and dist.is_initialized():
        dist.barrier()
