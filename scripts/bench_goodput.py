"""Replay a spot trace's lifetimes against the real orchestrator and compare its goodput with the simulator's.

    python scripts/bench_goodput.py data/spot-traces/availability/1-node/aws-02-15-2023/us-east-1d_v100_1.json

One real job (tiny model, ``python -m orchestrator.launch``, local backend, a real moto S3 server) is run, time
compressed: the trace's lifetimes, taken in order from ``--start-hours`` into the trace, are divided by
``--compress`` and each attempt's worker is killed that many seconds after it was started (SIGKILL, or SIGTERM
for the ``--notice-share`` of preemptions, the same ones the simulator picks), and the supervisor requeues it
until the job completes. Waits for capacity are skipped: they cost nothing.

Measured goodput = useful steps x the uninterrupted seconds per step / the paid seconds. Paid: each worker's
life, spawn to exit, less the last one's final save and close (an uninterrupted run pays those too). The
seconds per step are measured in the same run, between consecutive checkpoints of one attempt (so a machine
slower today slows both sides alike).

Predicted goodput = ``orchestrator.planning.simulate`` on the same lifetimes, the same interval and notice share, each
attempt's measured restart (spawn to first step; an attempt killed before its first step gets one longer than
its lifetime) and the mean measured checkpoint stall. The two differ by what the simulator leaves out: where
in a checkpoint cycle each kill lands, commits finishing after the stall, the emergency save's own time.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.planning.simulate import Job, simulate_window  # noqa: E402
from orchestrator.planning.spot_traces import Trace, load_trace  # noqa: E402

PY = sys.executable
FIRST_STEP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*metered start-up")
STALL = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*checkpoint save at step (\d+) stalled training "
                   r"for ([0-9.]+)s")
RUNTIME = re.compile(r"'train_runtime': '([0-9.]+)'")
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _stamp(text: str) -> float:
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def start_moto(workdir: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(PY).parent / "moto_server"
    cmd = [str(exe)] if exe.exists() else [PY, "-m", "moto.server"]
    proc = subprocess.Popen(cmd + ["-H", "127.0.0.1", "-p", str(port)], stdout=open(workdir / "moto.log", "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            time.sleep(0.1)
    import boto3

    boto3.client("s3", endpoint_url=url, region_name="us-east-1", **{
        "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}).create_bucket(Bucket="bench")
    return proc, url


def job_overrides(args, endpoint: str, run: str, every: str) -> list[str]:
    return [f"train.max_steps={args.steps}", "train.logging_steps=50", "train.eval_at_end=false",
            "data.num_examples=400", f"checkpoint.every={every}", "preemption.provider=none", "tracking.enabled=false",
            "requeue.max_preemptions=1000", "requeue.max_failures=1000", "requeue.crash_loop_threshold=1000",
            "requeue.backoff_base_seconds=0", "storage.uri=s3://bench/runs", f"storage.endpoint_url={endpoint}",
            f"run.name={run}", "run.work_dir=work"]


def env() -> dict:
    e = dict(os.environ, **CREDS)
    e.setdefault("ORCH_CACHE_DIR", str(REPO / ".cache" / "test-models"))
    e.update(ORCH_STEP_DELAY_SECONDS=str(ARGS.step_delay), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
             HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return e


def find_worker(proc: subprocess.Popen, exclude: set[int]) -> psutil.Process | None:
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for k in kids:
        try:
            if k.pid not in exclude and "orchestrator.worker" in " ".join(k.cmdline()) and k.status() != "zombie":
                return k
        except psutil.Error:
            continue
    return None


def lifetimes_from(trace_path: Path, start_hours: float) -> list[float]:
    trace = load_trace(trace_path)
    start = start_hours * 3600 % trace.period
    out = []
    for s, e in zip(trace.starts, trace.ends):
        if e > start:
            out.append(e - max(s, start))
    for s, e in zip(trace.starts, trace.ends):  # one more cycle, in case the job needs it
        out.append(e - s)
    return out


def replay(args, endpoint: str, workdir: Path, lifetimes: list[float]) -> dict:
    log = workdir / "replay.log"
    every = f"{args.every:g}s"
    proc = subprocess.Popen([PY, "-m", "orchestrator.launch", *job_overrides(args, endpoint, "replay", every)],
                            cwd=workdir, env=env(), stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    seen: set[int] = set()
    paid, births, kills, noticed_n = [], [], 0, 0
    try:
        for i, life in enumerate(lifetimes):
            worker = None
            while worker is None and proc.poll() is None:
                worker = find_worker(proc, seen)
                time.sleep(0.01)
            if worker is None:
                break
            seen.add(worker.pid)
            born = worker.create_time()
            births.append(born)
            kill_at = born + life / args.compress
            while time.time() < kill_at and worker.is_running() and worker.status() != "zombie":
                time.sleep(0.01)
            if worker.is_running() and worker.status() != "zombie":
                noticed = math.floor((kills + 1) * args.notice_share) > math.floor(kills * args.notice_share)
                kills += 1
                noticed_n += noticed
                worker.send_signal(signal.SIGTERM if noticed else signal.SIGKILL)
            try:
                worker.wait(120)
            except psutil.TimeoutExpired:
                worker.kill()
            paid.append(time.time() - born)
            if proc.poll() is not None:
                break
        rc = proc.wait(300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    job_log = workdir / "work" / "replay" / "job.log"  # the Trainer's dicts and every checkpoint line
    text = log.read_text() + (job_log.read_text(errors="replace") if job_log.is_file() else "")
    if rc != 0:
        sys.exit(f"replay ended with exit code {rc}; see {log}")
    firsts = [_stamp(m.group(1)) for line in text.splitlines() if (m := FIRST_STEP.match(line))]
    stalls = [(_stamp(m.group(1)), int(m.group(2)), float(m.group(3))) for line in text.splitlines()
              if (m := STALL.match(line))]
    return {"paid": paid, "births": births, "kills": kills, "noticed": noticed_n, "first_steps": firsts,
            "stalls": stalls, "runtime": float(RUNTIME.findall(text)[-1]), "log": str(log)}


def predict(args, lifetimes: list[float], step_s: float, restarts: list[float], ckpt_s: float):
    gap, starts, ends, t = 1.0, [], [], 0.0
    for life in lifetimes:
        starts.append(t)
        ends.append(t + life / args.compress)
        t += life / args.compress + gap
    trace = Trace("replay", gap, t, tuple(starts), tuple(ends))
    job = Job(work_seconds=args.steps * step_s, restart_seconds=statistics.median(restarts),
              restart_schedule=tuple(restarts), checkpoint_cost_seconds=ckpt_s, every=float(args.every),
              notice_share=args.notice_share, max_preemptions=10_000, max_failures=10_000)
    return simulate_window(job, trace, 0.0, "spot")  # an Outcome


def main() -> int:
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--start-hours", type=float, default=0.0, help="where in the trace the job starts")
    p.add_argument("--compress", type=float, default=60.0, help="trace seconds per real second")
    p.add_argument("--steps", type=int, default=400, help="optimizer steps of the job")
    p.add_argument("--every", type=float, default=4.0, help="checkpoint.every, real seconds")
    p.add_argument("--notice-share", type=float, default=0.5, help="share of preemptions sent SIGTERM (noticed)")
    p.add_argument("--step-delay", type=float, default=0.1, help="ORCH_STEP_DELAY_SECONDS: a floor under each step")
    args = ARGS = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-goodput-"))
    moto, endpoint = start_moto(workdir)
    try:
        began = time.time()
        lifetimes = lifetimes_from(args.trace, args.start_hours)
        got = replay(args, endpoint, workdir, lifetimes)
    finally:
        os.killpg(moto.pid, signal.SIGTERM)
    attempt = _attempt_of(got["births"])
    restarts = _restarts(got, lifetimes, args.compress, attempt)
    step_s = _seconds_per_step(got["stalls"], attempt)
    ckpt_s = statistics.fmean(x for _, _, x in got["stalls"])
    tail = max(0.0, got["births"][-1] + got["paid"][-1] - _training_end(got, attempt, step_s, args.steps))
    paid = sum(got["paid"]) - tail
    measured = args.steps * step_s / paid
    sim = predict(args, lifetimes, step_s, restarts, ckpt_s)
    out = {"trace": str(args.trace), "start_hours": args.start_hours, "compress": args.compress,
           "steps": args.steps, "every_s": args.every, "notice_share": args.notice_share,
           "attempts": len(got["paid"]), "kills": got["kills"], "noticed": got["noticed"],
           "seconds_per_step": round(step_s, 4), "restarts_s": [round(r, 1) for r in restarts[:len(got["paid"])]],
           "checkpoint_cost_s": round(ckpt_s, 3), "paid_s": round(paid, 1), "measured_goodput": round(measured, 3),
           "simulated_goodput": round(sim.goodput, 3), "simulated_attempts": sim.preemptions + 1,
           "difference_points": round(100 * (measured - sim.goodput), 1), "wall_s": round(time.time() - began, 1)}
    print(json.dumps(out))
    return 0


def _training_end(got: dict, attempt, step_s: float, steps: int) -> float:
    """When the last attempt's last step ended: its last checkpoint's stamp plus the steps after it."""
    last = len(got["births"]) - 1
    mine = [(t, step) for t, step, _ in got["stalls"] if attempt(t) == last]
    if mine:
        t, step = mine[-1]
        return t + (steps - step) * step_s
    return got["first_steps"][-1] + got["runtime"]


def _attempt_of(births: list[float]):
    def which(t: float) -> int:
        return max(0, sum(1 for b in births if b <= t) - 1)
    return which


def _restarts(got: dict, lifetimes: list[float], compress: float, attempt) -> list[float]:
    """Per attempt: spawn to first step; one that never stepped gets more than its lifetime (it was killed while
    starting). Later attempts, never run, get the median."""
    firsts = {attempt(f): f for f in got["first_steps"]}
    out = [firsts[i] - born if i in firsts else lifetimes[i] / compress + 1.0 for i, born in enumerate(got["births"])]
    seen = [firsts[i] - b for i, b in enumerate(got["births"]) if i in firsts]
    return out + [statistics.median(seen)] * len(lifetimes)


def _seconds_per_step(stalls: list[tuple[float, int, float]], attempt) -> float:
    """Training seconds per step between consecutive checkpoints of one attempt (their stalls left out)."""
    seconds = steps = 0.0
    for (t0, s0, _), (t1, s1, stall) in zip(stalls, stalls[1:]):
        if attempt(t0) == attempt(t1) and s1 > s0:
            seconds += t1 - t0 - stall
            steps += s1 - s0
    return seconds / steps


if __name__ == "__main__":
    sys.exit(main())
