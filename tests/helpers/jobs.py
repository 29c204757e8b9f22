"""Run real jobs (``python -m orchestrator.launch``) as processes of their own, interrupt them, read their results.

Used by the end-to-end tests: a job is launched with a user's command line, in its own process group, and
interrupted with real signals. It is forked from a warm interpreter that imported the training stack once
(``tests/helpers/zygote.py``: the product's own ``orchestrator.process.warm_start``) in a run with end-to-end tests
(``tests/conftest.py``), else started fresh: with ``fresh=True``, for a test that measures the import, and
everywhere with ``ORCH_TEST_ZYGOTE=0``.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# Small, fast jobs: a few seconds of training, checkpoints every second.
FAST = [
    "train.max_steps=40",
    "train.logging_steps=5",
    "data.num_examples=200",
    "checkpoint.every=1s",
    "preemption.provider=none",
    "tracking.enabled=false",
    "requeue.backoff_base_seconds=0.2",
]


@dataclass
class Storage:
    uri: str
    endpoint_url: str | None = None

    def overrides(self) -> list[str]:
        out = [f"storage.uri={self.uri}"]
        if self.endpoint_url:
            out.append(f"storage.endpoint_url={self.endpoint_url}")
        return out

    def store(self):
        """The store, opened once per test process: tests poll it every 0.1 s, and each new S3 client loads
        botocore's service models again (about a tenth of the whole suite's CPU when every poll opened one)."""
        from orchestrator.storage import open_store

        key = (self.uri, self.endpoint_url)
        if key not in _OPENED:
            _OPENED[key] = open_store(self.uri, endpoint_url=self.endpoint_url)
        return _OPENED[key]


_OPENED: dict = {}


def job_env(tmp_path: Path, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.setdefault("ORCH_CACHE_DIR", str(REPO / ".cache" / "test-models"))
    env["ORCH_HEARTBEAT_SECONDS"] = "1"
    # each step takes at least 0.1 s: with checkpoints every second and interruptions at most
    # 0.6 s after a commit, a job makes ~10 steps of net progress per attempt on any machine
    env.setdefault("ORCH_STEP_DELAY_SECONDS", "0.1")
    # one thread per job: the tiny model gains nothing from two, and two xdist workers share two cores
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    # a job's user code may live in the tests (reward functions named by import path): the repository on the path
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def launch_cmd(overrides: list[str]) -> list[str]:
    return [PYTHON, "-m", "orchestrator.launch", *overrides]


_zygote = None


def zygote():
    """This test process's ``zygote.Client``; None unless ``ORCH_TEST_ZYGOTE=1``."""
    global _zygote
    if os.environ.get("ORCH_TEST_ZYGOTE") != "1":
        return None
    if _zygote is None:
        import atexit
        import tempfile

        from tests.helpers.zygote import Client

        folder = Path(tempfile.mkdtemp(prefix="orch-zygote-"))
        _zygote = Client(folder, job_env(folder))
        atexit.register(_zygote.close)
    return _zygote


def run_cmd(cmd: list[str], cwd: Path, *, env: dict | None = None, timeout: float = 600,
            fresh: bool = False) -> subprocess.CompletedProcess:
    """``cmd`` (``python -m orchestrator.launch ...``, ``python -m orchestrator <command> ...``) as
    ``subprocess.run(..., capture_output=True, text=True)`` runs it: forked from the zygote where it can be."""
    env = env or job_env(cwd)
    warm = None if fresh else zygote()
    if warm is not None:
        out = warm.folder / "outs" / f"{time.time_ns()}-{random.getrandbits(32):08x}"
        out.parent.mkdir(exist_ok=True)
        forked = warm.start(cmd, cwd, env, out.with_suffix(".out"), out.with_suffix(".err"))
        if forked is not None:
            try:
                code = forked.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_group(forked)
                raise
            return subprocess.CompletedProcess(cmd, code, out.with_suffix(".out").read_text(errors="replace"),
                                               out.with_suffix(".err").read_text(errors="replace"))
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def start_cmd(cmd: list[str], cwd: Path, log: Path, *, env: dict | None = None, fresh: bool = False):
    """``cmd`` started in a session of its own, its stdout and stderr appended to ``log``: a ``subprocess.Popen``,
    or a ``zygote.Forked`` with the same ``pid``, ``poll``, ``wait``, ``kill``, ``send_signal`` and ``returncode``."""
    env = env or job_env(cwd)
    warm = None if fresh else zygote()
    if warm is not None:
        forked = warm.start(cmd, cwd, env, log, log)
        if forked is not None:
            return forked
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def run_job(overrides: list[str], tmp_path: Path, *, env: dict | None = None, timeout: float = 600,
            fresh: bool = False) -> subprocess.CompletedProcess:
    return run_cmd(launch_cmd(overrides), tmp_path, env=env, timeout=timeout, fresh=fresh)


