"""A warm interpreter that end-to-end tests fork their jobs from: ``python -m orchestrator.launch`` without the
interpreter's start and the ~5 CPU-s import of torch, transformers, PEFT, TRL and datasets that every fresh
launch pays (the suite launches a few hundred jobs on two cores).

It is the product's own mechanism (``orchestrator.process.warm_start``: the supervisor forks its attempts, a sweep driver
its trials' launches), applied one level up: the forked child is the launcher in all but the interpreter's start,
with the test's argv (its title in ``ps``), working folder, environment, its own session (a process group the test
can kill), stdout and stderr in the test's log file, default signal dispositions, and the launcher's exit code.
A job whose environment differs from the zygote's in a variable the training stack reads at import (``HF_*``,
``OMP_*``, ...) is launched fresh, as is every job of a test that measures the import itself
(``jobs.start_job(..., fresh=True)``), and every job if the zygote cannot be reached. It is started when a run
with end-to-end tests has collected them (``tests/conftest.py``), and a job launched while it imports waits.

The CLI's commands (``python -m orchestrator eval ...``, a sweep's driver, ...) are forked the same way
(``FORKED_MODULES``). Protocol, one line of JSON each way over a Unix socket: ``{"argv", "cwd", "env", "stdout", "stderr"}`` (files the
child appends to) -> ``{"pid"}`` (0: not forked); the zygote reaps its children and writes each one's exit code
(as ``Popen.returncode``: negative for a signal) to ``exits/<pid>`` in its folder, which ``Forked.poll`` reads.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from orchestrator.tracking.run import MLFLOW_HTTP_ENV_DEFAULTS

# read by the training stack when it is imported: a job that sets them otherwise than the zygote did is launched fresh
IMPORT_TIME_PREFIXES = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "DATASETS", "TOKENIZERS", "TORCH", "PYTORCH", "OMP_",
                        "MKL_", "CUDA", "ACCELERATE", "DS_", "BNB_", "PEFT", "TRL", "PYTHON", "LD_", "MLFLOW")


READY_WAIT_S = 120.0  # the zygote's import: ~6 s on an idle machine
IMPORTED_ENV = "imported-env.json"  # the zygote's import-time environment once it has imported the stack


# set by a library's own import, which the zygote does not import, in a test process that imported it: neither
# changes what a job does here (lm_eval: HF_XET_HIGH_PERFORMANCE, read for hub downloads, and this machine is
# offline; DeepSpeed: PYTORCH_NVML_BASED_CUDA_CHECK, read by CUDA's availability check, and there is no GPU)
SET_BY_IMPORTS = ("HF_XET_HIGH_PERFORMANCE", "PYTORCH_NVML_BASED_CUDA_CHECK")


# what the zygote forks: a launch (a job, a sweep's driver) and the CLI's commands (``eval``, ``report``, ...), each
# run as ``python -m <module>`` would run it (``-m orchestrator`` runs the package's ``__main__``)
FORKED_MODULES = {"orchestrator.launch": "orchestrator.launch", "orchestrator": "orchestrator.__main__",
                  "orchestrator.cli.main": "orchestrator.cli.main"}


def forkable(argv: list[str]) -> bool:
    return argv[:2] == [sys.executable, "-m"] and len(argv) > 2 and argv[2] in FORKED_MODULES


# read when used, not when imported: the MLflow HTTP settings a test process's in-process tracking sets
# (``orchestrator.tracking.run.Tracking.start``: every later job of that process would start fresh), and the
# system metrics' interval (read when the monitor starts)
READ_WHEN_USED = (*MLFLOW_HTTP_ENV_DEFAULTS, "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL")


def import_time_env(env: dict) -> dict:
    return {k: v for k, v in env.items()
            if k.startswith(IMPORT_TIME_PREFIXES) and k not in SET_BY_IMPORTS and k not in READ_WHEN_USED}


class Forked:
    """A job forked by the zygote, as the tests use a ``subprocess.Popen``: ``pid``, ``poll``, ``wait``,
    ``kill``, ``send_signal``, ``returncode``."""

    def __init__(self, pid: int, exit_file: Path):
        self.pid, self.exit_file, self.returncode = pid, exit_file, None

    def poll(self) -> Optional[int]:
        if self.returncode is None and self.exit_file.exists():
            self.returncode = int(self.exit_file.read_text())
            self.exit_file.unlink()
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"job {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Client:
    """This test process's zygote: started once (``launch``), used once it has imported the stack."""

    def __init__(self, folder: Path, env: dict):
        self.folder, self.env = folder, env
        self.socket_path = folder / "zygote.sock"
        self.proc: Optional[subprocess.Popen] = None
        self.imported_env: Optional[dict] = None

    def launch(self) -> None:
        """Start the zygote (its import runs while the session sets up its servers); once only."""
        if self.proc is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.zygote", str(self.socket_path)],
                                         env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=open(self.folder / "zygote.log", "ab"), start_new_session=True)

    def ready(self) -> bool:
        """Whether the zygote answers; while it is still importing, wait for it (a fresh launch would import the
        same stack on the same two cores, at the same time)."""
        self.launch()
        deadline = time.monotonic() + READY_WAIT_S
        while not self.socket_path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return self.proc.poll() is None

    def same_imports(self, env: dict) -> bool:
        """Whether ``env`` agrees with the zygote's on every variable the stack reads at import: the zygote's as
        launched, or as its imports left it (a test process that imported the libraries itself has what they set)."""
        if self.imported_env is None:
            self.imported_env = json.loads((self.folder / IMPORTED_ENV).read_text())
        job, launched = import_time_env(env), import_time_env(self.env)
        return all(job.get(k) in (launched.get(k), self.imported_env.get(k))
                   for k in {*job, *launched, *self.imported_env})

    def start(self, argv: list[str], cwd: Path, env: dict, stdout: Path, stderr: Path) -> Optional[Forked]:
        """The job forked from the zygote, or None (the caller starts it fresh): a different import-time
        environment, no zygote, or no answer."""
        if not self.ready() or not self.same_imports(env):
            return None
        for path in (stdout, stderr):  # there when this returns, as Popen's would be
            open(path, "ab").close()
        request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": str(stdout), "stderr": str(stderr)}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(30)
                conn.connect(str(self.socket_path))
                conn.sendall(json.dumps(request).encode() + b"\n")
                answer = json.loads(conn.makefile().readline())
        except (OSError, ValueError):
            return None
        return Forked(int(answer["pid"]), self.folder / "exits" / str(answer["pid"])) if answer.get("pid") else None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        shutil.rmtree(self.folder, ignore_errors=True)


