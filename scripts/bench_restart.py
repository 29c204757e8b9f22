"""Restart overhead: process start to the first optimizer step after a restore (or, with ``--fresh``, of a
fresh job), orchestrated against bare TRL.

    .venv/bin/python scripts/bench_restart.py                      # tiny model, 3 rounds at steps 10 and 1000
    .venv/bin/python scripts/bench_restart.py --rounds 5 --examples 20000 -- model.hidden_size=128
    .venv/bin/python scripts/bench_restart.py --fresh --rounds 2   # a fresh start, launcher to first step

Set-up: one orchestrated SFT job (local storage, checkpoints every 10 steps) is trained to step 1000
and another to step 10; each is stopped right after its checkpoint. Then, per round and per step,
in turn (the steps' and the sides' order swapped every round, so a machine's drift hits all alike):
  orchestrated  ``python -m orchestrator.worker`` with the job's overrides, as a requeue starts it:
                ledger and spend index, the checkpoint's download and verification (overlapping the
                model's load), the prepared-dataset cache, the Trainer's restore, one step. Its time is
                the split it records in the ledger (``extra.restart.total_s``: process start, as the
                kernel records it, to the end of the first step).
  bare          a plain TRL script: transformers, PEFT and TRL only; the same tiny model folder, the
                same training rows (a JSONL file), the same ``SFTConfig`` arguments; tokenises in
                ``SFTTrainer`` and calls ``trainer.train(resume_from_checkpoint=<the same checkpoint,
                on local disk>)``; its time is process start to the end of the first step.
MLflow is off on the orchestrated side (its client's import and run start are the tracking feature's
own cost). Prints every measurement, the medians, and the ratios side by side: orchestrated/bare at
step 1000 (target <= 1.15) and step 1000 / step 10 for each side (flat: about 1).

``--fresh``: a fresh start instead, the two sides alternating (which goes first swapped every round):
  orchestrated  ``python -m orchestrator.launch`` with the job's overrides (MLflow off, as above), as a user starts it, on a
                storage and work folder of its own each round (no prepared-dataset cache, no ledger): the
                launcher's composition, checks and plan, the local supervisor, the worker's start, one
                step. Its time is the launcher's process start (the kernel's record) to the end of the
                first step (the worker's own log line of that moment), and the CPU seconds of the launcher,
                the supervisor and the worker by then; then the job is killed.
  bare          the same plain TRL script with no checkpoint: ``trainer.train()`` from scratch.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TARGET_RATIO = 1.15
RESULT_PREFIX = "BENCH_RESTART "
STEPS = (10, 1000)
FIRST_STEP_LINE = "restart overhead (process start to first step"  # the worker logs it at the first step's end


def overrides(workdir: Path, run: str, examples: int, extra: list[str]) -> list[str]:
    return ["recipe=sft", "train.max_steps=1100", "train.logging_steps=50", "train.eval_at_end=false",
            f"data.num_examples={examples}", "checkpoint.every=off", "checkpoint.every_steps=10",
            "preemption.provider=none", "tracking.enabled=false", "requeue.max_failures=1000",
            "requeue.crash_loop_threshold=1000", f"storage.uri={workdir / 'runs'}", f"run.work_dir={workdir / 'work'}",
            f"run.name={run}", *extra]


def env(**more) -> dict:
    out = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    out.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **more)
    return out


def worker(args: list[str], workdir: Path, *, fault_after: int, log: Path) -> None:
    """One attempt, as a requeue starts it; ends by the test hook's fault ``fault_after`` steps after its start."""
    with open(log, "ab") as out:
        subprocess.run([PYTHON, "-m", "orchestrator.worker", *args], cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                       env=env(ORCH_FAULT_AFTER_STEPS=str(fault_after)), timeout=1800)


def last_restart(workdir: Path, run: str) -> dict:
    ledger = json.loads((workdir / "runs" / run / "ledger.json").read_text())
    split = (ledger["attempts"][-1].get("extra") or {}).get("restart")
    if not split:
        raise SystemExit(f"the attempt of {run} recorded no restart split; see {workdir}/*.log")
    return split


def checkpoint_folder(workdir: Path, run: str, step: int) -> Path:
    folders = sorted((workdir / "runs" / run / "checkpoints").glob(f"{step:09d}-*"))
    if not folders:
        raise SystemExit(f"no checkpoint at step {step} for {run}")
    return folders[-1]