def start_job(overrides: list[str], tmp_path: Path, *, env: dict | None = None, log_name: str = "job.log",
              fresh: bool = False):
    """The job's launcher (``start_cmd``), its output in ``tmp_path / log_name``."""
    return start_cmd(launch_cmd(overrides), tmp_path, tmp_path / log_name, env=env, fresh=fresh)


def committed_steps(storage: Storage, run: str) -> list[int]:
    keys = storage.store().list(f"{run}/checkpoints/")
    return sorted(int(k.split("/")[2].split("-")[0]) for k in keys if k.endswith("/manifest.json"))


def worker_of(proc: subprocess.Popen) -> psutil.Process | None:
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    return next((k for k in kids if "orchestrator.worker" in " ".join(_cmdline(k))), None)


def _cmdline(proc: psutil.Process) -> list[str]:
    """A process's command line; [] for one that ended meanwhile or is a zombie not yet reaped (a killed
    attempt's worker whose supervisor has not collected it): neither is the attempt to interrupt."""
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def wait_for_new_checkpoint(storage: Storage, run: str, proc: subprocess.Popen, after: int, timeout: float = 600) -> int:
    """Wait until a checkpoint newer than step ``after`` is committed; returns its step."""
    def newer():
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended (rc={proc.returncode}) before a new checkpoint")
        steps = committed_steps(storage, run)
        return steps[-1] if steps and steps[-1] > after else None

    return wait_for(newer, timeout, f"a checkpoint after step {after}")


def interrupt_worker(proc, storage: Storage, run: str, rng: random.Random, sig: int = signal.SIGKILL) -> int:
    """After the next commit and a random pause, send ``sig`` to the current worker; returns the step seen."""
    seen = committed_steps(storage, run)
    step = wait_for_new_checkpoint(storage, run, proc, seen[-1] if seen else 0)
    time.sleep(rng.uniform(0.0, 0.6))
    worker = worker_of(proc)
    if worker is not None:
        worker.send_signal(sig)
        try:
            worker.wait(60)
        except psutil.TimeoutExpired:
            pass
    return step


def final_digest(storage: Storage, run: str) -> str:
    """SHA-256 over the final weight files (safetensors), from storage."""
    store = storage.store()
    manifest = json.loads(store.get_bytes(f"{run}/final/manifest.json"))
    weights = sorted(f["path"] for f in manifest["files"] if f["path"].endswith(".safetensors"))
    assert weights, f"no safetensors in {run}/final: {manifest['files']}"
    h = hashlib.sha256()
    for path in weights:
        h.update(store.get_bytes(f"{run}/final/{path}"))
    return h.hexdigest()


def ledger(storage: Storage, run: str) -> dict:
    return json.loads(storage.store().get_bytes(f"{run}/ledger.json"))


def log_text(tmp_path: Path, log_name: str = "job.log") -> str:
    return (tmp_path / log_name).read_text(errors="replace")


def with_overrides(base: list[str], *extra: str) -> list[str]:
    """``base`` with each ``key=value`` of ``extra`` replacing the same key (or appended)."""
    keys = {item.partition("=")[0] for item in extra}
    return [item for item in base if item.partition("=")[0] not in keys] + list(extra)


def assert_refused_at_launch(done: subprocess.CompletedProcess, needles: list[str], runs: Path) -> str:
    """A launch refused as a config error: exit 4, no traceback, one ``error:`` line naming each of ``needles``,
    and nothing written under ``runs``. Returns that line."""
    assert done.returncode == 4, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not runs.exists(), "nothing may be written for a refused job"
    return lines[0]


def kill_group(proc: subprocess.Popen) -> int:
    """SIGKILL the job's whole process group (launcher, supervisor, worker): the machine vanished."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.wait(60)


def attempt_classes(storage: Storage, run: str) -> list[str]:
    return [a["exit_class"] for a in ledger(storage, run)["attempts"]]


def status_json(storage: Storage, run: str, tmp_path: Path) -> dict:
    """``python -m orchestrator status <uri>/<run> --json``, as a user runs it; returns the parsed ledger."""
    cmd = [PYTHON, "-m", "orchestrator", "status", f"{storage.uri}/{run}", "--json"]
    if storage.endpoint_url:
        cmd += ["--endpoint-url", storage.endpoint_url]
    done = subprocess.run(cmd, cwd=tmp_path, env=job_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout)


def interrupt_then_finish(overrides: list[str], tmp_path: Path, storage: Storage, run: str, rng: random.Random,
                          signals: list[int], *, env: dict | None = None, timeout: float = 600) -> tuple[int, str, list[int]]:
    """Launch a job, interrupt its worker once per signal (each after a fresh commit), wait for the end.

    Returns (launcher exit code, the job's log, the committed step seen before each interruption).
    """
    proc = start_job(overrides, tmp_path, env=env)
    try:
        seen = [interrupt_worker(proc, storage, run, rng, sig) for sig in signals]
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return rc, log_text(tmp_path), seen
