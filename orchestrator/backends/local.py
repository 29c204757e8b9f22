"""The local backend: the supervisor runs each attempt as a child process on this machine."""

from __future__ import annotations

import shlex
from typing import Any, Sequence

from orchestrator.process.distributed import worker_argv


def render(cfg: Any, overrides: Sequence[str]) -> str:
    """The command each attempt runs, under the supervisor's requeue policy."""
    from omegaconf import OmegaConf

    from orchestrator.core.redaction import scrub_text, secrets_in

    cmd = shlex.join(worker_argv(overrides))
    # printed only: the supervisor passes the real values to its child, which never writes them down
    cmd = scrub_text(cmd, secrets_in(OmegaConf.to_container(cfg, resolve=True)))
    r = cfg.requeue
    return (
        f"# local supervisor: one child per attempt; requeue.max_preemptions={r.max_preemptions}, "
        f"requeue.max_failures={r.max_failures}, crash_loop_threshold={r.crash_loop_threshold}\n{cmd}\n"
    )


def run(cfg: Any, overrides: Sequence[str]) -> int:
    from orchestrator.process.supervisor import Supervisor

    return Supervisor(cfg, list(overrides)).run()
