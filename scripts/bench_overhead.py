"""What the orchestrator costs in training speed: the same SFT job, bare TRL against fully orchestrated.

    .venv/bin/python scripts/bench_overhead.py                 # 4 rounds of 1200 steps, tiny model, CPU
    .venv/bin/python scripts/bench_overhead.py --steps 600 --rounds 2 -- model.hidden_size=128

The two sides run at the same time, each pinned to a core of its own and the two swapping
cores every second, so whatever else the machine is doing (these machines are shared, and
another tenant may load one core more than the other) hits both alike.
  bare          recipes.<recipe>.build_trainer(...) with no callbacks and no saves, trainer.train();
  orchestrated  python -m orchestrator.launch with every feature on: checkpoints every 10 s to
                local storage, MLflow tracking (with MLflow's system metrics) to a local ``mlflow server``
                this script starts on 127.0.0.1 (pinned to the orchestrated side's core: its cost is the
                orchestrator's),
                a budget (never reached), preemption.provider=none.
Training uses one torch thread on each side (as a GPU job's Python process uses one core).
The bare side builds its trainer and waits; both start training when the orchestrated job
logs its first step. Both report the Trainer's own ``train_steps_per_second`` (max_steps /
train_runtime: set-up, restore and the final evaluation are outside it; checkpoint stalls
and logging are inside). Prints a table, the per-round ratios orchestrated / bare and their
median (target >= 0.99), and the CPU seconds the MLflow server used from the start of training
until both sides ended (the orchestrated job's closing requests included).
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
TARGET_RATIO = 0.99  # issue 19
SWAP_SECONDS = 1.0


def job_overrides(steps: int, extra: list[str]) -> list[str]:
    """The training config both sides share."""
    recipe = [] if any(o.startswith("recipe=") for o in extra) else ["recipe=sft"]  # scripts/bench_grpo.py: grpo
    return [*recipe, f"train.max_steps={steps}", "train.logging_steps=10", "train.eval_at_end=false",
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


def bare_child(overrides: list[str], go_file: str | None = None) -> None:
    """In a fresh process: the recipe's trainer, no orchestrator callback, no saves."""
    from recipes import recipe_for

    from orchestrator.app.compose import compose_config
    from recipes.data import load_datasets

    cfg = compose_config(overrides)
    recipe = recipe_for(cfg.recipe.name)
    train_ds, eval_ds = load_datasets(cfg.data, cfg.recipe.name)
    with tempfile.TemporaryDirectory() as out:
        trainer = recipe.build_trainer(cfg, train_dataset=train_ds, eval_dataset=eval_ds, output_dir=out, callbacks=[])
        while go_file and not os.path.exists(go_file):
            time.sleep(0.05)
        metrics = trainer.train().metrics
    print(RESULT_PREFIX + json.dumps({"steps_per_second": metrics["train_steps_per_second"],
                                      "train_runtime": metrics["train_runtime"]}), flush=True)


def pin(core: int):
    """A preexec_fn: the child (and every thread and process it starts) runs on ``core`` only."""
    return lambda: os.sched_setaffinity(0, {core})