# ---- the zygote process -------------------------------------------------------------------------------------
def _reap(exits: Path) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        tmp = exits / f"{pid}.tmp"
        tmp.write_text(str(os.waitstatus_to_exitcode(status)))
        os.replace(tmp, exits / str(pid))


def _child(request: dict) -> None:
    code = 1
    try:
        os.setsid()
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), fd)
        os.chdir(request["cwd"])
        from orchestrator.process import warm_start

        argv = request["argv"]
        command = [*argv[:2], FORKED_MODULES[argv[2]], *argv[3:]]
        warm_start.run_child(command, request["env"], warm_start.Inherited(time.time(), 0.0))
    finally:
        os._exit(code)


def serve(socket_path: str) -> None:
    from orchestrator.process import training_stack, warm_start  # noqa: F401 - warm_start imported ahead of the forks
    from orchestrator.app.compose import compose_config

    training_stack.import_stack(compose_config([]))
    import orchestrator.launch  # noqa: F401

    # what the imports set in the environment themselves (HF_XET_*, PYTORCH_NVML_*, ...) is not a job's difference
    imported = Path(socket_path).parent / IMPORTED_ENV
    imported.with_suffix(".tmp").write_text(json.dumps(import_time_env(dict(os.environ))))
    os.replace(imported.with_suffix(".tmp"), imported)

    exits = Path(socket_path).parent / "exits"
    exits.mkdir(exist_ok=True)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes accept() so children are reaped as they end
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = socket_path + ".tmp"
    server.bind(tmp)
    server.listen(16)
    server.settimeout(1.0)
    os.replace(tmp, socket_path)  # ready: clients connect only once everything is imported
    parent = os.getppid()
    while os.getppid() == parent:  # a test process that died without closing it leaves no zygote behind
        _reap(exits)
        try:
            conn, _ = server.accept()
        except (socket.timeout, InterruptedError):
            continue
        with conn:
            conn.settimeout(30)
            try:
                request = json.loads(conn.makefile().readline())
            except (OSError, ValueError):
                continue
            pid = 0
            if threading.active_count() == 1 and forkable(request["argv"]):
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                pid = os.fork()
                if pid == 0:
                    server.close()
                    _child(request)
                (exits / str(pid)).unlink(missing_ok=True)  # a reused pid's code that was never read
            try:
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            except OSError:
                pass


if __name__ == "__main__":
    serve(sys.argv[1])
