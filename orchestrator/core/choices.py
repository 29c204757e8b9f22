"""The closed choices of the config, as ``StrEnum`` types of the schemas' fields (``orchestrator.config.schema``).

Each member's name is its value (``auto()`` of a ``StrEnum``: the name, lower-case), so a choice composes from YAML
and overrides by that string, compares equal to it (``cfg.recipe.name == "sft"``), and serialises as it did when the
fields were plain strings: in ``config.yaml``, the trajectory fingerprint of every checkpoint, MLflow params and the
worker's overrides. The members sit on one line per type: the declarations read as a table.
"""

from __future__ import annotations

from enum import StrEnum, auto


class Recipe(StrEnum):
    """``recipe.name``: the TRL trainer the job trains with."""

    sft, dpo, qlora, grpo = auto(), auto(), auto(), auto()


class Peft(StrEnum):
    """``recipe.peft``: adapters, or every weight trained."""

    lora, full = auto(), auto()


class Quantization(StrEnum):
    """``recipe.quantization``: the base model's weights as stored in training."""

    none, nf4 = auto(), auto()


class EvalMetric(StrEnum):
    """``recipe.eval_metric``: the held-out quality metric."""

    auto, exact_match, contains, none = auto(), auto(), auto(), auto()


class VllmMode(StrEnum):
    """``recipe.vllm_mode``: where GRPO's vLLM generates."""

    colocate, server = auto(), auto()


class Dtype(StrEnum):
    """``model.dtype``: how the weights are stored."""

    float32, bfloat16, float16 = auto(), auto(), auto()


class DataSource(StrEnum):
    """``data.source``: where the training rows come from."""

    synthetic, jsonl, hub, mix = auto(), auto(), auto(), auto()


class MixSource(StrEnum):
    """The sources of one ``data.mix`` entry (a mix holds no mix)."""

    jsonl, hub, synthetic = auto(), auto(), auto()


class MixedPrecision(StrEnum):
    """``train.mixed_precision``: accelerate's autocast; ``auto`` is settled at compose (``config.defaults``)."""

    auto, no, bf16, fp16 = auto(), auto(), auto(), auto()


class PackingStrategy(StrEnum):
    """``train.packing_strategy``: TRL's packing."""

    bfd, bfd_split, wrapped = auto(), auto(), auto()


class FinalWeights(StrEnum):
    """``checkpoint.final``: what ``<run>/final/`` holds."""

    last, best = auto(), auto()


class Provider(StrEnum):
    """``preemption.provider``: whose spot notices are watched."""

    auto, aws, gcp, azure, none = auto(), auto(), auto(), auto(), auto()


class Progress(StrEnum):
    """``tracking.progress``: what a person watching sees."""

    auto, bar, lines, off = auto(), auto(), auto(), auto()


class Backend(StrEnum):
    """``backend.name``: where the job runs."""

    local, slurm, skypilot, kubernetes = auto(), auto(), auto(), auto()


class Distributed(StrEnum):
    """``distributed.name``: how the ranks share the work."""

    none, ddp, zero2, zero3, fsdp = auto(), auto(), auto(), auto(), auto()


class Sampler(StrEnum):
    """``sweep.sampler``: Optuna's sampler of the trials' parameters (grid: every combination)."""

    random, tpe, grid = auto(), auto(), auto()


class Pruner(StrEnum):
    """``sweep.pruner``: Optuna's pruner of that name (``asha``: successive_halving's earlier name, kept)."""

    none, successive_halving, hyperband, asha = auto(), auto(), auto(), auto()


class Direction(StrEnum):
    """``sweep.direction``: which way the sweep's metric is better (auto: minimize loss and perplexity)."""

    auto, maximize, minimize = auto(), auto(), auto()


def choices(enum: type[StrEnum]) -> tuple[str, ...]:
    """The values of ``enum`` in declaration order, as plain strings."""
    return tuple(member.value for member in enum)
