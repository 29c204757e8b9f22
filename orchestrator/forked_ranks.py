"""torchrun's ranks forked from a launcher that imported the training stack once (``requeue.fork_attempts``).

Under torchrun every rank was a fresh ``python -m orchestrator.worker``: each imported torch, transformers, PEFT,
TRL and datasets (DeepSpeed too under ZeRO) before its first step, all of a node's ranks at once on the same cores
and disk, after torchrun's own import of torch. With ``requeue.fork_attempts=true`` (the default) the ranks'
launcher (the single-node worker launcher, or a node of a multi-node world) imports the stack once and runs
torchrun's own agent through its launcher API (``torch.distributed.launcher.api.elastic_launch``, what the
``torchrun`` command runs) with a function entrypoint and ``start_method="fork"``, which torchrun offers for
functions: the rendezvous, the agent, each rank's environment (``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ...) and
the failure handling stay torchrun's; each rank is forked from the agent and runs the worker in-process, titled
as the worker's command line. Rank 0's restart split counts the launcher's start and import as its own
(``attempt.start_up.Inherited``).

The same checks as for forked attempts (``warm_start.unsafe_reason``) are made before the agent is forked: no
Python thread but the main one, no GPU driver loaded (CUDA is initialised by each rank after its fork, never
before). Otherwise, or with ``requeue.fork_attempts=false``, torchrun runs as a command and each rank is a fresh
interpreter, as before; the log says why.
"""
from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, Optional

from orchestrator.distributed import WORKER_MODULE, die_with_parent, worker_argv

log = logging.getLogger(__name__)

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def start(cfg: Any, flags: list[str], overrides: list[str], env: dict[str, str]):
    """torchrun with ``flags`` for the ranks of ``python -m orchestrator.worker <overrides>``, in a session of its
    own with environment ``env``: a forked agent whose ranks are forked (``warm_start.ForkedAttempt``), else the
    ``torchrun`` command (``subprocess.Popen``). Either has ``pid``, ``poll``, ``wait`` and ``send_signal``."""
    began = _launcher_start()
    reason = refusal(cfg)
    if reason is not None:
        log.info("ranks start a fresh interpreter each under torchrun: %s", reason)
        return subprocess.Popen([*TORCHRUN, *flags, *worker_argv(overrides, module_only=True)], env=env,
                                start_new_session=True, preexec_fn=die_with_parent)
    from orchestrator.attempt.start_up import Inherited
    from orchestrator.warm_start import ForkedAttempt

    inherited = Inherited(began, time.process_time(), source="torchrun's agent")
    log.info("training stack imported once on this node: its ranks are forked from torchrun's agent")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    gc.freeze()  # the ranks share the launcher's imported pages
    pid = os.fork()
    if pid == 0:
        _run_agent(flags, overrides, env, inherited)  # never returns
    gc.unfreeze()
    return ForkedAttempt(pid)


def refusal(cfg: Any) -> Optional[str]:
    """None once this process imported what the ranks import and may fork their agent; else why it may not."""
    from orchestrator import warm_start

    if not cfg.requeue.fork_attempts:
        return "requeue.fork_attempts=false"
    if not hasattr(os, "fork"):
        return "this platform has no fork"
    warm_start.import_stack(cfg)
    return warm_start.unsafe_reason(who="the ranks' launcher")


def _launcher_start() -> float:
    """When this launcher's start-up began: its process start (or what it inherited, were it forked)."""
    import psutil

    from orchestrator.attempt.start_up import inherited

    return inherited().started_at if inherited() else float(psutil.Process().create_time())


def _run_agent(flags: list[str], overrides: list[str], env: dict[str, str], inherited) -> None:
    """The forked child: torchrun's agent in a session of its own; ends the process with torchrun's code."""
    code = 1
    try:
        os.setsid()
        die_with_parent()
        os.environ.clear()
        os.environ.update(env)
        _default_signals()
        code = _agent(flags, overrides, inherited)
    except BaseException:  # noqa: BLE001 - printed as torchrun would, then exit 1
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _agent(flags: list[str], overrides: list[str], inherited) -> int:
    """What ``torchrun <flags> -m orchestrator.worker <overrides>`` runs, with the worker as a function."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    args = parse_args([*flags, "--start-method=fork", "-m", WORKER_MODULE, *overrides])
    if args.master_port is None:  # as torchrun's run() sets it (the static rendezvous' default)
        args.master_port = 29500
    config, _command, _args = config_from_args(args)
    try:
        elastic_launch(config, entrypoint=rank_main)(list(overrides), inherited)
    except ChildFailedError as err:  # the outcome is in the first rank's exit file; torchrun's own code is 1
        log.warning("torchrun's agent: %s", ", ".join(f"rank {rank} exited with {failure.exitcode}"
                                                      for rank, failure in sorted(err.failures.items())))
        return 1
    return 0


def rank_main(overrides: list[str], inherited) -> None:
    """One rank, forked by torchrun's agent: ``python -m orchestrator.worker <overrides>`` in all but the
    interpreter's start. A non-zero code ends the process with it (torchrun reports the rank as failed, as it
    does a fresh rank's); 0 returns, so torchrun's agent receives the rank's result."""
    import setproctitle

    from orchestrator import worker
    from orchestrator.attempt.start_up import inherit
    from orchestrator.exitcodes import exit_without_teardown, shut_down_as_at_exit
    from orchestrator.warm_start import process_title

    setproctitle.setproctitle(process_title(worker_argv(overrides)))
    _default_signals()
    inherit(inherited)
    sys.argv = [worker.__file__, *overrides]
    code = worker.main(overrides)
    if code:
        exit_without_teardown(code)
    shut_down_as_at_exit()


def _default_signals() -> None:
    from orchestrator.exitcodes import PREEMPTION_SIGNALS

    for signum in PREEMPTION_SIGNALS:  # the parent's handlers (forwarding, torchrun's) are not this process's
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
