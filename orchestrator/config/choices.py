"""The closed choices of the config, as ``StrEnum`` types of the schemas' fields (``orchestrator.config.schema``).

Each member's name is its value, so a choice composes from YAML and overrides by that string, compares equal to
it (``cfg.recipe.name == "sft"``), and serialises as it did when the fields were plain strings: in ``config.yaml``,
the trajectory fingerprint of every checkpoint, MLflow params and the worker's overrides.
"""
from __future__ import annotations

from enum import StrEnum


def _closed(name: str, members: str, doc: str = "") -> type[StrEnum]:
    """A ``StrEnum`` whose members' names are their values (``members``: the names, space-separated, in order)."""
    enum = StrEnum(name, [(m, m) for m in members.split()], module=__name__)
    if doc:
        enum.__doc__ = doc
    return enum


Recipe = _closed("Recipe", "sft dpo qlora grpo")
Peft = _closed("Peft", "lora full")
Quantization = _closed("Quantization", "none nf4")
EvalMetric = _closed("EvalMetric", "auto exact_match contains none")
VllmMode = _closed("VllmMode", "colocate server")
Dtype = _closed("Dtype", "float32 bfloat16 float16")
DataSource = _closed("DataSource", "synthetic jsonl hub mix")
MixSource = _closed("MixSource", "jsonl hub synthetic", doc="The sources of one ``data.mix`` entry (a mix holds no mix).")
MixedPrecision = _closed("MixedPrecision", "no bf16 fp16")
PackingStrategy = _closed("PackingStrategy", "bfd bfd_split wrapped")
FinalWeights = _closed("FinalWeights", "last best")
Provider = _closed("Provider", "auto aws gcp azure none")
Progress = _closed("Progress", "auto bar lines off")
Backend = _closed("Backend", "local slurm skypilot kubernetes")
Distributed = _closed("Distributed", "none ddp zero2 zero3 fsdp")


def choices(enum: type[StrEnum]) -> tuple[str, ...]:
    """The values of ``enum`` in declaration order, as plain strings."""
    return tuple(member.value for member in enum)
