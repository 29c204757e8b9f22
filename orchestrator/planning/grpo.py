"""What recipe=grpo adds to the planner's figures: longer rows, a reference model, the generation KV cache.

- Rows are the prompt (up to ``data.max_length``) and its completion (``recipe.max_completion_length``).
- A reference model is held when ``recipe.beta > 0`` on a full fine-tune (with LoRA it is the base with
  the adapters off, no second copy).
- Sampling keeps keys and values for every sequence of the generation batch this process generates at
  once (``per_device_batch_size x steps_per_generation``) at full length: 2 x layers x kv_dim x length x
  sequences, in the compute dtype. vLLM (``recipe.use_vllm``) keeps its own cache in its memory share.
"""

from __future__ import annotations

from typing import Any, Mapping

from orchestrator.planning.model_shape import _dims


def is_grpo(cfg: Any) -> bool:
    return str(cfg.recipe.name) == "grpo"


def sequence_length(cfg: Any) -> int:
    """Tokens per row: the prompt's (data.max_length) and, under GRPO, the completion's."""
    extra = int(cfg.recipe.max_completion_length) if is_grpo(cfg) else 0
    return int(cfg.data.max_length) + extra


def holds_reference(cfg: Any) -> bool:
    return is_grpo(cfg) and float(cfg.recipe.beta) > 0 and str(cfg.recipe.peft) == "full"


def generation_cache_bytes(cfg: Any, model_config: Mapping[str, Any], compute_width: int) -> int:
    """The KV cache of one process's generation batch under transformers' generate (0: not GRPO, or vLLM)."""
    if not is_grpo(cfg) or bool(cfg.recipe.use_vllm):
        return 0
    from recipes.rewards import generation_batch

    d = _dims(model_config)
    _, steps = generation_batch(cfg)
    sequences = int(cfg.train.per_device_batch_size) * steps
    return 2 * d["layers"] * d["kv_dim"] * sequence_length(cfg) * sequences * int(compute_width)
