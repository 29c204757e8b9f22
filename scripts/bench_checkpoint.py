"""Measure what checkpointing costs a training job, side by side in one run.

    .venv/bin/python scripts/bench_checkpoint.py            # full fine-tune, 640 x 4 tiny Llama (~320 MB checkpoint)

Prints one table:
  * steps/s with ``checkpoint.every=10s`` divided by steps/s with ``checkpoint.every=off``
    (target >= 0.97), the median of off/on pairs run in alternating order (off-on, on-off, ...)
    so a noisy machine hurts both alike; training gets all cores but one (``--threads``), the
    background hashing and upload the last one, as on a GPU machine;
  * the training loop's stall per checkpoint (the time the Trainer spends writing its
    local folder; the upload runs in the background), from the callback's log line;
  * the metered start-up (the cost meter's start to the first step) when resuming at step 10 and at step 1000
    (target: within 10% of each other), with the same model and a small batch and
    short sequences so 1000 steps are quick to produce.

Every job is a real ``python -m orchestrator.launch`` against a local storage folder.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = ["recipe.peft=full", "model.hidden_size=640", "model.num_layers=4"]
COMMON = ["preemption.provider=none", "tracking.enabled=false", "train.eval_at_end=false", "train.logging_steps=10",
          "requeue.crash_loop_threshold=20"]
# Small batches and short sequences for the resume runs: the model stays the same.
SHORT = ["train.per_device_batch_size=1", "data.max_length=16", "train.max_steps=3000"]

RUNTIME = re.compile(r"'train_runtime': '?([\d.]+)")
STALL = re.compile(r"checkpoint save at step (\d+) stalled training for ([\d.]+)s")
COMMITTED = re.compile(r"checkpoint \S+ committed \(step (\d+), ([\d.]+) MB, ([\d.]+)s\)")
FIRST_STEP = re.compile(r"metered start-up: ([\d.]+)s .*resumed at step (\d+)")


class Bench:
    def __init__(self, root: Path, model: list[str], threads: int):
        self.root = root
        self.model = model
        self.storage = root / "runs"
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        self.env.setdefault("ORCH_CACHE_DIR", str(REPO / ".cache" / "test-models"))

    def start(self, name: str, overrides: list[str]) -> tuple[subprocess.Popen, Path]:
        log = self.root / f"{name}-{time.monotonic_ns()}.log"
        cmd = [sys.executable, "-m", "orchestrator.launch", *COMMON, *self.model, *overrides,
               f"storage.uri={self.storage}", f"run.name={name}", f"run.work_dir={self.root / 'work'}"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=self.root, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        return proc, log

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def wait_log(self, proc: subprocess.Popen, log: Path, pattern: re.Pattern, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        job_log = self.root / "work" / log.name.rsplit("-", 1)[0] / "job.log"  # every line is in the job's log
        while time.monotonic() < deadline:
            m = pattern.search(log.read_text(errors="replace")) or (
                pattern.search(job_log.read_text(errors="replace")) if job_log.is_file() else None)
            if m:
                return m
            if proc.poll() is not None:
                raise RuntimeError(f"{log.name} ended (rc={proc.returncode}) before {pattern.pattern!r}:\n"
                                   + log.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        raise TimeoutError(f"{log.name}: no {pattern.pattern!r} within {timeout_s:.0f}s")

    def committed(self, name: str) -> list[int]:
        folder = self.storage / name / "checkpoints"
        return sorted(int(p.parent.name.split("-")[0]) for p in folder.glob("*/manifest.json"))

    # ---- steps/s with and without checkpoints ---------------------------------
    def throughput(self, name: str, every: str, steps: int) -> dict:
        proc, log = self.start(name, [f"checkpoint.every={every}", f"train.max_steps={steps}"])
        rc = proc.wait()
        job_log = self.root / "work" / name / "job.log"  # the Trainer's dicts and every checkpoint line
        text = log.read_text(errors="replace") + (job_log.read_text(errors="replace") if job_log.is_file() else "")
        if rc != 0:
            raise RuntimeError(f"{name} failed (rc={rc}):\n{text[-3000:]}")
        runtime = float(RUNTIME.search(text).group(1))
        return {"steps_per_s": steps / runtime, "stalls": [float(s) for _, s in STALL.findall(text)],
                "commits": [(float(mb), float(sec)) for _, mb, sec in COMMITTED.findall(text)]}

    # ---- metered start-up after a resume ----------------------------------
    def make_checkpoint(self, name: str, step: int, timeout_s: float) -> None:
        """Train ``name`` until a checkpoint at ``step`` is committed, then kill it (as a lost machine)."""
        proc, _ = self.start(name, SHORT + ["checkpoint.every=off", f"checkpoint.every_steps={step}"])
        try:
            deadline = time.monotonic() + timeout_s
            while step not in self.committed(name):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: no checkpoint at step {step} (rc={proc.poll()})")
                time.sleep(0.2)
        finally:
            self.kill(proc)

    def resume(self, name: str) -> tuple[float, int]:
        proc, log = self.start(name, SHORT + ["checkpoint.every=off", "checkpoint.every_steps=0"])
        try:
            m = self.wait_log(proc, log, FIRST_STEP, 600)
        finally:
            self.kill(proc)
        return float(m.group(1)), int(m.group(2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(REPO / ".cache" / "bench-checkpoint"), help="scratch folder (emptied)")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per throughput run")
    parser.add_argument("--pairs", type=int, default=2, help="off/on pairs of throughput runs")
    parser.add_argument("--resumes", type=int, default=3, help="resumes timed at each of step 10 and step 1000")
    parser.add_argument("--far-step", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=1, help="throughput runs made first and left out (model build, caches)")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                        help="torch threads for training (default: all cores but one, which the background "
                             "hashing and upload get, as on a GPU machine where training leaves the CPU cores free)")
    args = parser.parse_args(argv)

    root = Path(args.root).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    bench = Bench(root, MODEL, args.threads)
    print(f"training on {args.threads} torch thread(s) of {os.cpu_count()} cores", flush=True)
    began = time.monotonic()

    for i in range(args.warmup):
        r = bench.throughput(f"warmup-{i}", "off", args.steps)
        print(f"  [{time.monotonic() - began:6.0f}s] warm-up run {i}: {r['steps_per_s']:.3f} steps/s (left out)", flush=True)
    off, on = [], []
    for i in range(args.pairs):
        # off-on, then on-off: a drift in the machine's load over a pair does not favour one side
        order = (("off", "off", off), ("on", "10s", on))
        for mode, every, into in (order if i % 2 == 0 else order[::-1]):
            r = bench.throughput(f"tput-{mode}-{i}", every, args.steps)
            into.append(r)
            print(f"  [{time.monotonic() - began:6.0f}s] checkpoint.every={every:<4} run {i}: {r['steps_per_s']:.3f} steps/s, "
                  f"{len(r['stalls'])} saves", flush=True)

    bench.make_checkpoint("resume-near", 10, 600)
    bench.make_checkpoint("resume-far", args.far_step, 3600)
    print(f"  [{time.monotonic() - began:6.0f}s] checkpoints at step 10 and {args.far_step} committed", flush=True)
    near, far = [], []
    for _ in range(args.resumes):
        for name, into in (("resume-near", near), ("resume-far", far)):
            seconds, step = bench.resume(name)
            into.append((seconds, step))
            print(f"  [{time.monotonic() - began:6.0f}s] resumed {name} at step {step}: first step after {seconds:.2f}s",
                  flush=True)

    off_rate = statistics.mean(r["steps_per_s"] for r in off)
    on_rate = statistics.mean(r["steps_per_s"] for r in on)
    # the verdict: the median of the pairs' ratios, which one disturbed run cannot swing
    pair_ratios = [b["steps_per_s"] / a["steps_per_s"] for a, b in zip(off, on)]
    ratio = statistics.median(pair_ratios)
    stalls = [s for r in on for s in r["stalls"]]
    commits = [c for r in on for c in r["commits"]]
    size_mb = max((mb for mb, _ in commits), default=0.0)
    near_s = statistics.median(s for s, _ in near)
    far_s = statistics.median(s for s, _ in far)
    rows = [
        ("checkpoint size", f"{size_mb:.0f} MB", "(weights + optimizer + state)"),
        ("steps/s, checkpoint.every=off", f"{off_rate:.3f}", " / ".join(f"{r['steps_per_s']:.3f}" for r in off)),
        ("steps/s, checkpoint.every=10s", f"{on_rate:.3f}", " / ".join(f"{r['steps_per_s']:.3f}" for r in on)),
        ("ratio on/off (median of pairs)", f"{ratio:.3f}",
         "target >= 0.97 " + ("MET" if ratio >= 0.97 else "MISSED")
         + f"; pairs {' / '.join(f'{r:.3f}' for r in pair_ratios)}; ratio of means {on_rate / off_rate:.3f}"),
        ("saves during the 'on' runs", f"{len(stalls)}", f"over {args.pairs * args.steps} steps"),
        ("stall per checkpoint", f"{statistics.mean(stalls):.2f} s" if stalls else "-",
         f"min {min(stalls):.2f} / max {max(stalls):.2f} s" if stalls else ""),
        ("background commit per checkpoint", f"{statistics.mean(s for _, s in commits):.2f} s" if commits else "-",
         "hash + upload, off the training loop"),
        ("metered start-up, resume at 10 (median)", f"{near_s:.2f} s", " / ".join(f"{s:.2f}" for s, _ in near)),
        (f"metered start-up, resume at {args.far_step} (median)", f"{far_s:.2f} s", " / ".join(f"{s:.2f}" for s, _ in far)),
        ("difference", f"{100 * (far_s - near_s) / near_s:+.1f}%",
         "target within 10% " + ("MET" if abs(far_s - near_s) <= 0.10 * near_s else "MISSED")),
    ]
    print(f"\ncheckpoint benchmark: {' '.join(MODEL)}, local storage, {args.threads} torch thread(s) of "
          f"{os.cpu_count()} cores, {time.monotonic() - began:.0f}s in all")
    for label, value, note in rows:
        print(f"  {label:<46}{value:>12}   {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