def pin_tree(pid: int, core: int) -> None:
    """Move a running process tree, every thread of it, onto ``core``."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return  # it ended meanwhile
    for proc in procs:
        try:
            threads = proc.threads()
        except psutil.Error:
            continue
        for thread in threads:
            try:
                os.sched_setaffinity(thread.id, {core})
            except OSError:
                pass  # the thread ended meanwhile


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children so far."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        for proc in (root, *root.children(recursive=True)):
            times = proc.cpu_times()
            total += times.user + times.system
    except psutil.Error:
        pass
    return total


def one_thread_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    return env


def run_pair(overrides: list[str], workdir: Path, uri: str, name: str, orch_core: int, bare_core: int,
             server_pid: int) -> tuple[dict, dict]:
    """Run both sides at once on their own cores; (bare, orchestrated) results."""
    pin_tree(server_pid, orch_core)
    go = workdir / f"go-{name}"
    orch_log = workdir / f"{name}.log"
    full = overrides + [
        f"run.name={name}", f"storage.uri={workdir / 'runs'}", f"run.work_dir={workdir / 'work'}",
        "checkpoint.every=10s", "preemption.provider=none",
        "tracking.enabled=true", f"tracking.uri={uri}", "tracking.experiment=bench-overhead",
        "tracking.log_system_metrics=true", "budget.max_usd=1000",
    ]
    env = one_thread_env()
    bare_log = workdir / f"{name}-bare.log"
    with open(orch_log, "wb") as out:
        orch = subprocess.Popen([PYTHON, "-m", "orchestrator.launch", *full], cwd=workdir, stdout=out,
                                stderr=subprocess.STDOUT, env=env, preexec_fn=pin(orch_core))
    with open(bare_log, "wb") as out:
        bare = subprocess.Popen([PYTHON, str(Path(__file__).resolve()), "--bare-child", "--go-file", str(go), "--",
                                 *overrides], cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=pin(bare_core))
    try:
        while "metered start-up" not in orch_log.read_text(errors="replace"):
            if orch.poll() is not None:
                raise SystemExit(f"orchestrated run failed (rc={orch.returncode}):\n"
                                 f"{orch_log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.05)
        go.touch()
        server_cpu_before = tree_cpu_seconds(server_pid)
        # swap the two sides' cores every SWAP_SECONDS, so that neither trains longer on the core that
        # another tenant happens to load; the orchestrated side's server moves with it
        swaps = 0
        while bare.poll() is None or orch.poll() is None:
            time.sleep(SWAP_SECONDS)
            swaps += 1
            here, there = (orch_core, bare_core) if swaps % 2 == 0 else (bare_core, orch_core)
            for pid, core in ((orch.pid, here), (server_pid, here), (bare.pid, there)):
                pin_tree(pid, core)
        server_cpu = tree_cpu_seconds(server_pid) - server_cpu_before
    finally:
        for proc in (orch, bare):
            if proc.poll() is None:
                proc.kill()
    bare_out = bare_log.read_text(errors="replace")
    text = orch_log.read_text(errors="replace")
    if orch.returncode != 0:
        raise SystemExit(f"orchestrated run failed (rc={orch.returncode}):\n{text[-3000:]}")
    job_log = workdir / "work" / name / "job.log"  # the Trainer's dicts and every checkpoint line (not the console)
    text = job_log.read_text(errors="replace") if job_log.is_file() else text
    summary = re.search(r"'train_runtime': '?([0-9.eE+-]+)'?.*?'train_steps_per_second': '?([0-9.eE+-]+)'?", text)
    if not summary:
        raise SystemExit(f"no train_steps_per_second in the orchestrated run's output:\n{text[-3000:]}")
    orch_result = {"steps_per_second": float(summary.group(2)), "train_runtime": float(summary.group(1)),
                   "checkpoints": len(re.findall(r"checkpoint \S+ committed", text)), "core": orch_core,
                   "server_cpu_s": server_cpu}
    for line in bare_out.splitlines():
        if line.startswith(RESULT_PREFIX):
            return dict(json.loads(line[len(RESULT_PREFIX):]), core=bare_core), orch_result
    raise SystemExit(f"bare run failed (rc={bare.returncode}):\n{bare_out[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1200, help="optimizer steps per run (default 1200)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of bare and orchestrated side by side (default 4)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="pairs run first and left out (caches, the MLflow server's own start-up; default 1)")
    parser.add_argument("--bare-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--go-file", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for both sides (after --)")
    args = parser.parse_args(argv)
    if args.bare_child:
        bare_child(args.overrides, args.go_file)
        return 0

    overrides = job_overrides(args.steps, args.overrides)
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        raise SystemExit("this benchmark runs both sides at once on a core each: it needs 2 cores")
    workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    server, uri = start_mlflow(workdir)
    rows = []
    try:
        print(f"mlflow server at {uri}; {args.rounds} round(s) of {args.steps} steps; work dir {workdir}", flush=True)
        for i in range(1 - args.warmup, args.rounds + 1):
            orch_core, bare_core = cores if i % 2 else cores[::-1]  # swap the cores every round
            bare, orch = run_pair(overrides, workdir, uri, f"bench-{int(time.time())}-{i}", orch_core, bare_core,
                                  server.pid)
            tag = f"round {i}{' (warm-up)' if i < 1 else ''}"
            print(f"{tag}: bare {bare['steps_per_second']:.3f} steps/s (starts on core {bare_core}), orchestrated "
                  f"{orch['steps_per_second']:.3f} steps/s (starts on core {orch_core}, {orch['checkpoints']} checkpoints, "
                  f"MLflow server {orch['server_cpu_s']:.2f} CPU-s): "
                  f"{orch['steps_per_second'] / bare['steps_per_second']:.3f}", flush=True)
            if i >= 1:
                rows += [("bare", i, bare), ("orchestrated", i, orch)]
    finally:
        os.killpg(server.pid, 15)
        server.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"\n{'kind':<13} {'round':>5} {'start':>5} {'steps/s':>9} {'train_runtime_s':>16} {'checkpoints':>11} "
          f"{'server_cpu_s':>12}")
    for kind, i, r in rows:
        server = f"{r['server_cpu_s']:.2f}" if "server_cpu_s" in r else "-"
        print(f"{kind:<13} {i:>5} {r['core']:>5} {r['steps_per_second']:>9.3f} {r['train_runtime']:>16.2f} "
              f"{r.get('checkpoints', '-')!s:>11} {server:>12}")
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
