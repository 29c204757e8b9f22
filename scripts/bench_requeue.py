"""A job whose worker is SIGKILLed after each of its first N checkpoints, its attempts forked from the supervisor
(``requeue.fork_attempts=true``, the default: ``orchestrator.process.warm_start``) against a fresh interpreter per attempt
(``false``), side by side, the two sides alternating (which goes first swapped every round).

    .venv/bin/python scripts/bench_requeue.py                 # 3 rounds, 4 kills each, the default tiny job
    .venv/bin/python scripts/bench_requeue.py --processes 2   # a two-process DDP job: ranks forked from torchrun's
                                                              # agent (orchestrator.process.forked_ranks) or fresh under it

Each round launches ``python -m orchestrator.launch`` as a user does (local storage, checkpoints every second,
MLflow off, one intra-op thread), waits for each new committed checkpoint, SIGKILLs the worker (found by its
command line, as the tests do), and lets the supervisor requeue it until the job completes. It prints the wall time
and the CPU seconds of the whole job (the launcher and every attempt, reaped), each attempt's start to first step
from the ledger, the medians and the ratios forked / fresh.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
JOB = ["train.max_steps=120", "train.logging_steps=5", "data.num_examples=200", "checkpoint.every=1s",
       "preemption.provider=none", "tracking.enabled=false", "requeue.backoff_base_seconds=0.2", "run.name=bench"]


def committed(store: Path) -> list[int]:
    folder = store / "bench" / "checkpoints"
    return sorted(int(p.parent.name.split("-")[0]) for p in folder.glob("*/manifest.json")) if folder.is_dir() else []


def worker_of(proc: subprocess.Popen):
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for kid in kids:
        try:
            if "orchestrator.worker" in " ".join(kid.cmdline()):
                return kid
        except psutil.Error:
            continue
    return None


def one(fork: bool, kills: int, processes: int = 1) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-requeue-"))
    env = dict(os.environ, OMP_NUM_THREADS="1", ORCH_STEP_DELAY_SECONDS="0.1", ORCH_HEARTBEAT_SECONDS="1",
               PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    env.setdefault("ORCH_CACHE_DIR", str(ROOT / ".cache" / "test-models"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with open(work / "job.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.launch", *JOB, f"storage.uri={work / 'runs'}",
                                 f"run.work_dir={work / 'work'}", f"requeue.fork_attempts={str(fork).lower()}",
                                 *distributed(processes)],
                                cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        for _ in range(kills):
            seen = (committed(work / "runs") or [0])[-1]
            while proc.poll() is None and (committed(work / "runs") or [0])[-1] <= seen:
                time.sleep(0.05)
            worker = worker_of(proc)
            if worker is not None:
                worker.send_signal(signal.SIGKILL)
                worker.wait(60)
        code = proc.wait(900)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    ledger = json.loads((work / "runs" / "bench" / "ledger.json").read_text())
    restarts = [a.get("extra", {}).get("restart", {}) for a in ledger["attempts"]]
    shutil.rmtree(work, ignore_errors=True)
    if code != 0:
        raise SystemExit(f"the job exited {code} (fork={fork})")
    return {"wall": wall, "cpu": cpu, "attempts": len(restarts),
            "first_step": [round(r.get("total_s", float("nan")), 2) for r in restarts],
            "forked": [r.get("forked") for r in restarts]}


def distributed(processes: int) -> list[str]:
    """One process (``distributed=none``: attempts forked from the supervisor), or a DDP job of ``processes``
    ranks (the attempt is the ranks' launcher, a fresh interpreter; its ranks are forked from torchrun's agent)."""
    return [] if processes <= 1 else ["distributed=ddp", f"distributed.processes_per_node={processes}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--processes", type=int, default=1, help="training processes (2 or more: DDP under torchrun)")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"forked": [], "fresh": []}
    for round_ in range(args.rounds):
        order = ("forked", "fresh") if round_ % 2 == 0 else ("fresh", "forked")
        for side in order:
            r = one(side == "forked", args.kills, args.processes)
            results[side].append(r)
            print(f"round {round_} {side:<6} {r['wall']:6.1f}s wall {r['cpu']:6.1f}s CPU, {r['attempts']} attempts, "
                  f"start to first step {r['first_step']}, forked {r['forked']}", flush=True)
    med = {side: {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu")} for side, rs in results.items()}
    for side, m in med.items():
        print(f"median {side:<6} {m['wall']:6.1f}s wall {m['cpu']:6.1f}s CPU")
    print(f"\nforked / fresh: {med['forked']['wall'] / med['fresh']['wall']:.3f} wall, "
          f"{med['forked']['cpu'] / med['fresh']['cpu']:.3f} CPU ({args.kills} kills, {args.processes} process(es), "
          f"medians of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
