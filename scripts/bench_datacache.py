"""The prepared-dataset cache against tokenising: SFTTrainer's construction from raw rows and from the cached set.

    .venv/bin/python scripts/bench_datacache.py 1200 20000      # synthetic training rows per measurement

In one process, per size: build the recipe's SFTTrainer from the raw rows (TRL tokenises; the first
build also warms the libraries and is left out), save its prepared training set through the cache into a
local store, load it back (download, hash check, ``load_from_disk``), and build again from it (TRL skips
tokenising a set with ``input_ids``). Prints the seconds of each side and their ratio.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path


def measure(rows: int) -> tuple[int, float, float]:
    from orchestrator.attempt.datacache import PreparedDataCache
    from orchestrator.checkpoint.store import CheckpointStore
    from orchestrator.app.compose import compose_config
    from orchestrator.storage import LocalStore
    from recipes import sft
    from recipes.data import fingerprint, load_datasets

    cfg = compose_config(["recipe=sft", f"data.num_examples={rows}", "tracking.enabled=false"])
    train, held_out = load_datasets(cfg.data, "sft")
    folder = Path(tempfile.mkdtemp(prefix="bench-datacache-"))
    cache = PreparedDataCache(CheckpointStore(LocalStore(folder / "store"), "bench", staging_dir=folder / "staging"),
                              work=folder / "work")

    def build(prepared=None):
        return sft.build_trainer(cfg, train_dataset=train, eval_dataset=held_out, output_dir=str(folder / "out"),
                                 callbacks=[], prepared=prepared)

    data_fp = fingerprint(train) + ":" + fingerprint(held_out)  # as the attempt keys it (MeasuredRecipe)
    trainer = build()  # warm-up: first imports and loads
    cache.save_later(cfg, data_fp, trainer)
    cache.wait()
    started = time.monotonic()
    build()
    tokenising = time.monotonic() - started
    started = time.monotonic()
    build(cache.load(cfg, data_fp, splits=("train", "eval")))
    cached = time.monotonic() - started
    return len(train), tokenising, cached


def main(argv: list[str]) -> int:
    for rows in [int(a) for a in argv] or [1200, 20000]:
        n, tokenising, cached = measure(rows)
        print(f"{n} training rows: build tokenising {tokenising:.2f}s, from the cache (load + build) {cached:.2f}s, "
              f"ratio {cached / tokenising:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
