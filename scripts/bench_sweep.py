"""An ASHA sweep against a batch-synchronous sweep of the same trials, side by side, on this machine.

    .venv/bin/python scripts/bench_sweep.py                          # 6 trials, 2 at once, rungs at 4 and 12 steps
    .venv/bin/python scripts/bench_sweep.py --trials 8 --parallel 4 -- data.num_examples=400
    .venv/bin/python scripts/bench_sweep.py --fresh --trials 8 --parallel 2   # forked trial launches or fresh ones
    .venv/bin/python scripts/bench_sweep.py --chaos 7 --trials 16 --parallel 4 --max-steps 24   # see below

1. ASHA: ``python -m orchestrator.launch sweep=asha ...`` (the driver: asynchronous promotion, paused trials hold
   no worker). Its trials' parameters are then taken as they were sampled.
2. Batch-synchronous, Hydra's basic launcher order: the same trials, ``--parallel`` at a time, each
   ``python -m orchestrator.launch`` to ``train.max_steps`` (no pruning: Hydra has no channel for it), and every
   trial of a batch must end before the next batch starts.

Both run real jobs (the tiny model, CPU) with ``compute.price_per_hour=1`` so dollars are visible. Per side it
prints: wall seconds; the idle share (slot-seconds with no trial process / ``parallel`` x wall); the dollars spent
(every attempt's cost in the trials' ledgers); the best trial (lowest ``eval_loss`` at ``max_steps``) and the cost
to reach it (dollars spent by the moment its final evaluation was known: attempts before, prorated across it).

``--fresh``: instead of the batch order, the same ASHA sweep again with ``requeue.fork_attempts=false`` (each trial's
launch and each attempt a fresh interpreter) against the default (each launch forked from the driver, which
imported the training stack once: ``orchestrator/process/warm_start.py``): wall seconds, CPU seconds of the sweep's whole
process tree, dollars billed, and whether both decided the same.

``--chaos SEED``: instead of the batch order, the same ASHA sweep again with every trial's worker SIGKILLed at
least once after a commit (at a committed step the seed picks; about half of them once more;
``sweep_chaos.py``), then: the spend against ``sweep.budget_usd`` plus one step per running trial, whether any
resumed attempt started anywhere but its committed checkpoint (the ledgers), whether the promotions and the best
trial are the uninterrupted sweep's, and the idle share of paid time per side. Both sides checkpoint every 2
steps and run with ``ORCH_STEP_DELAY_SECONDS`` (``--step-delay``) so a kill lands mid-rung.
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


def env(step_delay: float = 0.0) -> dict:
    e = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    if step_delay:
        e["ORCH_STEP_DELAY_SECONDS"] = str(step_delay)
    e.setdefault("ORCH_CACHE_DIR", str(REPO / ".cache" / "test-models"))
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), e.get("PYTHONPATH", "")) if p)
    return e


def ledger(runs: Path, name: str) -> dict:
    """The trial's ledger; {} for one a cap refused before it took an attempt (nothing written)."""
    path = runs / name / "ledger.json"
    return json.loads(path.read_text()) if path.exists() else {}


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
    return None if value is None or not led.get("attempts") else (float(value), float(led["attempts"][-1]["ended_at"]))


def summary(runs: Path, names: list[str], max_steps: int, wall: float, idle: float) -> dict:
    finals = {n: final_loss(runs, n, max_steps) for n in names}
    best = min((n for n in names if finals[n]), key=lambda n: finals[n][0], default=None)
    spent = spent_by(runs, names, float("inf"))
    if best is None:  # a budget that stopped every trial short of max_steps
        return dict(wall_s=wall, idle_share=idle, spent_usd=spent, best="none", best_eval_loss=float("nan"),
                    usd_to_best=float("nan"), full_trials=0)
    return dict(wall_s=wall, idle_share=idle, spent_usd=spent, best=best.rsplit("-", 1)[1], best_eval_loss=finals[best][0],
                usd_to_best=spent_by(runs, names, finals[best][1]), full_trials=sum(1 for f in finals.values() if f))


