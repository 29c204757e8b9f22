"""Direct preference optimisation with TRL's DPOTrainer and LoRA.

The reference model is the frozen base: with a PEFT model and no ``ref_model``,
TRL computes reference log-probs with the adapters disabled, so no second copy
of the weights is held. Data: prompt/chosen/rejected rows. ``recipe.quantization=nf4`` trains
DPO on a 4-bit base (the loading path of ``recipes.qlora``); ``recipe.lora_dropout`` is kept.
Quality: eval reward accuracy and margin, plus generation accuracy against ``chosen``.
"""
from __future__ import annotations

from recipes import common

QUALITY_METRIC = "eval_reward_accuracy"


def build_trainer(cfg, *, train_dataset, eval_dataset, output_dir: str, callbacks: list, quantization: str | None = None):
    from trl import DPOConfig, DPOTrainer

    path = common.resolve_model_path(cfg.model)
    tokenizer = common.tokenizer_for(cfg, path)
    # recipe.quantization=nf4 loads a 4-bit base (recipes.qlora passes it explicitly)
    model = common.load_model(path, cfg.model, quantization=quantization or cfg.recipe.quantization,
                              mixed_precision=cfg.train.mixed_precision)
    # TRL's disable_dropout (default true) zeroes every dropout, LoRA's too, after PEFT wraps the
    # model: keep it only when no adapter dropout was asked for. With recipe.lora_dropout > 0 the
    # model's own dropout (its config's, often 0) trains on too, as under SFT.
    args = DPOConfig(**common.training_kwargs(cfg, output_dir), beta=cfg.recipe.dpo_beta,
                     disable_dropout=not cfg.recipe.lora_dropout > 0)
    return DPOTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=common.lora_config(cfg.recipe),
        callbacks=callbacks,
    )


def evaluate(trainer, cfg, eval_dataset) -> dict:
    raw = trainer.evaluate(eval_dataset=eval_dataset)
    metrics = {
        "eval_loss": float(raw["eval_loss"]),
        "eval_reward_accuracy": float(raw.get("eval_rewards/accuracies", float("nan"))),
        "eval_reward_margin": float(raw.get("eval_rewards/margins", float("nan"))),
    }
    metrics["eval_accuracy"] = accuracy(trainer, cfg, eval_dataset)
    return metrics


def accuracy(trainer, cfg, eval_dataset) -> float:
    prompts, answers = common.eval_prompts(eval_dataset, trainer.processing_class)
    return common.generation_accuracy(
        trainer.model, trainer.processing_class, prompts, answers, cfg.recipe.eval_generate_max_new_tokens
    )
