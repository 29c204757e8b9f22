"""Group relative policy optimisation with TRL's GRPOTrainer: LoRA by default, full fine-tune with recipe.peft=full.

Data: prompt rows; their other columns (``answer`` on data=synthetic) reach the reward functions
(``recipe.reward_funcs``, ``recipes.rewards``). On CPU TRL samples with transformers' ``generate``.

Exact resume (docs/grpo.md): TRL keeps the generation batch it trains on for
``steps_per_generation x num_iterations`` micro-steps in ``_buffered_inputs`` and its micro-step
counter in ``_step``; neither is in its checkpoints, so a resume inside a generation batch samples
another batch and shifts every later generation. ``ExactResumeGRPOTrainer`` writes both into each
checkpoint (``grpo_state.json``, ``grpo_buffer_rank<N>.safetensors``; the store hashes them with the
rest) and reads them back, so the batch in flight is trained on exactly as it would have been.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

from recipes import common, evaluation

log = logging.getLogger(__name__)

STATE_FILE = "grpo_state.json"


def preload() -> None:
    """Import what ``build_trainer`` imports (a supervisor forking attempts imports it once)."""
    from trl import GRPOConfig, GRPOTrainer  # noqa: F401


def grpo_args(cfg, output_dir: str):
    """GRPOConfig from the shared training arguments and recipe.grpo's own (TRL's names)."""
    from trl import GRPOConfig

    from recipes.rewards import generation_batch

    r = cfg.recipe
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    # data.max_length is SFT/DPO's truncation; GRPO samples up to recipe.max_completion_length after the prompt
    kw = {k: v for k, v in common.training_kwargs(cfg, output_dir).items() if k in names}
    _, steps = generation_batch(cfg)
    return GRPOConfig(
        **kw,
        num_generations=int(r.num_generations),
        steps_per_generation=steps,
        num_iterations=int(r.num_iterations),
        beta=float(r.beta),
        max_completion_length=int(r.max_completion_length),
        temperature=float(r.temperature),
        use_vllm=bool(r.use_vllm),
        vllm_mode=str(r.vllm_mode),
        reward_weights=list(r.reward_weights) if r.reward_weights is not None else None,
        disable_dropout=not r.lora_dropout > 0,
        log_completions=False,
    )


def build_trainer(cfg, *, train_dataset, eval_dataset, output_dir: str, callbacks: list, reward_cache=None):
    """``reward_cache``: where rewards are kept across attempts (``orchestrator.checkpoint.reward_cache``)."""
    from recipes.rewards import reward_functions

    path = common.resolve_model_path(cfg.model)
    tokenizer = common.tokenizer_for(cfg, path)
    tokenizer.padding_side = "left"  # GRPO generates after the prompt
    model = common.load_model(
        path, cfg.model, quantization=cfg.recipe.quantization, mixed_precision=cfg.train.mixed_precision
    )
    trainer = exact_resume_trainer()(
        model=model,
        reward_funcs=reward_functions(cfg, reward_cache if cfg.recipe.reward_cache else None),
        args=grpo_args(cfg, output_dir),
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=common.lora_config(cfg.recipe) if cfg.recipe.peft == "lora" else None,
        callbacks=callbacks,
    )
    trainer.held_out = eval_dataset
    return trainer


def exact_resume_trainer():
    """GRPOTrainer whose checkpoints hold its micro-step counter and the generation batch in flight."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
    from trl import GRPOTrainer

    class ExactResumeGRPOTrainer(GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.use_vllm:  # the rollouts after a resume come from the restored policy (recipes/grpo_vllm.py)
                from recipes.grpo_vllm import WeightVersion

                self.weight_version = WeightVersion(self)

        def _save_checkpoint(self, model, trial):
            super()._save_checkpoint(model, trial)
            folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            save_generation_state(self, folder)

        def _load_optimizer_and_scheduler(self, checkpoint):
            super()._load_optimizer_and_scheduler(checkpoint)
            if checkpoint is not None:
                load_generation_state(self, Path(checkpoint))
                if getattr(self, "weight_version", None) is not None:
                    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
                    self.weight_version.resumed(int(state["global_step"]))

    return ExactResumeGRPOTrainer


def generate_every(trainer) -> int:
    return int(trainer.args.steps_per_generation) * int(trainer.num_iterations)


def save_generation_state(trainer, folder: Path) -> None:
    """The micro-step counter, and this rank's buffered generation batch when the checkpoint falls inside it."""
    from safetensors.torch import save_file

    rank = trainer.accelerator.process_index
    inside = trainer._buffered_inputs is not None and trainer._step % generate_every(trainer) != 0
    scalars: list = []
    if inside:
        tensors = {}
        for i, part in enumerate(trainer._buffered_inputs):
            kept = {}
            for name, value in part.items():
                if hasattr(value, "detach"):
                    tensors[f"{i}/{name}"] = value.detach().cpu().contiguous().clone()
                elif value is None or isinstance(value, (int, float)):
                    kept[name] = value
                else:
                    raise TypeError(
                        f"GRPO's generation batch holds {name} of type {type(value).__name__}, which "
                        "this checkpoint format does not store"
                    )
            scalars.append(kept)
        save_file(tensors, str(folder / f"grpo_buffer_rank{rank}.safetensors"))
    if rank == 0 or inside:
        state = {
            "step": int(trainer._step),
            "generate_every": generate_every(trainer),
            "buffer": scalars if inside else None,
            "metrics": {k: list(v) for k, v in trainer._metrics["train"].items()},
        }
        name = STATE_FILE if rank == 0 else f"grpo_state_rank{rank}.json"
        (folder / name).write_text(json.dumps(state))


def load_generation_state(trainer, folder: Path) -> None:
    """Undo what TRL forgets on resume: ``_step``, and the generation batch the checkpoint fell inside."""
    rank = trainer.accelerator.process_index
    path = folder / (STATE_FILE if rank == 0 else f"grpo_state_rank{rank}.json")
    main_state = folder / STATE_FILE
    if not main_state.exists():
        return  # a checkpoint of another recipe's format: TRL's own resume
    state = json.loads((path if path.exists() else main_state).read_text())
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"{STATE_FILE} holds step {step!r}, not a micro-step count")
    if state.get("generate_every") != generate_every(trainer):
        raise ValueError(
            f"{STATE_FILE} was written with a generation every {state.get('generate_every')} micro-steps, "
            f"this job generates every {generate_every(trainer)}"
        )
    trainer._step = step
    trainer._buffered_inputs = None
    trainer._metrics["train"].update(read_metrics(state.get("metrics") or {}))
    if step % generate_every(trainer) and path.exists() and state.get("buffer") is not None:
        buffer = folder / f"grpo_buffer_rank{rank}.safetensors"
        try:
            trainer._buffered_inputs = read_buffer(
                buffer, state["buffer"], int(trainer.args.steps_per_generation), trainer.accelerator.device
            )
        except (ValueError, OSError) as err:  # sound hashes, unusable values (a NaN): TRL generates it again
            log.warning(
                "the batch in flight in %s is unusable (%s); it is generated again from micro-step %d (the "
                "resume is not bit-exact for the rest of that batch)",
                buffer.name,
                err,
                step,
            )
            return
        log.info(
            "resumed inside a generation batch: micro-step %d, the batch in flight restored from the checkpoint", step
        )


