"""One checkpoint's benchmark evaluation inside the job against a bare ``lm_eval`` CLI call on the same checkpoint.

    .venv/bin/python scripts/bench_eval.py 200        # items of tiny_arith_mc (eval.limit)

Trains the tiny model's LoRA adapter for a few steps (SFT recipe), saves it, then times, side by side:
- inside the job: ``orchestrator.evaluation.harness.run`` on the trainer's model in memory (what the attempt does
  after a commit; the first one also pays the harness's import, the second is every later checkpoint's);
- bare: ``lm_eval run --model hf --model_args pretrained=<base>,peft=<adapter> --tasks tiny_arith_mc`` as a
  subprocess (its imports and the model's load included: what evaluating the checkpoint outside the job costs).
Prints the seconds of each, their scores (which must agree) and the ratio (goal: at most 1.0).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(limit: int) -> None:
    from orchestrator.app.compose import compose_config
    from orchestrator.evaluation import harness, spec
    from recipes import sft
    from recipes.common import resolve_model_path
    from recipes.data import load_datasets

    cfg = compose_config(["train.max_steps=10", "tracking.enabled=false", "eval.tasks=[tiny_arith_mc]",
                          f"eval.limit={limit}"])
    train, held_out = load_datasets(cfg.data, "sft")
    folder = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    trainer = sft.build_trainer(cfg, train_dataset=train, eval_dataset=held_out, output_dir=str(folder / "out"),
                                callbacks=[])
    trainer.train()
    adapter = folder / "adapter"
    trainer.save_model(str(adapter))
    task_set = spec.resolve(cfg.eval)

    inside = []
    for _ in range(2):
        started = time.monotonic()
        result = harness.run(task_set, cfg.eval, model=trainer.model, tokenizer=trainer.processing_class)
        inside.append((time.monotonic() - started, result.scores["tiny_arith_mc"]["acc"]["value"]))

    base, tasks = resolve_model_path(cfg.model), spec.SHIPPED_TASKS / "tiny_arith"
    out = folder / "cli"
    command = [str(Path(sys.executable).with_name("lm_eval")), "run", "--model", "hf", "--model_args",
               f"pretrained={base},peft={adapter},dtype=float32", "--tasks", "tiny_arith_mc", "--include_path",
               str(tasks), "--limit", str(limit), "--batch_size", str(cfg.eval.batch_size), "--device", "cpu",
               "--seed", str(cfg.eval.seed), "--output_path", str(out)]
    started = time.monotonic()
    subprocess.run(command, cwd=tasks, check=True, capture_output=True, text=True)  # data_files: relative to here
    bare = time.monotonic() - started
    found = next(out.rglob("results*.json"))
    bare_acc = json.loads(found.read_text())["results"]["tiny_arith_mc"]["acc,none"]

    print(f"tiny_arith_mc, {limit} items, one checkpoint (LoRA adapter on the tiny model), CPU")
    print(f"{'':<34}{'seconds':>9}  acc")
    print(f"{'inside the job, first evaluation':<34}{inside[0][0]:>9.2f}  {inside[0][1]:.4f}")
    print(f"{'inside the job, every later one':<34}{inside[1][0]:>9.2f}  {inside[1][1]:.4f}")
    print(f"{'bare lm_eval CLI (peft=adapter)':<34}{bare:>9.2f}  {bare_acc:.4f}")
    print(f"ratio inside / bare: first {inside[0][0] / bare:.2f}, later {inside[1][0] / bare:.2f} (goal: at most 1.0)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
