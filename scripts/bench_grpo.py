"""GRPO's orchestration overhead: the same GRPO job, bare TRL against fully orchestrated, side by side.

    .venv/bin/python scripts/bench_grpo.py                      # 2 rounds of 150 steps, tiny model, CPU
    .venv/bin/python scripts/bench_grpo.py --steps 300 --rounds 4

``scripts/bench_overhead.py``'s method (both sides at once, a core each, swapping cores every second)
with recipe=grpo: the bare side is ``recipes.grpo.build_trainer`` with its reward functions called
directly (no reward cache), no callbacks and no saves; the orchestrated side has checkpoints every
10 s (each with the generation batch in flight), the reward cache committing each batch's new rewards
to storage, MLflow tracking and a budget. Goal: orchestrated / bare steps/s at least 0.97.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_overhead  # noqa: E402

GRPO = ["recipe=grpo", "recipe.num_generations=4", "recipe.steps_per_generation=2", "recipe.num_iterations=2",
        "recipe.max_completion_length=4", "train.per_device_batch_size=8"]


def main(argv: list[str]) -> int:
    if "--bare-child" in argv:
        return bench_overhead.main(argv)
    head, sep, tail = (argv[:argv.index("--")], ["--"], argv[argv.index("--") + 1:]) if "--" in argv else (argv, ["--"], [])
    defaults = [] if any(a.startswith("--steps") for a in head) else ["--steps", "150"]
    defaults += [] if any(a.startswith("--rounds") for a in head) else ["--rounds", "2"]
    bench_overhead.TARGET_RATIO = 0.97
    return bench_overhead.main([*defaults, *head, *sep, *GRPO, *tail])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
