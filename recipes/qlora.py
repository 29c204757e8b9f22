"""QLoRA: the base quantised to 4-bit NF4 with bitsandbytes (double quantisation), LoRA adapters on top.

Training is supervised (TRL's SFTTrainer, as in ``recipes.sft``); only the
adapters train. bitsandbytes' 4-bit layers run on CPU too, so the tests
exercise real quantisation.
"""

from __future__ import annotations

from recipes import sft


def build_trainer(
    cfg, *, train_dataset, eval_dataset, output_dir: str, callbacks: list, quantization: str = "nf4", prepared=None
):
    return sft.build_trainer(
        cfg,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        output_dir=output_dir,
        callbacks=callbacks,
        quantization="nf4",
        prepared=prepared,
    )


preload = sft.preload
evaluate = sft.evaluate
accuracy = sft.accuracy
