"""Attempts forked from a supervisor that imported the training stack once (``requeue.fork_attempts``).

An attempt's worker spends most of its start-up importing torch, transformers, PEFT, TRL and datasets (about 5
CPU-s before its first step on this stack; docs/measured.md), and every requeued attempt paid it again. With
``requeue.fork_attempts=true`` (the default) the local supervisor imports them once, as the worker would for this
config, and starts each attempt with ``os.fork``. The child is ``python -m orchestrator.worker <overrides>`` in all
but the interpreter's start: the same argv (its process title too, so ``ps`` and anything looking for the worker
sees it), environment, signal dispositions and exit codes; it ends with ``os._exit`` and never returns into the
supervisor's code. A local sweep's driver does the same one level up (``Forks(cfg, launchers=True)``): each launch
of a trial is a forked ``python -m orchestrator.launch <overrides>``, run as its ``__main__``.

A multi-process attempt is its ranks' launcher: forked the same way (and a local multi-node world's store and
every node), it forks torchrun's agent, which forks the ranks (``orchestrator.process.forked_ranks``), so the stack
imported here is imported once for every attempt and every rank.

A fork copies the process as it is, so it is used only where that is safe, checked before every attempt;
otherwise the attempt is a fresh interpreter as before, and the log says why:
- no GPU driver in the supervisor: CUDA once initialised is not fork-safe. Importing torch initialises nothing;
  the check (``libcuda`` not mapped, ``torch.cuda.is_initialized()`` false) proves it on the machine itself;
- no Python thread but the main one: a lock another thread holds at the fork stays held in the child. The native
  threads libraries start at import (torch's, jemalloc's background thread under pyarrow) are the ones every
  PyTorch DataLoader worker is forked past; they register their own fork handlers.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any, Iterable, Optional, cast

from orchestrator.attempt.start_up import Inherited
from orchestrator.process import training_stack

log = logging.getLogger(__name__)


LAUNCH_MODULE = "orchestrator.launch"


def is_worker_command(command: list[str]) -> bool:
    """Whether ``command`` is this interpreter's ``python -m orchestrator.worker ...`` (what a fork can stand for)."""
    from orchestrator.process.distributed import WORKER_MODULE

    return command[:3] == [sys.executable, "-m", WORKER_MODULE]


def is_launch_command(command: list[str]) -> bool:
    """Whether ``command`` is this interpreter's ``python -m orchestrator.launch ...`` (a sweep's trial)."""
    return command[:3] == [sys.executable, "-m", LAUNCH_MODULE]


def prepare(
    cfg: Any, *, launchers: bool = False, overrides: Optional[list[str]] = None
) -> tuple[Optional[str], Inherited]:
    """Import what this config's attempts import: (None when attempts can be forked, else why they cannot; the
    start-up spent on it, which the first attempt inherits). ``launchers``: for a sweep driver that forks its
    trials' launchers, whose configs differ from ``cfg`` by the searched keys (a recipe, a quantised base, a
    distributed setting among them): nothing is kept out, and a trial's own supervisor decides on its attempts.
    ``overrides``: the forked children's own, composed here once (``config.compose.prime``)."""
    began, cpu = time.time(), time.process_time()
    nothing = Inherited(began, 0.0)
    if not cfg.requeue.fork_attempts:
        return "requeue.fork_attempts=false", nothing
    if not hasattr(os, "fork"):
        return "this platform has no fork", nothing
    if not launchers:
        training_stack.skip_unused_quantisation_stack(cfg)
        training_stack.skip_unused_deepspeed(cfg)
    training_stack.import_stack(cfg)
    if overrides is not None:
        from orchestrator.config.compose import prime

        prime(overrides)
    spent = Inherited(began, time.process_time() - cpu)
    reason = unsafe_reason()
    if reason is None:
        log.info(
            "training stack imported once (%.1f CPU-s): %s are forked from this %s",
            spent.cpu_s,
            *(("trials' launchers", "sweep driver") if launchers else ("attempts", "supervisor")),
        )
    return reason, spent


class Forks:
    """Whether the next child is forked from this process: the stack is imported before the first (``prepare``),
    safety is checked again before every one, and a refusal is logged once and kept."""

    def __init__(self, cfg: Any, *, launchers: bool = False, overrides: Optional[list[str]] = None):
        self.cfg, self.launchers, self.overrides = cfg, launchers, overrides
        self.imported = False
        self.refused: Optional[str] = None  # why children are not forked (None: decided at the first)
        self.inherited: Optional[Inherited] = None  # the stack's import, until the first forked child takes it

    def ready(self) -> bool:
        if self.imported and self.refused is not None:
            return False
        if self.imported:
            self.refused = unsafe_reason()
        else:
            self.refused, self.inherited = prepare(self.cfg, launchers=self.launchers, overrides=self.overrides)
            self.imported = True
        if self.refused is not None:
            log.info("%s start a fresh interpreter: %s", "trials" if self.launchers else "attempts", self.refused)
        return self.refused is None

    def take_inherited(self) -> Optional[Inherited]:
        inherited, self.inherited = self.inherited, None
        return inherited


