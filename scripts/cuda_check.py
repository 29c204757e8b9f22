"""Check the orchestrator on a CUDA GPU: throughput, checkpoint stall, notice-to-commit, exact resume.

    python scripts/cuda_check.py                 # ~1B Llama, LoRA SFT, bf16; about 7-8 minutes of GPU time
    python scripts/cuda_check.py --steps 600 --out /tmp/cuda-check

Offline: the model is a randomly initialised Llama of about 1.1B parameters
(hidden 2048, 16 layers, vocabulary 32000) saved in bf16 into ``--out`` with
the built-in tiny model's tokenizer (512 tokens; the model's larger vocabulary
just leaves rows unused). Every run is a real ``python -m orchestrator.launch``
on the local backend, ``recipe=sft`` (LoRA), ``data=synthetic``:

0. a trial of a few steps (``train.trial_steps``) measures the step time, to
   size the runs at about ``--seconds`` each (skipped with ``--steps``);
1. ``off``:   ``checkpoint.every=off``, uninterrupted;
2. ``clean``: ``checkpoint.every=60s``, uninterrupted;
3. ``chaos``: ``checkpoint.every=60s``, one SIGTERM to the worker at ~70% of
   the run (after the first periodic checkpoint): it saves an emergency
   checkpoint and exits 75, the supervisor requeues it, the next attempt
   resumes and completes.

Prints steps/s and tokens/s with and without checkpointing, the training
stall per checkpoint, the notice-to-commit time of the emergency checkpoint
(the worker's own figure, and SIGTERM-sent to manifest-written from outside),
and whether the final adapters (sha256 of final/adapter_model.safetensors) of
``chaos`` and ``clean`` match; ``off`` and ``clean`` train the same trajectory,
so their match tells whether the GPU kernels are deterministic at all.

Exit codes: 0 checked (or no CUDA GPU: nothing to do); 1 a run failed, or the
resumed weights differ although the two uninterrupted runs agree (a resume bug).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHECKPOINT_EVERY = "60s"
SIGTERM_AT_FRACTION = 0.7  # of the expected training time: past the first periodic checkpoint
TRIAL_STEPS = 20
STARTUP_SECONDS_ESTIMATE = 35  # imports, model load, dataset; per attempt
RUN_TIMEOUT_SECONDS = 900
# ~1.1B parameters: a Llama-style 1B shape (TinyLlama's widths, 16 layers)
GPU_MODEL = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
                 num_key_value_heads=16, vocab_size=32000)
SMOKE_MODEL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, vocab_size=1024)
GPU_TRAIN = ["train.per_device_batch_size=16", "data.max_length=128", "train.learning_rate=1e-4"]
SMOKE_TRAIN = ["train.per_device_batch_size=8", "data.max_length=64", "train.learning_rate=1e-3"]
COMMON = ["recipe=sft", "data=synthetic", "model.dtype=bfloat16", "train.logging_steps=10", "train.eval_at_end=false",
          "data.max_eval_examples=8", "preemption.provider=none", "tracking.enabled=false",
          "requeue.backoff_base_seconds=1"]

RUNTIME = re.compile(r"'train_runtime': '?([\d.]+)")
NUM_TOKENS = re.compile(r"'num_tokens': '?([\d.e+]+)")
STALL = re.compile(r"checkpoint save at step (\d+) stalled training for ([\d.]+)s")
EMERGENCY = re.compile(r"emergency checkpoint at step (\d+) (committed|FAILED) in ([\d.]+)s")
TRIAL_STEP_TIME = re.compile(r"^\s+step time\s+(?:-|[\d.]+ s)\s+([\d.]+) s", re.M)
FIRST_STEP = re.compile(r"metered start-up: ([\d.]+)s")


def build_model(folder: Path, shape: dict, device: str) -> int:
    """A random Llama of ``shape`` in bf16 with the tiny model's tokenizer, saved to ``folder``; returns its size."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from recipes.tiny import ensure_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model())
    if shape["vocab_size"] < len(tokenizer):
        raise ValueError(f"model vocabulary {shape['vocab_size']} < tokenizer's {len(tokenizer)}")
    config = LlamaConfig(**shape, max_position_embeddings=2048, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return params


class Runs:
    """Launch jobs into one storage folder; each job's output goes to ``<out>/<name>.log``."""

    def __init__(self, out: Path, base: list[str]):
        self.out = out
        self.storage = out / "runs"
        self.base = base
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.env.setdefault("ORCH_CACHE_DIR", str(REPO / ".cache" / "test-models"))

    def start(self, name: str, extra: list[str]) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "orchestrator.launch", *self.base, *extra, f"storage.uri={self.storage}",
               f"run.name={name}", f"run.work_dir={self.out / 'work'}"]
        with open(self.log_path(name), "wb") as log:
            return subprocess.Popen(cmd, cwd=self.out, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def log_path(self, name: str) -> Path:
        return self.out / f"{name}.log"

    def log(self, name: str) -> str:
        """The job's console and its log file (the Trainer's dicts and every checkpoint line are in the file)."""
        job_log = self.out / "work" / name / "job.log"
        return self.log_path(name).read_text(errors="replace") + (
            job_log.read_text(errors="replace") if job_log.is_file() else "")

    def finish(self, name: str, proc: subprocess.Popen) -> str:
        try:
            rc = proc.wait(RUN_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
        if rc != 0:
            raise RuntimeError(f"run {name!r} failed (exit {rc}); the end of {self.log_path(name)}:\n"
                               + self.log(name)[-4000:])
        return self.log(name)

    def run(self, name: str, extra: list[str]) -> str:
        return self.finish(name, self.start(name, extra))

    def final_digest(self, name: str) -> str:
        return hashlib.sha256((self.storage / name / "final" / "adapter_model.safetensors").read_bytes()).hexdigest()

    def manifest_mtime(self, name: str, step: int) -> float | None:
        found = sorted((self.storage / name / "checkpoints").glob(f"{step:09d}-*/manifest.json"))
        return found[0].stat().st_mtime if found else None


def worker_pid(proc: subprocess.Popen) -> int | None:
    import psutil

    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    kids = [k for k in kids if "orchestrator.worker" in " ".join(k.cmdline())]
    return kids[0].pid if kids else None


def wait_for(pattern: re.Pattern, runs: Runs, name: str, proc: subprocess.Popen, timeout_s: float) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = pattern.search(runs.log(name))
        if found:
            return found
        if proc.poll() is not None:
            raise RuntimeError(f"run {name!r} ended (exit {proc.returncode}) before {pattern.pattern!r}:\n"
                               + runs.log(name)[-4000:])
        time.sleep(0.2)
    raise TimeoutError(f"run {name!r}: no {pattern.pattern!r} within {timeout_s:.0f}s")


def throughput(log: str, steps: int, tokens_per_step_bound: int) -> tuple[float, float, str]:
    """(steps/s, tokens/s, what the tokens are) from the Trainer's own figures."""
    runtime = float(RUNTIME.findall(log)[-1])
    counted = NUM_TOKENS.findall(log)
    if counted:
        return steps / runtime, float(counted[-1]) / runtime, "tokens seen"
    return steps / runtime, steps * tokens_per_step_bound / runtime, "padded upper bound"


def measure_step_seconds(runs: Runs) -> float:
    log = runs.run("trial", [f"train.trial_steps={TRIAL_STEPS}", f"train.max_steps={TRIAL_STEPS * 10}",
                             "checkpoint.every=off"])
    found = TRIAL_STEP_TIME.search(log)
    if not found:
        raise RuntimeError("the trial printed no measured step time:\n" + log[-3000:])
    return float(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=0,
                        help="optimizer steps per run (default: sized by a trial to about --seconds per run)")
    parser.add_argument("--seconds", type=float, default=90.0, help="target training time per run (default 90)")
    parser.add_argument("--every", default=CHECKPOINT_EVERY,
                        help=f"checkpoint.every of the checkpointed runs (default {CHECKPOINT_EVERY}; shorter than "
                             "--seconds so that periodic saves happen)")
    parser.add_argument("--out", type=Path, default=None, help="a folder for the model, runs and logs (default: temp)")
    parser.add_argument("--allow-cpu-smoke", action="store_true", help=argparse.SUPPRESS)  # tiny model on CPU
    args = parser.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu_smoke:
        print("cuda_check: this check needs a CUDA GPU (torch.cuda.is_available() is False); nothing to do.")
        return 0
    smoke = not cuda
    out = (args.out or Path(tempfile.mkdtemp(prefix="cuda-check-"))).resolve()
    if (out / "runs").exists():
        shutil.rmtree(out / "runs")  # a rerun into the same folder must not resume old jobs
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    device = torch.cuda.get_device_name(0) if cuda else "CPU (smoke test: tiny model, figures meaningless)"
    print(f"cuda_check on {device}; output in {out}", flush=True)

    # 1. the model
    shape = SMOKE_MODEL if smoke else GPU_MODEL
    model_dir = out / "model"
    if not (model_dir / "config.json").exists():
        params = build_model(model_dir, shape, "cuda" if cuda else "cpu")
        print(f"built a random Llama with {params / 1e6:,.1f}M parameters (bf16) in {model_dir}", flush=True)
    train = SMOKE_TRAIN if smoke else GPU_TRAIN
    batch = int(train[0].split("=")[1])
    max_length = int(train[1].split("=")[1])
    runs = Runs(out, [*COMMON, f"model.name_or_path={model_dir}", *train])

    # 2. size the runs
    if args.steps > 0:
        steps, step_s = args.steps, None
    else:
        step_s = measure_step_seconds(runs)
        steps = max(50, int(args.seconds / step_s))
        print(f"trial: {step_s:.3f} s per step -> {steps} steps per run (~{args.seconds:.0f} s of training)",
              flush=True)
    train_s = steps * step_s if step_s else None
    if train_s:
        estimate = 3 * train_s + 4 * STARTUP_SECONDS_ESTIMATE + (time.monotonic() - started)
        print(f"estimated total time: ~{estimate / 60:.1f} min (3 runs of ~{train_s:.0f} s, 4 start-ups)", flush=True)
    sized = [f"train.max_steps={steps}"]

    # 3. uninterrupted runs, without and with checkpointing
    off = runs.run("off", sized + ["checkpoint.every=off"])
    clean = runs.run("clean", sized + [f"checkpoint.every={args.every}"])

    # 4. the same job with one SIGTERM at ~70% of its training time
    chaos = runs.start("chaos", sized + [f"checkpoint.every={args.every}"])
    wait_for(FIRST_STEP, runs, "chaos", chaos, RUN_TIMEOUT_SECONDS)
    clean_runtime = float(RUNTIME.findall(clean)[-1])
    time.sleep(SIGTERM_AT_FRACTION * clean_runtime)
    pid = worker_pid(chaos)
    if pid is None or chaos.poll() is not None:
        raise RuntimeError("the chaos run ended before its SIGTERM:\n" + runs.log("chaos")[-3000:])
    sent_at = time.time()
    os.kill(pid, signal.SIGTERM)
    chaos_log = runs.finish("chaos", chaos)

    # 5. the figures
    bound = batch * max_length
    off_sps, off_tps, what = throughput(off, steps, bound)
    clean_sps, clean_tps, _ = throughput(clean, steps, bound)
    stalls = [float(s) for _, s in STALL.findall(clean)]
    emergency = EMERGENCY.search(chaos_log)
    print("\n=== cuda_check results ===")
    print(f"model: {model_dir} ({'smoke' if smoke else '~1.1B'}), LoRA SFT, {steps} steps, batch {batch}, "
          f"max_length {max_length}")
    print(f"checkpoint.every=off : {off_sps:8.3f} steps/s  {off_tps:10,.0f} tokens/s ({what})")
    print(f"checkpoint.every={args.every}: {clean_sps:8.3f} steps/s  {clean_tps:10,.0f} tokens/s "
          f"({clean_sps / off_sps:.3f} of off)")
    if stalls:
        print(f"stall per checkpoint: mean {statistics.mean(stalls):.2f} s, max {max(stalls):.2f} s "
              f"({len(stalls)} periodic saves)")
    else:
        print(f"stall per checkpoint: no periodic save happened (the run took under {args.every})")
    if emergency:
        step, outcome, took = int(emergency.group(1)), emergency.group(2), float(emergency.group(3))
        manifest_at = runs.manifest_mtime("chaos", step)
        outside = f"{manifest_at - sent_at:.2f} s" if manifest_at else "manifest not found (pruned by retention?)"
        print(f"SIGTERM -> emergency checkpoint at step {step} {outcome}: {took:.2f} s by the worker's count; "
              f"SIGTERM sent -> manifest written: {outside}")
    else:
        print("SIGTERM -> no 'emergency checkpoint' line in the chaos log (see chaos.log)")
    print(f"chaos run restored a checkpoint: {'yes' if 'restoring checkpoint' in chaos_log else 'NO'}")
    digests = {name: runs.final_digest(name) for name in ("off", "clean", "chaos")}
    deterministic = digests["off"] == digests["clean"]
    resumed_ok = digests["chaos"] == digests["clean"]
    print(f"final adapter sha256: off {digests['off'][:16]}  clean {digests['clean'][:16]}  "
          f"chaos {digests['chaos'][:16]}")
    print(f"uninterrupted runs identical (determinism): {'yes' if deterministic else 'NO'}")
    print(f"resumed run identical to the uninterrupted one: {'yes' if resumed_ok else 'NO'}")
    print(f"total time: {(time.monotonic() - started) / 60:.1f} min; logs in {out}")
    if not resumed_ok and deterministic:
        print("FAIL: the uninterrupted runs agree but the resumed one differs: the resume path changed the trajectory")
        return 1
    if not deterministic:
        print("note: two uninterrupted runs differ, so the kernels are not deterministic here; "
              "exact resume cannot be judged by bytes on this machine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
