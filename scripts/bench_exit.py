"""An attempt's exit: from its last line ("final weights: ...") to the end of its process, with the
interpreter's teardown skipped (``orchestrator.core.exitcodes.exit_without_teardown``, what ``python -m
orchestrator.worker`` does) against a plain ``sys.exit`` (the interpreter frees torch, transformers and the
rest before the process ends), side by side, the two sides alternating (which goes first swapped every round).

    .venv/bin/python scripts/bench_exit.py              # 3 rounds of the default tiny job, 20 steps each

Every attempt pays this while its supervisor waits to start the next one or to report the job's end; so does
every trial of a sweep before its worker slot is free. Prints each measurement, the medians and their ratio.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIDES = {
    "skipped": ["-m", "orchestrator.worker"],
    "teardown": ["-c", "import sys; from orchestrator.worker import main; sys.exit(main(sys.argv[1:]))"],
}


def one(side: str, work: Path, steps: int) -> float:
    """Seconds from the worker's "final weights:" line to its process's end."""
    shutil.rmtree(work, ignore_errors=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.setdefault("ORCH_CACHE_DIR", str(ROOT / ".cache" / "test-models"))
    cmd = [sys.executable, *SIDES[side], f"storage.uri={work}/runs", f"run.work_dir={work}/work",
           f"train.max_steps={steps}", "tracking.enabled=false"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = None
    for line in proc.stdout:
        if line.startswith("final weights:"):
            last = time.monotonic()
    code = proc.wait()
    end = time.monotonic()
    if code != 0 or last is None:
        raise SystemExit(f"the {side} attempt failed (exit {code}, final line seen: {last is not None})")
    return end - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
            for side in order:
                seconds[side].append(one(side, Path(tmp) / side, args.steps))
                print(f"round {r + 1}: {side:<9} {seconds[side][-1]:.2f}s from the last line to the exit", flush=True)
    skipped, teardown = (statistics.median(seconds[s]) for s in ("skipped", "teardown"))
    print(f"median: skipped {skipped:.2f}s, teardown {teardown:.2f}s; saved per attempt {teardown - skipped:.2f}s "
          f"(skipped/teardown {skipped / teardown:.3f})")


if __name__ == "__main__":
    main()
