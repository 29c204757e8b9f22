"""Supervised fine-tuning with TRL's SFTTrainer: LoRA by default, full fine-tune with recipe.peft=full.

``recipe.quantization=nf4`` loads the base in 4-bit NF4: that is QLoRA, as ``recipe=qlora``.

Data: prompt/completion rows (loss on the completion only) or chat ``messages``.
Quality (``recipes.evaluation``): eval loss and perplexity, and the share of greedy generations on the
held-out split that match the answer (``recipe.eval_metric``).
"""

from __future__ import annotations

from recipes import common, evaluation


def preload() -> None:
    """Import what ``build_trainer`` imports (a supervisor forking attempts imports it once)."""
    from trl import SFTConfig, SFTTrainer  # noqa: F401


def build_trainer(
    cfg,
    *,
    train_dataset,
    eval_dataset,
    output_dir: str,
    callbacks: list,
    quantization: str | None = None,
    prepared=None,
):
    """``prepared``: the sets an earlier attempt's trainer prepared from these rows (``train``, ``eval``; the
    prepared-dataset cache, ``orchestrator.attempt.datacache``), handed to TRL as they are: preparing them
    again is not the identity (a packed set would be packed twice). The raw ``eval_dataset`` still feeds the
    generation metric's prompts."""
    from trl import SFTConfig, SFTTrainer

    path = common.resolve_model_path(cfg.model)
    tokenizer = common.tokenizer_for(cfg, path)
    # recipe.quantization=nf4 loads a 4-bit base (recipes.qlora passes it explicitly)
    model = common.load_model(
        path, cfg.model, quantization=quantization or cfg.recipe.quantization, mixed_precision=cfg.train.mixed_precision
    )
    peft_config = common.lora_config(cfg.recipe) if cfg.recipe.peft == "lora" else None
    t = cfg.train
    args = SFTConfig(
        **common.training_kwargs(cfg, output_dir),
        packing=t.packing,
        packing_strategy=str(t.packing_strategy),
        padding_free=t.padding_free,
        dataset_kwargs={"skip_prepare_dataset": True} if prepared is not None else None,
    )
    return SFTTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset if prepared is None else prepared["train"],
        eval_dataset=eval_dataset if prepared is None else prepared.get("eval"),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=evaluation.with_quality_callbacks(cfg, callbacks, tokenizer, eval_dataset),
    )


def evaluate(trainer, cfg, eval_dataset=None) -> dict:
    """Eval loss, perplexity and the generation metric on the trainer's held-out split."""
    return evaluation.evaluate(trainer, cfg)


def accuracy(trainer, cfg, eval_dataset) -> float:
    return evaluation.accuracy(trainer, cfg, eval_dataset)
