"""An ASHA sweep against a batch-synchronous sweep of the same trials, side by side, on this machine.

    .venv/bin/python scripts/bench_sweep.py                          # 6 trials, 2 at once, rungs at 4 and 12 steps
    .venv/bin/python scripts/bench_sweep.py --trials 8 --parallel 4 -- data.num_examples=400

1. ASHA: ``python -m orchestrator.launch sweep=asha ...`` (the driver: asynchronous promotion, paused trials hold
   no worker). Its trials' parameters are then taken as they were sampled.
2. Batch-synchronous, Hydra's basic launcher order: the same trials, ``--parallel`` at a time, each
   ``python -m orchestrator.launch`` to ``train.max_steps`` (no pruning: Hydra has no channel for it), and every
   trial of a batch must end before the next batch starts.

Both run real jobs (the tiny model, CPU) with ``compute.price_per_hour=1`` so dollars are visible. Per side it
prints: wall seconds; the idle share (slot-seconds with no trial process / ``parallel`` x wall); the dollars spent
(every attempt's cost in the trials' ledgers); the best trial (lowest ``eval_loss`` at ``max_steps``) and the cost
to reach it (dollars spent by the moment its final evaluation was known: attempts before, prorated across it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMON = ["train.logging_steps=4", "data.num_examples=160", "checkpoint.every=off", "checkpoint.every_steps=4",
          "preemption.provider=none", "tracking.enabled=false", "train.eval_at_end=false",
          "compute.price_per_hour=1", "recipe.eval_metric=none"]
SPACE = ["train.learning_rate=tag(log, interval(1e-4,3e-2))", "recipe.lora_r=choice(4,8,16)"]


def env() -> dict:
    e = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    e.setdefault("ORCH_CACHE_DIR", str(REPO / ".cache" / "test-models"))
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), e.get("PYTHONPATH", "")) if p)
    return e


def ledger(runs: Path, name: str) -> dict:
    return json.loads((runs / name / "ledger.json").read_text())


def spent_by(runs: Path, names: list[str], moment: float) -> float:
    """Dollars the trials' attempts had spent by ``moment`` (an attempt running across it: prorated)."""
    total = 0.0
    for name in names:
        for a in ledger(runs, name).get("attempts", []):
            start, end, cost = a["started_at"], a.get("ended_at") or a["last_seen"], float(a.get("cost_usd") or 0)
            if end <= moment:
                total += cost
            elif start < moment:
                total += cost * (moment - start) / max(end - start, 1e-9)
    return total


def final_loss(runs: Path, name: str, max_steps: int) -> tuple[float, float] | None:
    """(eval_loss at max_steps, when its attempt ended) or None when the trial never got there."""
    led = ledger(runs, name)
    value = ((led.get("quality") or {}).get("evals") or {}).get(str(max_steps), {}).get("eval_loss")
    return None if value is None else (float(value), float(led["attempts"][-1]["ended_at"]))


def summary(runs: Path, names: list[str], max_steps: int, wall: float, idle: float) -> dict:
    finals = {n: final_loss(runs, n, max_steps) for n in names}
    best = min((n for n in names if finals[n]), key=lambda n: finals[n][0])
    return dict(wall_s=wall, idle_share=idle, spent_usd=spent_by(runs, names, float("inf")),
                best=best.rsplit("-", 1)[1], best_eval_loss=finals[best][0], usd_to_best=spent_by(runs, names, finals[best][1]),
                full_trials=sum(1 for f in finals.values() if f))


def run_asha(root: Path, args, extra: list[str]) -> tuple[dict, list[dict]]:
    runs = root / "asha-runs"
    cmd = [sys.executable, "-m", "orchestrator.launch", "sweep=asha", "sweep.name=bench", f"sweep.n_trials={args.trials}",
           f"sweep.max_parallel={args.parallel}", "sweep.budget_usd=100", f"sweep.seed={args.seed}",
           "sweep.metric=eval_loss", "sweep.min_fraction=0.34", "sweep.reduction_factor=3",
           f"train.max_steps={args.max_steps}", *COMMON, *SPACE, f"storage.uri={runs}",
           f"run.work_dir={root / 'asha-work'}", *extra]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=root, env=env(), capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"the ASHA sweep failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    state = json.loads((runs / "bench" / "sweep.json").read_text())
    usage = state["usage"]
    names = [t["run_name"] for t in state["trials"]]
    return summary(runs, names, args.max_steps, wall, usage["idle_seconds"] / usage["slot_seconds"]), state["trials"]


def run_batches(root: Path, args, trials: list[dict], extra: list[str]) -> dict:
    from orchestrator.sweep.space import override

    runs, names = root / "batch-runs", []
    started, busy = time.monotonic(), 0.0
    for first in range(0, len(trials), args.parallel):
        procs = []
        for t in trials[first:first + args.parallel]:
            cmd = [sys.executable, "-m", "orchestrator.launch", *COMMON, f"train.max_steps={args.max_steps}",
                   f"train.eval_steps={args.max_steps}", *(override(k, v) for k, v in sorted(t["params"].items())),
                   f"run.name=batch-t{t['number']}", f"storage.uri={runs}", f"run.work_dir={root / 'batch-work'}",
                   *extra]
            names.append(f"batch-t{t['number']}")
            procs.append((time.monotonic(), subprocess.Popen(cmd, cwd=root, env=env(), stdout=subprocess.DEVNULL,
                                                             stderr=subprocess.STDOUT)))
        for began, proc in procs:  # the barrier: every trial of the batch ends before the next batch
            if proc.wait() != 0:
                sys.exit(f"batch trial failed with exit {proc.returncode}")
            busy += time.monotonic() - began
    wall = time.monotonic() - started
    return summary(runs, names, args.max_steps, wall, 1 - busy / (args.parallel * wall))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="more overrides for every trial (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        root = Path(tmp)
        asha, trials = run_asha(root, args, args.overrides)
        batch = run_batches(root, args, trials, args.overrides)
    print(f"{args.trials} trials, {args.parallel} at once, max_steps {args.max_steps}, seed {args.seed} "
          f"(ASHA rungs: min_fraction 0.34, reduction_factor 3)")
    print(f"{'':<22}{'ASHA (this driver)':>20}{'batch-synchronous':>20}")
    rows = [("wall seconds", "wall_s", "{:.0f}"), ("idle share", "idle_share", "{:.1%}"),
            ("spent USD", "spent_usd", "{:.4f}"), ("trials to max_steps", "full_trials", "{}"),
            ("best trial", "best", "{}"), ("its eval_loss", "best_eval_loss", "{:.4f}"),
            ("USD to reach it", "usd_to_best", "{:.4f}")]
    for label, key, fmt in rows:
        print(f"{label:<22}{fmt.format(asha[key]):>20}{fmt.format(batch[key]):>20}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
