"""Multi-process training: start the ranks with torchrun (their agreement is ``orchestrator.core.ranks``).

``python -m orchestrator.worker`` stays the one entry point every backend runs.
With ``distributed`` other than ``none`` and no ``RANK`` in the environment, it
becomes a launcher (``orchestrator.process.forked_ranks``): it starts torchrun with one
worker per process, forwards preemption signals to the ranks, and exits with
rank 0's exit code (torchrun itself turns any non-zero rank exit into 1).
Inside the ranks, rank 0 alone talks to storage, the ledger and MLflow; the
others follow its decisions, broadcast over the process group.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from orchestrator.core.exitcodes import PREEMPTION_SIGNALS
from orchestrator.core.ranks import rank, world_size

log = logging.getLogger(__name__)

FORWARDED_SIGNALS = PREEMPTION_SIGNALS


WORKER_MODULE = "orchestrator.worker"


def worker_argv(overrides, *, python: str | None = None, module_only: bool = False) -> list[str]:
    """The one command line of an attempt: ``python -m orchestrator.worker <overrides>``.

    ``module_only``: just ``-m orchestrator.worker <overrides>``, for a launcher that brings its own
    interpreter (torchrun). The supervisor, the ranks' launcher and every backend build it here.
    """
    tail = ["-m", WORKER_MODULE, *overrides]
    return tail if module_only else [python or sys.executable, *tail]


def needs_launcher(cfg) -> bool:
    return cfg.distributed.name != "none" and "RANK" not in os.environ


def init_process_group() -> None:
    """Join the ranks early, so rank 0 can share its restore before the Trainer exists."""
    import torch
    import torch.distributed as dist

    if world_size() <= 1 or dist.is_initialized():
        return
    die_with_parent()  # torchrun killed with its launcher takes the ranks along
    name_process(f"orch-rank{rank()}")
    from orchestrator.core.env import COLLECTIVE_TIMEOUT_ENV

    # a multi-node world's launcher sets the collective timeout (never NCCL's 600 s or gloo's 30 min)
    limit = os.environ.get(COLLECTIVE_TIMEOUT_ENV)
    timeout: dict[str, Any] = {"timeout": timedelta(seconds=float(limit))} if limit else {}
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl", **timeout)
    else:
        dist.init_process_group(backend="gloo", **timeout)


def die_with_parent() -> None:
    """Linux: get SIGKILL when the parent dies, so no rank outlives a killed launcher."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the ledger's fencing still stops an orphan
        pass


def name_process(name: str) -> None:
    """``name`` as this process's name (what ``top``, ``ps -o comm`` and ``psutil``'s ``name()`` show): a rank's
    ``orch-rank<N>``, a node launcher's ``orch-node<N>``. They share one command line, and one forked from its
    parent (``orchestrator.process.forked_ranks``, ``orchestrator.process.warm_start``) has not its ``RANK`` or ``ORCH_NODE_RANK``
    in its ``/proc`` environment (the one it was started with)."""
    import setproctitle

    setproctitle.setthreadtitle(name[:15])


def report_exit(code: int) -> None:
    """Each node's first rank (rank 0 on one node) leaves its exit code for the node's launcher."""
    path = os.environ.get("ORCH_EXIT_FILE")
    if path and int(os.environ.get("LOCAL_RANK", rank())) == 0:
        Path(path).write_text(str(code))