def unsafe_reason(
    maps: str | Path = "/proc/self/maps",
    threads: Optional[Iterable[threading.Thread]] = None,
    who: str = "the supervisor",
) -> Optional[str]:
    """Why forking this process (``who``, as the reason names it) now would not be safe; None when it is.
    ``threads``: this process's live threads (``threading.enumerate()`` unless given)."""
    live = threading.enumerate() if threads is None else threads
    others = [t.name for t in live if t is not threading.main_thread()]
    if others:
        return f"{who} runs threads ({', '.join(others)})"
    if gpu_driver_loaded(maps):
        return f"the GPU driver is loaded in {who}"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return f"CUDA is initialised in {who}"
    return None


def gpu_driver_loaded(maps: str | Path = "/proc/self/maps") -> bool:
    """Whether CUDA's driver library is mapped into this process (True when that cannot be read)."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return True
    return any(os.path.basename(line.split()[-1]).startswith("libcuda.so") for line in text.splitlines() if "/" in line)


class ForkedAttempt:
    """A forked attempt, as the supervisor handles a ``subprocess.Popen``: ``pid``, ``poll``, ``wait``,
    ``send_signal``, ``returncode`` (negative: the signal that ended it)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit code; ``timeout``: give up after that many seconds (``subprocess.TimeoutExpired``)."""
        if timeout is not None:
            deadline = time.monotonic() + timeout
            while self.poll() is None:
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
                time.sleep(0.05)
            return cast(int, self.returncode)  # poll() saw it
        while self.returncode is None:
            try:
                _pid, status = os.waitpid(self.pid, 0)
            except ChildProcessError:  # reaped by a poll from a signal handler meanwhile
                if self.returncode is None:
                    raise
                break
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(
    command: list[str],
    env: dict[str, str],
    inherited: Optional[Inherited] = None,
    output: Optional[IO] = None,
    new_session: bool = False,
) -> ForkedAttempt:
    """Fork ``command`` (``python -m orchestrator.worker <overrides>``, a sweep trial's ``python -m
    orchestrator.launch <overrides>``, a multi-node world's ``python -m orchestrator.process.multinode.store ...``) with
    environment ``env``; ``inherited``: the start-up an attempt inherits (the first attempt's import), else its
    start-up begins at the fork; ``output``: an open file the child's stdout and stderr go to (as
    ``Popen(stdout=output, stderr=STDOUT)``), else this process's own; ``new_session``: the child in a session of
    its own that ends with this process (as ``Popen(start_new_session=True, preexec_fn=die_with_parent)``)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # what the supervisor buffered is written once, not once more by the child
    gc.freeze()  # the child's collector leaves the supervisor's objects alone, so their pages stay shared
    inherited = inherited or Inherited(time.time(), 0.0)
    pid = os.fork()
    if pid == 0:
        if new_session:
            from orchestrator.process.distributed import die_with_parent

            os.setsid()
            die_with_parent()
        if output is not None:
            os.dup2(output.fileno(), 1)
            os.dup2(output.fileno(), 2)
        run_child(command, env, inherited)  # never returns
    gc.unfreeze()
    return ForkedAttempt(pid)


def run_child(command: list[str], env: dict[str, str], inherited: Inherited) -> None:
    """The forked child: become the worker (or the trial's launcher), run it, and end the process with its code."""
    code = 1
    try:
        from orchestrator.core import exitcodes

        if is_worker_command(command):
            from orchestrator.attempt.start_up import inherit

            inherit(inherited)
        import setproctitle

        setproctitle.setproctitle(process_title(command))  # first: it finds argv's memory through the unchanged environ
        os.environ.clear()
        os.environ.update(env)
        for signum in exitcodes.PREEMPTION_SIGNALS:  # the parent's forwarding handlers are not the child's
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
        args = command[3:]  # after: python -m <module> (is_worker_command, is_launch_command)
        import runpy

        # as ``python -m <module>`` runs it (the worker's and a launcher's __main__ block end the process)
        sys.argv = [sys.argv[0], *args]  # argv[0] becomes the module's file
        # as in a fresh interpreter, the module is not imported yet when it runs as __main__ (runpy would warn that
        # it "may result in unpredictable behaviour" where the parent imported it, a launcher forked by a sweep)
        sys.modules.pop(command[2], None)
        runpy.run_module(command[2], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as err:
        code = _exit_code(err.code)
    except KeyboardInterrupt:  # as an interpreter ends on an unhandled one: killed by SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - printed as an interpreter would, then exit 1
        traceback.print_exc()
    finally:
        try:
            from orchestrator.core.exitcodes import exit_without_teardown

            exit_without_teardown(code)
        finally:
            os._exit(code if isinstance(code, int) else 1)


def process_title(command: list[str], stat: str | Path = "/proc/self/stat") -> str:
    """``command`` as the forked child's title, padded with spaces to the length of the argv memory it was forked
    with: a shorter title would leave that memory's tail as empty arguments, and the kernel would show the title as
    one argument (``ps`` and psutil then see no ``run.name=...`` among the arguments); filling it makes the kernel
    show the title as one line, which they split on its spaces."""
    title = " ".join(command)
    try:
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        area = int(fields[46]) - int(fields[45])  # arg_end - arg_start: fields 49 and 48 of proc(5)
    except (OSError, IndexError, ValueError):
        return title
    return title.ljust(area)


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
