"""What the orchestrator costs in training speed: the same SFT job, bare TRL against fully orchestrated.

    .venv/bin/python scripts/bench_overhead.py                 # 2 rounds of 80 steps, tiny model, CPU or GPU
    .venv/bin/python scripts/bench_overhead.py --steps 150 --rounds 3 -- model.hidden_size=128

Each round runs both, one after the other in fresh processes, alternating which goes first
(so a drift in the machine's load hits both alike); the verdict is the median of the
per-round ratios, which a single disturbed run (another tenant on a shared machine) cannot
swing the way it swings a mean:
  bare          recipes.sft.build_trainer(...) with no callbacks and no saves, trainer.train();
  orchestrated  python -m orchestrator.launch with every feature on: checkpoints every 10 s to
                local storage, MLflow tracking to a local ``mlflow server`` this script starts on
                127.0.0.1, a budget (never reached), preemption.provider=none.
Both report the Trainer's own ``train_steps_per_second`` (max_steps / train_runtime: set-up,
restore and the final evaluation are outside it; checkpoint stalls and logging are inside).
Prints a table and the ratio orchestrated / bare (target >= 0.98).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
SERVER_START_TIMEOUT_SECONDS = 180
RESULT_PREFIX = "BENCH_RESULT "
TARGET_RATIO = 0.98


def job_overrides(steps: int, extra: list[str]) -> list[str]:
    """The training config both sides share."""
    return ["recipe=sft", f"train.max_steps={steps}", "train.logging_steps=10", "train.eval_at_end=false",
            "data.num_examples=1200", *extra]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_mlflow(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    script = Path(PYTHON).parent / "mlflow"
    head = [str(script)] if script.exists() else [PYTHON, "-m", "mlflow"]
    cmd = head + ["server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                  "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
                  "--artifacts-destination", str(workdir / "artifacts")]
    log = open(workdir / "mlflow_server.log", "ab")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    # the tracking API only: no GenAI job runner (eight huey processes), no usage telemetry
    env.update(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_DISABLE_TELEMETRY="true")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env, start_new_session=True)
    deadline = time.monotonic() + SERVER_START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"mlflow server exited ({proc.returncode}); see {workdir / 'mlflow_server.log'}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                if response.status == 200:
                    return proc, uri
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"mlflow server did not answer within {SERVER_START_TIMEOUT_SECONDS}s")


def bare_child(overrides: list[str]) -> None:
    """In a fresh process: the recipe's trainer, no orchestrator callback, no saves."""
    from orchestrator.launch import compose_config
    from recipes import sft
    from recipes.data import load_datasets

    cfg = compose_config(overrides)
    train_ds, eval_ds = load_datasets(cfg.data, cfg.recipe.name)
    with tempfile.TemporaryDirectory() as out:
        trainer = sft.build_trainer(cfg, train_dataset=train_ds, eval_dataset=eval_ds, output_dir=out, callbacks=[])
        metrics = trainer.train().metrics
    print(RESULT_PREFIX + json.dumps({"steps_per_second": metrics["train_steps_per_second"],
                                      "train_runtime": metrics["train_runtime"]}), flush=True)


def run_bare(overrides: list[str], workdir: Path) -> dict:
    done = subprocess.run([PYTHON, str(Path(__file__).resolve()), "--bare-child", "--", *overrides], cwd=workdir,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    raise SystemExit(f"bare run failed (rc={done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")


def run_orchestrated(overrides: list[str], workdir: Path, uri: str, name: str) -> dict:
    full = overrides + [
        f"run.name={name}", f"storage.uri={workdir / 'runs'}", "checkpoint.every=10s", "preemption.provider=none",
        "tracking.enabled=true", f"tracking.uri={uri}", "tracking.experiment=bench-overhead",
        "budget.max_usd=1000",
    ]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run([PYTHON, "-m", "orchestrator.launch", *full], cwd=workdir, capture_output=True, text=True,
                          env=env)
    if done.returncode != 0:
        raise SystemExit(f"orchestrated run failed (rc={done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    summary = re.search(r"'train_runtime': '?([0-9.eE+-]+)'?.*?'train_steps_per_second': '?([0-9.eE+-]+)'?",
                        done.stdout)
    if not summary:
        raise SystemExit(f"no train_steps_per_second in the orchestrated run's output:\n{done.stdout[-3000:]}")
    commits = len(re.findall(r"checkpoint \S+ committed", done.stdout + done.stderr))
    return {"steps_per_second": float(summary.group(2)), "train_runtime": float(summary.group(1)),
            "checkpoints": commits}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80, help="optimizer steps per run (default 80)")
    parser.add_argument("--rounds", type=int, default=2, help="bare/orchestrated pairs (default 2)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="pairs run first and left out (caches, the MLflow server's own start-up; default 1)")
    parser.add_argument("--bare-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for both sides (after --)")
    args = parser.parse_args(argv)
    if args.bare_child:
        bare_child(args.overrides)
        return 0

    overrides = job_overrides(args.steps, args.overrides)
    workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    server, uri = start_mlflow(workdir)
    rows = []
    try:
        print(f"mlflow server at {uri}; {args.rounds} round(s) of {args.steps} steps; work dir {workdir}", flush=True)
        for i in range(1 - args.warmup, args.rounds + 1):
            # alternate the order (bare first in odd rounds, orchestrated first in even ones) so a
            # drift in the machine's load over a round does not favour one side
            order = ("bare", "orchestrated") if i % 2 else ("orchestrated", "bare")
            pair = {}
            for kind in order:
                if kind == "bare":
                    pair[kind] = run_bare(overrides, workdir)
                else:
                    pair[kind] = run_orchestrated(overrides, workdir, uri, f"bench-{int(time.time())}-{i}")
                extra = f" ({pair[kind]['checkpoints']} checkpoints)" if kind == "orchestrated" else ""
                print(f"round {i}{' (warm-up)' if i < 1 else ''} {kind + ':':<14}"
                      f"{pair[kind]['steps_per_second']:.3f} steps/s{extra}", flush=True)
            if i >= 1:
                rows += [("bare", i, pair["bare"]), ("orchestrated", i, pair["orchestrated"])]
    finally:
        os.killpg(server.pid, 15)
        server.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"\n{'kind':<13} {'round':>5} {'steps/s':>9} {'train_runtime_s':>16} {'checkpoints':>11}")
    for kind, i, r in rows:
        print(f"{kind:<13} {i:>5} {r['steps_per_second']:>9.3f} {r['train_runtime']:>16.2f} "
              f"{r.get('checkpoints', '-')!s:>11}")
    bare_mean = statistics.mean(r["steps_per_second"] for k, _, r in rows if k == "bare")
    orch_mean = statistics.mean(r["steps_per_second"] for k, _, r in rows if k == "orchestrated")
    ratio = orch_mean / bare_mean
    per_round = [o["steps_per_second"] / b["steps_per_second"]
                 for (_, _, b), (_, _, o) in zip(rows[0::2], rows[1::2])]
    print(f"\nmean steps/s: bare {bare_mean:.3f}, orchestrated {orch_mean:.3f}; "
          f"ratio of means {ratio:.3f}")
    median = statistics.median(per_round)
    print(f"per-round ratios orchestrated/bare: {' / '.join(f'{r:.3f}' for r in per_round)}; "
          f"median {median:.3f} (target >= {TARGET_RATIO}: {'met' if median >= TARGET_RATIO else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