def run_asha(root: Path, args, extra: list[str], side: str = "asha", chaos=None) -> tuple[dict, dict]:
    """One ASHA sweep (``chaos``: a ``sweep_chaos.Chaos`` that SIGKILLs its trials' workers as it runs)."""
    runs = root / f"{side}-runs"
    cmd = [sys.executable, "-m", "orchestrator.launch", "sweep=asha", "sweep.name=bench", f"sweep.n_trials={args.trials}",
           f"sweep.max_parallel={args.parallel}", f"sweep.budget_usd={args.budget}", f"sweep.seed={args.seed}",
           "sweep.metric=eval_loss", "sweep.min_fraction=0.34", "sweep.reduction_factor=3",
           f"train.max_steps={args.max_steps}", *COMMON, *SPACE, f"storage.uri={runs}",
           f"run.work_dir={root / f'{side}-work'}", *extra]
    started = time.monotonic()
    with open(root / f"{side}-driver.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env(args.step_delay), stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if chaos is not None:
                chaos.tick(runs, runs / "bench" / "sweep.json")
            time.sleep(0.2)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"the {side} sweep failed ({proc.returncode}):\n{(root / f'{side}-driver.log').read_text()[-3000:]}")
    state = json.loads((runs / "bench" / "sweep.json").read_text())
    usage = state["usage"]
    names = [t["run_name"] for t in state["trials"]]
    out = summary(runs, names, args.max_steps, wall, usage["idle_seconds"] / usage["slot_seconds"])
    return dict(out, runs=runs, names=names), state


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
    parser.add_argument("--budget", type=float, default=100.0, help="sweep.budget_usd (dollars at $1/h)")
    parser.add_argument("--chaos", type=int, default=None, metavar="SEED",
                        help="compare against the same sweep with every trial SIGKILLed (seeded), not the batch order")
    parser.add_argument("--fresh", action="store_true",
                        help="compare against the same sweep with requeue.fork_attempts=false, not the batch order")
    parser.add_argument("--step-delay", type=float, default=None, help="ORCH_STEP_DELAY_SECONDS (default: 0.4 "
                                                                       "with --chaos, else none)")
    parser.add_argument("--keep", default=None, help="run in this folder and keep it (default: a temporary one)")
    parser.add_argument("overrides", nargs="*", help="more overrides for every trial (after --)")
    args = parser.parse_args()
    if args.step_delay is None:
        args.step_delay = 0.4 if args.chaos is not None else 0.0
    if args.chaos is not None:
        return chaos_main(args)
    if args.fresh:
        return fresh_main(args)
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        root = Path(tmp)
        asha, state = run_asha(root, args, args.overrides)
        batch = run_batches(root, args, state["trials"], args.overrides)
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


def fresh_main(args) -> int:
    """The same ASHA sweep with trials' launches forked from the driver (the default), then as fresh interpreters."""
    import resource

    def cpu() -> float:
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        return used.ru_utime + used.ru_stime

    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        root, sides = Path(tmp), {}
        for side, fork in (("forked", "true"), ("fresh", "false")):
            before = cpu()
            out, state = run_asha(root, args, [*args.overrides, f"requeue.fork_attempts={fork}"], side=side)
            sides[side] = dict(out, cpu_s=cpu() - before, launches=sum(t["launches"] for t in state["trials"]),
                               decisions=sorted((d["trial"], d["rung"], d["decision"]) for d in state["decisions"]))
    forked, fresh = sides["forked"], sides["fresh"]
    print(f"{args.trials} trials, {args.parallel} at once, max_steps {args.max_steps}, seed {args.seed}; "
          f"{forked['launches']} and {fresh['launches']} trial launches")
    print(f"{'':<22}{'forked launches':>18}{'fresh launches':>18}{'ratio':>8}")
    for label, key, fmt in (("wall seconds", "wall_s", "{:.1f}"), ("CPU seconds", "cpu_s", "{:.1f}"),
                            ("spent USD", "spent_usd", "{:.4f}")):
        ratio = forked[key] / fresh[key] if fresh[key] else float("nan")
        print(f"{label:<22}{fmt.format(forked[key]):>18}{fmt.format(fresh[key]):>18}{ratio:>8.3f}")
    print(f"same decisions: {forked['decisions'] == fresh['decisions']}; best trial {forked['best']} and "
          f"{fresh['best']}")
    return 0


def chaos_main(args) -> int:
    from sweep_chaos import Chaos, report

    extra = ["checkpoint.every_steps=2", "requeue.backoff_base_seconds=0.2", *args.overrides]
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    calm, calm_state = run_asha(root, args, extra, side="calm")
    chaos = Chaos(args.chaos)
    rough, rough_state = run_asha(root, args, extra, side="chaos", chaos=chaos)
    print(f"{args.trials} trials, {args.parallel} at once, max_steps {args.max_steps}, sweep seed {args.seed}, "
          f"chaos seed {args.chaos}, step floor {args.step_delay} s, budget ${args.budget:g} at $1/h; folder {root}")
    for line in report(args, (calm, calm_state), (rough, rough_state), chaos):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
