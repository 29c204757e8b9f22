"""A node's ranks under torchrun, forked from a launcher that imported the training stack once.

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
import inspect
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

from orchestrator.process.distributed import FORWARDED_SIGNALS, WORKER_MODULE, die_with_parent, worker_argv

log = logging.getLogger(__name__)

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def launch_ranks(cfg, overrides: list[str], work_root: Path, main: Callable[[list[str]], int]) -> int:
    """Run one node's ranks under torchrun; return rank 0's exit code (a node of a multi-node world:
    ``orchestrator.process.multinode.node``). ``main``: the worker's, which a forked rank runs."""
    import psutil

    token = uuid.uuid4().hex[:12]
    exit_file = work_root / f"exit-{token}"
    work_root.mkdir(parents=True, exist_ok=True)
    flags = [
        f"--nproc_per_node={cfg.distributed.processes_per_node}",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
    ]
    env = dict(os.environ, ORCH_ATTEMPT_TOKEN=token, ORCH_EXIT_FILE=str(exit_file))
    # torchrun in its own session: a signal to our process group must reach the ranks
    # (which save and exit 75), not torchrun (which would kill them after its own timeout)
    child = start(cfg, flags, overrides, env, main)

    def forward(signum, _frame):
        for proc in psutil.Process(child.pid).children(recursive=True):
            if WORKER_MODULE in " ".join(proc.cmdline()):
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cfg: Any, flags: list[str], overrides: list[str], env: dict[str, str], main: Callable[[list[str]], int]):
    """torchrun with ``flags`` for the ranks of ``python -m orchestrator.worker <overrides>``, in a session of its
    own with environment ``env``: a forked agent whose ranks are forked and run the worker's ``main``
    (``warm_start.ForkedAttempt``), else the ``torchrun`` command (``subprocess.Popen``). Either has ``pid``,
    ``poll``, ``wait`` and ``send_signal``."""
    began, spent = _launcher_start_up()
    reason = refusal(cfg)
    if reason is not None:
        log.info("ranks start a fresh interpreter each under torchrun: %s", reason)
        return subprocess.Popen(
            [*TORCHRUN, *flags, *worker_argv(overrides, module_only=True)],
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    from orchestrator.attempt.start_up import Inherited
    from orchestrator.config.compose import prime
    from orchestrator.process.warm_start import ForkedAttempt

    prime(overrides)  # each rank composes these again: composed once here, before the fork

    inherited = Inherited(began, spent + time.process_time(), source="torchrun's agent")
    log.info("training stack imported once on this node: its ranks are forked from torchrun's agent")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    gc.freeze()  # the ranks share the launcher's imported pages
    pid = os.fork()
    if pid == 0:
        _run_agent(flags, [main, list(overrides), inherited], env)  # never returns
    gc.unfreeze()
    return ForkedAttempt(pid)


def refusal(cfg: Any) -> Optional[str]:
    """None once this process imported what the ranks import and may fork their agent; else why it may not."""
    from orchestrator.process import training_stack, warm_start

    if not cfg.requeue.fork_attempts:
        return "requeue.fork_attempts=false"
    if not hasattr(os, "fork"):
        return "this platform has no fork"
    training_stack.import_stack(cfg)
    return warm_start.unsafe_reason(who="the ranks' launcher")


def _launcher_start_up() -> tuple[float, float]:
    """When this launcher's start-up began (its process start) and the CPU seconds spent on it before this process
    started: what it inherited where it was forked from its supervisor (``orchestrator.process.warm_start``), else 0."""
    import psutil

    from orchestrator.attempt.start_up import inherited

    parent = inherited()
    return (parent.started_at, parent.cpu_s) if parent else (float(psutil.Process().create_time()), 0.0)


def _run_agent(flags: list[str], rank_args: list, env: dict[str, str]) -> None:
    """The forked child: torchrun's agent in a session of its own; ends the process with torchrun's code."""
    code = 1
    try:
        os.setsid()
        die_with_parent()
        os.environ.clear()
        os.environ.update(env)
        _default_signals()
        code = _agent(flags, rank_args)
    except BaseException:  # noqa: BLE001 - printed as torchrun would, then exit 1
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _agent(flags: list[str], rank_args: list) -> int:
    """What ``torchrun <flags> -m orchestrator.worker <overrides>`` runs, with the worker as a function:
    ``rank_main(*rank_args)`` in each rank."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    cheap_rendezvous_event_names()
    args = parse_args([*flags, "--start-method=fork", "-m", WORKER_MODULE, *rank_args[1]])
    if args.master_port is None:  # as torchrun's run() sets it (the static rendezvous' default)
        args.master_port = 29500
    config, _command, _args = config_from_args(args)
    try:
        elastic_launch(config, entrypoint=rank_main)(*rank_args)
    except ChildFailedError as err:  # the outcome is in the first rank's exit file; torchrun's own code is 1
        log.warning(
            "torchrun's agent: %s",
            ", ".join(f"rank {rank} exited with {failure.exitcode}" for rank, failure in sorted(err.failures.items())),
        )
        return 1
    return 0


def cheap_rendezvous_event_names() -> None:
    """torch's rendezvous names each event it logs (every step of a rendezvous and every keep-alive) by its caller,
    read with ``inspect.stack()``, twice: that reads every frame's source and, for a frame with no file of its own
    (``python -m``'s runpy frames), looks through every loaded module. In an agent forked with the training stack
    imported (~5,700 modules) that is ~95 CPU-ms per event, the largest CPU cost of a forked agent. The same name,
    read from the frame itself (``sys._getframe``, the frame ``inspect.stack()[depth]`` describes)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    def get_method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:  # the stack is not that deep, as torch's own says
            return "no_method_name"

    dynamic_rendezvous.get_method_name = get_method_name


def rank_main(main: Callable[[list[str]], int], overrides: list[str], inherited) -> None:
    """One rank, forked by torchrun's agent: ``python -m orchestrator.worker <overrides>`` in all but the
    interpreter's start. A non-zero code ends the process with it (torchrun reports the rank as failed, as it
    does a fresh rank's); 0 returns, so torchrun's agent receives the rank's result."""
    import setproctitle

    from orchestrator.attempt.start_up import inherit
    from orchestrator.core.exitcodes import exit_without_teardown, shut_down_as_at_exit
    from orchestrator.process.warm_start import process_title

    setproctitle.setproctitle(process_title(worker_argv(overrides)))
    _default_signals()
    inherit(inherited)
    sys.argv = [inspect.getfile(main), *overrides]
    code = main(overrides)
    if code:
        exit_without_teardown(code)
    shut_down_as_at_exit()


def _default_signals() -> None:
    from orchestrator.core.exitcodes import PREEMPTION_SIGNALS

    for signum in PREEMPTION_SIGNALS:  # the parent's handlers (forwarding, torchrun's) are not this process's
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
