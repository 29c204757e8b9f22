"""Direct preference optimisation with TRL's DPOTrainer and LoRA.

The reference model is the frozen base: with a PEFT model and no ``ref_model``,
TRL computes reference log-probs with the adapters disabled, so no second copy
of the weights is held. Data: prompt/chosen/rejected rows. ``recipe.quantization=nf4`` trains
DPO on a 4-bit base (the loading path of ``recipes.qlora``); ``recipe.lora_dropout`` is kept.
Quality (``recipes.evaluation``): reward accuracy and margin on the held-out pairs, plus the generation
metric against ``chosen`` (``recipe.eval_metric``).
"""

from __future__ import annotations

import hashlib
import json
import logging

from recipes import common, evaluation

log = logging.getLogger(__name__)


def preload() -> None:
    """Import what ``build_trainer`` imports (a supervisor forking attempts imports it once)."""
    from trl import DPOConfig, DPOTrainer  # noqa: F401


def build_trainer(
    cfg,
    *,
    train_dataset,
    eval_dataset,
    output_dir: str,
    callbacks: list,
    quantization: str | None = None,
    ref_log_probs=None,
):
    """``ref_log_probs``: where ``recipe.precompute_ref_log_probs`` keeps the reference log-probs across attempts
    (``orchestrator.checkpoint.ref_logps.RefLogProbStore``); None: TRL's own (recomputed on every start)."""
    from trl import DPOConfig, DPOTrainer

    path = common.resolve_model_path(cfg.model)
    tokenizer = common.tokenizer_for(cfg, path)
    # recipe.quantization=nf4 loads a 4-bit base (recipes.qlora passes it explicitly)
    model = common.load_model(
        path, cfg.model, quantization=quantization or cfg.recipe.quantization, mixed_precision=cfg.train.mixed_precision
    )
    # TRL's disable_dropout (default true) zeroes every dropout, LoRA's too, after PEFT wraps the
    # model: keep it only when no adapter dropout was asked for. With recipe.lora_dropout > 0 the
    # model's own dropout (its config's, often 0) trains on too, as under SFT.
    precompute = bool(cfg.recipe.precompute_ref_log_probs)
    args = DPOConfig(
        **common.training_kwargs(cfg, output_dir),
        beta=cfg.recipe.dpo_beta,
        disable_dropout=not cfg.recipe.lora_dropout > 0,
        precompute_ref_log_probs=precompute,
    )
    trainer_class = stored_ref_logps_trainer(DPOTrainer, ref_log_probs) if precompute and ref_log_probs else DPOTrainer
    return trainer_class(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=common.lora_config(cfg.recipe),
        callbacks=evaluation.with_quality_callbacks(cfg, callbacks, tokenizer, eval_dataset),
    )


def stored_ref_logps_trainer(base, store):
    """TRL's DPOTrainer with its reference log-probs read from ``store`` when they are there, written to it when not."""

    class StoredRefLogpsDPOTrainer(base):
        def _precompute_ref_logps(self, dataset, name, batch_size):
            return precompute_or_load(
                super()._precompute_ref_logps,
                dataset,
                name,
                batch_size,
                store,
                model_fingerprint=self._precompute_model_hash,
            )

    return StoredRefLogpsDPOTrainer


def precompute_or_load(compute, dataset, name: str, batch_size: int, store, *, model_fingerprint: str):
    """``compute(dataset, name, batch_size)`` (TRL's precompute), or its stored result.

    Rank 0 decides and reads, every rank gets its arrays (TRL's precompute is collective). Computing
    runs under a forked RNG, so whether an attempt computed or loaded leaves the training RNG the same.
    """
    import numpy as np
    import torch
    from datasets import Dataset, concatenate_datasets

    from orchestrator.core import ranks as dist

    key = store.key(
        split=name,
        data_fingerprint=tokens_fingerprint(dataset),
        model_fingerprint=model_fingerprint,
        batch_size=batch_size,
    )
    arrays = dist.broadcast(store.load(key, rows=len(dataset)) if dist.is_main() else None)
    main = dist.is_main()
    if arrays is not None:
        if main:
            log.info("reference log-probs of the %s split loaded from storage (%s), not recomputed", name, key[:12])
        return concatenate_datasets([dataset, Dataset.from_dict({k: arrays[k] for k in sorted(arrays)})], axis=1)
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        out = compute(dataset, name, batch_size)
    columns = out.select_columns(["ref_chosen_logps", "ref_rejected_logps"]).with_format("numpy")
    store.save(key, {c: np.ascontiguousarray(columns[c]) for c in columns.column_names})
    if main:
        log.info(
            "reference log-probs of the %s split computed (%d pairs) and stored (%s)", name, len(dataset), key[:12]
        )
    return out


def tokens_fingerprint(dataset) -> str:
    """SHA-256 over the tokenized split's columns, in row order (what the reference log-probs depend on)."""
    h = hashlib.sha256()
    for column in sorted(dataset.column_names):
        h.update(column.encode())
        h.update(json.dumps(dataset[column], default=str).encode())
    return h.hexdigest()


def evaluate(trainer, cfg, eval_dataset=None) -> dict:
    """Eval loss, reward accuracy and margin, and the generation metric on the trainer's held-out pairs."""
    return evaluation.evaluate(trainer, cfg)


def accuracy(trainer, cfg, eval_dataset) -> float:
    return evaluation.accuracy(trainer, cfg, eval_dataset)