def read_metrics(metrics) -> dict:
    """TRL's metrics gathered since the last log (rewards, lengths, KL): numbers only (NaN is TRL's "none this
    batch"; they are logged, never trained on). On resume they make the next logged means the uninterrupted run's."""
    if not isinstance(metrics, dict):
        raise ValueError(f"{STATE_FILE}: metrics is not a mapping")
    out = {}
    for name, values in metrics.items():
        if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
        ):
            raise ValueError(f"{STATE_FILE}: metric {str(name)[:60]!r} holds a value that is not a number")
        out[str(name)] = [float(v) for v in values]
    return out


def read_buffer(path: Path, scalars: list, parts: int, device) -> list:
    """The buffered generation batch: ``parts`` dicts of tensors (safetensors: no pickle), floats finite."""
    import torch
    from safetensors.torch import load_file

    if not isinstance(scalars, list) or len(scalars) != parts or not all(isinstance(s, dict) for s in scalars):
        raise ValueError(f"{path.name}: the batch in flight should have {parts} parts")
    tensors = load_file(str(path))
    out = [dict(s) for s in scalars]
    for key, value in tensors.items():
        index, _, name = key.partition("/")
        if not index.isdigit() or int(index) >= parts or not name:
            raise ValueError(f"{path.name}: unexpected tensor {key!r}")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{path.name}: {key} holds a non-finite number")
        out[int(index)][name] = value.to(device)
    for part in out:
        for name, value in part.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{path.name}: {name} is not finite")
    return out


def eval_answers(eval_dataset) -> tuple[list[str], list[str]]:
    prompts = [row["prompt"] for row in eval_dataset]
    answers = [str(row.get("answer", "")) for row in eval_dataset]
    return prompts, answers


def evaluate(trainer, cfg, eval_dataset=None) -> dict:
    """The generation metric (greedy, ``recipe.eval_metric``) on the held-out prompts' answers."""
    held_out = eval_dataset if eval_dataset is not None else getattr(trainer, "held_out", None)
    if held_out is None or "answer" not in held_out.column_names:
        return {}
    return {"eval_accuracy": accuracy(trainer, cfg, held_out)}


def accuracy(trainer, cfg, eval_dataset) -> float:
    return evaluation.accuracy(trainer, cfg, eval_dataset, eval_answers)
