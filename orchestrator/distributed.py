"""Multi-process training: start the ranks with torchrun, and let them agree.

``python -m orchestrator.worker`` stays the one entry point every backend runs.
With ``distributed`` other than ``none`` and no ``RANK`` in the environment, it
becomes a launcher: it starts ``torch.distributed.run`` (torchrun) with one
worker per process, forwards preemption signals to the ranks, and exits with
rank 0's exit code (torchrun itself turns any non-zero rank exit into 1).
Inside the ranks, rank 0 alone talks to storage, the ledger and MLflow; the
others follow its decisions, broadcast over the process group.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import uuid
from datetime import timedelta
from pathlib import Path

from orchestrator.exitcodes import PREEMPTION_SIGNALS

log = logging.getLogger(__name__)

FORWARDED_SIGNALS = PREEMPTION_SIGNALS


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


WORKER_MODULE = "orchestrator.worker"


def worker_argv(overrides, *, python: str | None = None, module_only: bool = False) -> list[str]:
    """The one command line of an attempt: ``python -m orchestrator.worker <overrides>``.

    ``module_only``: just ``-m orchestrator.worker <overrides>``, for a launcher that brings its own
    interpreter (torchrun). The supervisor, the ranks' launcher and every backend build it here.
    """
    tail = ["-m", WORKER_MODULE, *overrides]
    return tail if module_only else [python or sys.executable, *tail]


def configured_world_size(cfg) -> int:
    """Training processes the config asks for (one GPU each): distributed.processes_per_node x nodes;
    1 for distributed=none. The planner, the fingerprint and the cost figures all use this."""
    d = cfg.distributed
    if d.name == "none":
        return 1
    return max(1, int(d.processes_per_node)) * max(1, int(d.nodes))


def is_main() -> bool:
    return rank() == 0


def needs_launcher(cfg) -> bool:
    return cfg.distributed.name != "none" and "RANK" not in os.environ


def init_process_group() -> None:
    """Join the ranks early, so rank 0 can share its restore before the Trainer exists."""
    import torch
    import torch.distributed as dist

    if world_size() <= 1 or dist.is_initialized():
        return
    die_with_parent()  # torchrun killed with its launcher takes the ranks along
    name_rank()
    from orchestrator.multinode import COLLECTIVE_TIMEOUT_ENV

    # a multi-node world's launcher sets the collective timeout (never NCCL's 600 s or gloo's 30 min)
    limit = os.environ.get(COLLECTIVE_TIMEOUT_ENV)
    timeout = {"timeout": timedelta(seconds=float(limit))} if limit else {}
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl", **timeout)
    else:
        dist.init_process_group(backend="gloo", **timeout)


def broadcast(obj):
    """Rank 0's ``obj`` on every rank (identity when not distributed)."""
    import torch.distributed as dist

    if world_size() <= 1 or not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj) -> list:
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


def die_with_parent() -> None:
    """Linux: get SIGKILL when the parent dies, so no rank outlives a killed launcher."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the ledger's fencing still stops an orphan
        pass


def name_rank() -> None:
    """``orch-rank<N>`` as this rank's process name (what ``top``, ``ps -o comm`` and ``psutil``'s ``name()`` show):
    a node's ranks share one command line, and a rank forked by torchrun's agent (``orchestrator.forked_ranks``)
    has no ``RANK`` in its ``/proc`` environment."""
    import setproctitle

    setproctitle.setthreadtitle(f"orch-rank{rank()}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(cfg, overrides: list[str], work_root: Path) -> int:
    """Run the ranks under torchrun; return rank 0's exit code (one node: ``orchestrator.multinode.node``
    launches a node of a multi-node world)."""
    import psutil

    token = uuid.uuid4().hex[:12]
    exit_file = work_root / f"exit-{token}"
    work_root.mkdir(parents=True, exist_ok=True)
    from orchestrator import forked_ranks

    flags = [f"--nproc_per_node={cfg.distributed.processes_per_node}", "--nnodes=1", "--master_addr=127.0.0.1",
             f"--master_port={_free_port()}"]
    env = dict(os.environ, ORCH_ATTEMPT_TOKEN=token, ORCH_EXIT_FILE=str(exit_file))
    # torchrun in its own session: a signal to our process group must reach the ranks
    # (which save and exit 75), not torchrun (which would kill them after its own timeout)
    child = forked_ranks.start(cfg, flags, overrides, env)

    def forward(signum, _frame):
        for proc in psutil.Process(child.pid).children(recursive=True):
            if "orchestrator.worker" in " ".join(proc.cmdline()):
                proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        rc = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if exit_file.exists():
        code = int(exit_file.read_text().strip() or rc)
        exit_file.unlink()
        return code
    log.error("the ranks exited (torchrun rc=%s) without rank 0 reporting an exit code", rc)
    return rc if rc else 1


def report_exit(code: int) -> None:
    """Each node's first rank (rank 0 on one node) leaves its exit code for the node's launcher."""
    path = os.environ.get("ORCH_EXIT_FILE")
    if path and int(os.environ.get("LOCAL_RANK", rank())) == 0:
        Path(path).write_text(str(code))
