"""Two nodes against one node at the same global batch: start to first step and steps per second, side by side.

    python scripts/bench_multinode.py [--steps 40] [--batch 8]

Runs two real jobs one after the other (``python -m orchestrator.launch``, local backend, the built-in tiny
model, CPU, gloo, a local storage folder): one node with one process at ``--batch`` x 2 rows per step, and
two nodes (the local world: a store process and one worker per node, each on its own loopback address) with
one process each at ``--batch`` rows, so both train on the same global batch. Start to first step is the
ledger's measured restart split (``extra.restart.total_s``, rank 0's: its first step waits for every node);
steps per second are the Trainer's own ``train_steps_per_second`` (its training loop, the same measure on
both sides). Prints a table, and ``--json`` the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMON = ["preemption.provider=none", "tracking.enabled=false", "checkpoint.every=off", "data.num_examples=400",
          "train.logging_steps=10", "checkpoint.save_final_weights=false"]


def run(name: str, overrides: list[str], root: Path, steps: int) -> dict:
    storage = root / "runs"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "orchestrator.launch", *COMMON, f"train.max_steps={steps}",
           f"storage.uri={storage}", f"run.name={name}", f"run.work_dir={root / 'work'}", *overrides]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    attempt = json.loads((storage / name / "ledger.json").read_text())["attempts"][-1]
    first = float(attempt["extra"]["restart"]["total_s"])
    job_log = root / "work" / name / "job.log"  # the Trainer's own dicts are in the job's log file
    logged = job_log.read_text(errors="replace") if job_log.is_file() else ""
    rates = re.findall(r"'train_steps_per_second': '([0-9.]+)'", done.stdout + done.stderr + logged)
    return {"job": name, "start_to_first_step_s": round(first, 2), "steps_per_s": float(rates[0]) if rates else None,
            "wall_s": round(wall, 1), "nodes": len(attempt.get("nodes") or [None])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=8, help="rows per process per step on two nodes (one node: x2)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-multinode-") as tmp:
        root = Path(tmp)
        rows = [run("one-node", [f"train.per_device_batch_size={2 * args.batch}"], root, args.steps),
                run("two-nodes", [f"train.per_device_batch_size={args.batch}", "distributed=ddp",
                                  "distributed.processes_per_node=1", "distributed.nodes=2", "compute.nodes=2"],
                    root, args.steps)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"global batch {2 * args.batch} rows, {args.steps} steps, tiny model, CPU (gloo)")
    print(f"{'job':<10} {'nodes':>5} {'start to first step':>20} {'steps/s':>8} {'wall':>7}")
    for r in rows:
        print(f"{r['job']:<10} {r['nodes']:>5} {r['start_to_first_step_s']:>19.1f}s {r['steps_per_s'] or '-':>8} "
              f"{r['wall_s']:>6.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