def bare_inputs(args: list[str], workdir: Path) -> Path:
    """The bare script's inputs, from the orchestrated job's config: model folder, rows, SFTConfig arguments."""
    from orchestrator.app.compose import compose_config
    from recipes import common
    from recipes.data import load_datasets

    cfg = compose_config(args)
    train_ds, _ = load_datasets(cfg.data, cfg.recipe.name)
    rows = workdir / "train.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in train_ds))
    kwargs = common.training_kwargs(cfg, str(workdir / "bare-out"))
    spec = {"model": common.resolve_model_path(cfg.model), "rows": str(rows), "dtype": cfg.model.dtype,
            "lora": dict(r=cfg.recipe.lora_r, lora_alpha=cfg.recipe.lora_alpha, lora_dropout=cfg.recipe.lora_dropout,
                         target_modules=list(cfg.recipe.lora_target_modules), task_type="CAUSAL_LM"),
            "sft": dict(kwargs, packing=False, dataset_num_proc=None)}
    path = workdir / "bare.json"
    path.write_text(json.dumps(spec))
    return path


BARE_SCRIPT = r'''
import json, os, sys, time
import psutil
start = psutil.Process().create_time()
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import SFTConfig, SFTTrainer

spec = json.load(open(sys.argv[1]))
checkpoint = sys.argv[2] if len(sys.argv) > 2 else None  # None: a fresh start
tok = AutoTokenizer.from_pretrained(spec["model"])
if tok.pad_token is None:
    tok.pad_token = tok.eos_token
model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=getattr(torch, spec["dtype"]))
rows = [json.loads(line) for line in open(spec["rows"])]

class FirstStep(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        cpu = psutil.Process().cpu_times()
        print("BENCH_RESTART " + json.dumps({"total_s": time.time() - start, "cpu_s": cpu.user + cpu.system,
                                             "step": state.global_step}), flush=True)
        os._exit(0)

trainer = SFTTrainer(model=model, args=SFTConfig(**spec["sft"]), train_dataset=Dataset.from_list(rows),
                     processing_class=tok, peft_config=LoraConfig(**spec["lora"]), callbacks=[FirstStep()])
trainer.train(resume_from_checkpoint=checkpoint)
'''


def bare(spec: Path, checkpoint: Path | None, workdir: Path, log: Path) -> dict:
    script = workdir / "bare_trl.py"
    script.write_text(BARE_SCRIPT)
    resume = [str(checkpoint)] if checkpoint else []
    done = subprocess.run([PYTHON, str(script), str(spec), *resume], cwd=workdir, capture_output=True,
                          text=True, env=env(), timeout=1800)
    with open(log, "a") as out:
        out.write(done.stdout + done.stderr)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    raise SystemExit(f"the bare TRL script failed (rc={done.returncode}):\n{done.stderr[-3000:]}")


def tree_cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process and all its descendants (launcher, supervisor, worker)."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def launch_fresh(args: list[str], workdir: Path, log: Path) -> dict:
    """One fresh job through ``python -m orchestrator.launch``: its process start to the first step's end."""
    import psutil

    proc = subprocess.Popen([PYTHON, "-m", "orchestrator.launch", *args], cwd=workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env(), start_new_session=True)
    started = psutil.Process(proc.pid).create_time()
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if FIRST_STEP_LINE in line:  # "2026-12-01 21:46:42,123 INFO ...": local time, milliseconds
                at = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                return {"total_s": at - started, "cpu_s": tree_cpu_seconds(proc.pid)}
    finally:
        with open(log, "a") as out:
            out.writelines(seen)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    raise SystemExit(f"the launch ended (rc={proc.returncode}) before its first step:\n{''.join(seen[-40:])}")


