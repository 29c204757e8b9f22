"""The closed choices of the config, as ``StrEnum`` types of the schemas' fields (``orchestrator.config.schema``).

Each member's name is its value, so a choice composes from YAML and overrides by that string, compares equal to
it (``cfg.recipe.name == "sft"``), and serialises as it did when the fields were plain strings: in ``config.yaml``,
the trajectory fingerprint of every checkpoint, MLflow params and the worker's overrides.
"""
from __future__ import annotations

from enum import StrEnum


class Recipe(StrEnum):
    sft = "sft"
    dpo = "dpo"
    qlora = "qlora"
    grpo = "grpo"


class Peft(StrEnum):
    lora = "lora"
    full = "full"


class Quantization(StrEnum):
    none = "none"
    nf4 = "nf4"


class EvalMetric(StrEnum):
    auto = "auto"
    exact_match = "exact_match"
    contains = "contains"
    none = "none"


class VllmMode(StrEnum):
    colocate = "colocate"
    server = "server"


class Dtype(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class DataSource(StrEnum):
    synthetic = "synthetic"
    jsonl = "jsonl"
    hub = "hub"
    mix = "mix"


class MixSource(StrEnum):
    """The sources of one ``data.mix`` entry (a mix holds no mix)."""

    jsonl = "jsonl"
    hub = "hub"
    synthetic = "synthetic"


class MixedPrecision(StrEnum):
    no = "no"
    bf16 = "bf16"
    fp16 = "fp16"


class PackingStrategy(StrEnum):
    bfd = "bfd"
    bfd_split = "bfd_split"
    wrapped = "wrapped"


class FinalWeights(StrEnum):
    last = "last"
    best = "best"


class Provider(StrEnum):
    auto = "auto"
    aws = "aws"
    gcp = "gcp"
    azure = "azure"
    none = "none"


class Progress(StrEnum):
    auto = "auto"
    bar = "bar"
    lines = "lines"
    off = "off"


class Backend(StrEnum):
    local = "local"
    slurm = "slurm"
    skypilot = "skypilot"
    kubernetes = "kubernetes"


class Distributed(StrEnum):
    none = "none"
    ddp = "ddp"
    zero2 = "zero2"
    zero3 = "zero3"
    fsdp = "fsdp"


def choices(enum: type[StrEnum]) -> tuple[str, ...]:
    """The values of ``enum`` in declaration order, as plain strings."""
    return tuple(member.value for member in enum)