def fresh_main(args: argparse.Namespace, workdir: Path, log: Path) -> int:
    """``--fresh``: a fresh start to the first step, the launch against the plain TRL script, alternating."""
    def job(n: int) -> list[str]:  # a storage and work folder of its own: no cache, no ledger, a fresh job
        return overrides(workdir / f"fresh-{n}", "fresh", args.examples, args.extra)

    spec = bare_inputs(job(0), workdir)
    launch_fresh(job(0), workdir, log)  # one warm-up per side, left out: the first read of every library
    bare(spec, None, workdir, log)
    results: dict[str, list[dict]] = {"orchestrated": [], "bare": []}
    for round_ in range(1, args.rounds + 1):
        for side in (("orchestrated", "bare") if round_ % 2 else ("bare", "orchestrated")):
            seconds = launch_fresh(job(round_), workdir, log) if side == "orchestrated" else bare(spec, None, workdir, log)
            results[side].append(seconds)
            print(f"round {round_} fresh {side:<12} {seconds['total_s']:6.2f}s wall, {seconds['cpu_s']:6.2f}s CPU",
                  flush=True)
    ratios = {}
    for figure, label in (("total_s", "wall"), ("cpu_s", "CPU")):
        median = {side: statistics.median(v[figure] for v in values) for side, values in results.items()}
        ratios[figure] = median["orchestrated"] / median["bare"]
        print(f"\nfresh start, process start to first step ({label} seconds, medians of {args.rounds}):")
        for side in ("orchestrated", "bare"):
            print(f"  {side:<14}{median[side]:>8.2f}s   ({', '.join(f'{v[figure]:.2f}' for v in results[side])})")
    verdict = "met" if ratios["total_s"] <= TARGET_RATIO else "MISSED"
    print(f"\nfresh start: orchestrated/bare {ratios['total_s']:.3f} wall, {ratios['cpu_s']:.3f} CPU "
          f"(target <= {TARGET_RATIO}: {verdict} on wall time)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measurements per side and step (default 3)")
    parser.add_argument("--examples", type=int, default=1200, help="synthetic training examples (default 1200)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--fresh", action="store_true",
                        help="a fresh start (python -m orchestrator.launch) against the plain TRL script from scratch")
    parser.add_argument("extra", nargs="*", help="extra Hydra overrides for the job (after --)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-restart-"))
    log = workdir / "bench.log"
    if args.fresh:
        print(f"work dir {workdir}; fresh starts, {args.rounds} round(s) per side", flush=True)
        try:
            return fresh_main(args, workdir, log)
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    print(f"work dir {workdir}; preparing checkpoints at steps {STEPS}", flush=True)
    try:
        jobs = {step: overrides(workdir, f"restart-{step}", args.examples, args.extra) for step in STEPS}
        for step, job in jobs.items():  # train to the step, commit there, stop one step later
            started = time.monotonic()
            worker(job, workdir, fault_after=step + 1, log=log)
            checkpoint_folder(workdir, f"restart-{step}", step)
            print(f"  trained to step {step} in {time.monotonic() - started:.1f}s", flush=True)
        spec = bare_inputs(jobs[STEPS[0]], workdir)
        # one warm-up restart per side, left out: the first read of every library from disk
        worker(jobs[STEPS[0]], workdir, fault_after=1, log=log)
        bare(spec, checkpoint_folder(workdir, f"restart-{STEPS[0]}", STEPS[0]), workdir, log)
        results: dict[tuple[str, int], list[dict]] = {}
        splits: dict[int, list[dict]] = {step: [] for step in STEPS}
        for round_ in range(1, args.rounds + 1):
            # the steps' order and the sides' order swap every round, so a machine's drift hits all alike
            for step in (STEPS if round_ % 2 else STEPS[::-1]):
                order = ("orchestrated", "bare") if (round_ + step) % 2 else ("bare", "orchestrated")
                for side in order:
                    if side == "orchestrated":
                        worker(jobs[step], workdir, fault_after=1, log=log)
                        split = last_restart(workdir, f"restart-{step}")
                        splits[step].append(split)
                        seconds = split
                    else:
                        seconds = bare(spec, checkpoint_folder(workdir, f"restart-{step}", step), workdir, log)
                    results.setdefault((side, step), []).append(seconds)
                    print(f"round {round_} step {step:>4} {side:<12} {seconds['total_s']:6.2f}s wall, "
                          f"{seconds['cpu_s']:6.2f}s CPU", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    ratio_at_top = {}
    for figure, label in (("total_s", "wall seconds, process start to first step"),
                          ("cpu_s", "CPU seconds (user + system) to first step")):
        median = {key: statistics.median(v[figure] for v in values) for key, values in results.items()}
        print(f"\n{label} (medians of {args.rounds})")
        print(f"{'':<14}" + "".join(f"{f'step {s}':>12}" for s in STEPS) + f"{'1000/10':>10}")
        for side in ("orchestrated", "bare"):
            cells = "".join(f"{median[(side, s)]:>11.2f}s" for s in STEPS)
            print(f"{side:<14}{cells}{median[(side, STEPS[-1])] / median[(side, STEPS[0])]:>10.3f}")
        ratios = [median[("orchestrated", s)] / median[("bare", s)] for s in STEPS]
        print(f"{'orch/bare':<14}" + "".join(f"{r:>12.3f}" for r in ratios))
        ratio_at_top[figure] = (ratios[-1], median[("orchestrated", STEPS[-1])] / median[("orchestrated", STEPS[0])])
    print("\norchestrated split (medians, seconds):")
    for step in STEPS:
        keys = [k for k in splits[step][0] if k not in ("total_s", "cpu_s")]
        print(f"  step {step:>4}: " + ", ".join(f"{k[:-2]} {statistics.median(s[k] for s in splits[step]):.2f}"
                                              for k in keys))
    ratio, flat = ratio_at_top["total_s"]
    verdict = "met" if ratio <= TARGET_RATIO else "MISSED"
    print(f"\nrestart at step {STEPS[-1]}: orchestrated/bare {ratio:.3f} wall, {ratio_at_top['cpu_s'][0]:.3f} CPU "
          f"(target <= {TARGET_RATIO}: {verdict} on wall time); flat: orchestrated step {STEPS[-1]}/step {STEPS[0]} "
          f"{flat:.3f} wall, {ratio_at_top['cpu_s'][1]:.3f} CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
