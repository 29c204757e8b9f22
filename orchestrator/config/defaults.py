"""The settings a TRL user would choose, filled in where the config leaves them to the job (``null``: auto).

A real model fine-tuned with the CPU demo's settings diverges or runs out of memory: a learning rate of 5e-3
(right for the built-in ~100k-parameter Llama, ruinous for an 8B model under LoRA), activations kept for the
backward pass, float32 compute on a GPU with bfloat16. So ``train.learning_rate``, ``train.gradient_checkpointing``,
``train.mixed_precision``, ``distributed.processes_per_node`` and ``tracking.log_system_metrics`` default to auto, and each composed config gets the
value that fits its recipe, adapter, model and GPU, here, once; what the job runs, prints (``--cfg job``), logs and
fingerprints is that value, and any value given on the command line or in a preset wins.

The table follows TRL's own defaults and its documented practice: SFTConfig's 2e-5 for a full fine-tune, 2e-4 for
LoRA and QLoRA adapters (TRL's PEFT examples); DPOConfig's 1e-6, 5e-6 with adapters; GRPOConfig's 1e-6, 1e-5 with
adapters. Gradient checkpointing is on, as TRL's configs default it, except for the built-in tiny model (the CPU
demo, where recomputing is pure cost). Mixed precision is bf16 on a GPU that has it, fp16 (with loss scaling) on one
that does not and whose weights are not stored as bfloat16, and off on a CPU. Training processes are one per GPU of a
node; on a CPU machine, two (the CPU demonstration of DDP and ZeRO). MLflow's system metrics are on for a GPU job.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.gpus import GPUS, is_cpu

BUILTIN_PREFIX = "builtin:"
TINY_LEARNING_RATE = 5e-3  # the built-in tiny model on its arithmetic task: the CPU demo's rate
# (recipe, adapters) -> the peak learning rate a TRL user starts from
LEARNING_RATES = {
    ("sft", True): 2e-4,
    ("sft", False): 2e-5,
    ("qlora", True): 2e-4,
    ("qlora", False): 2e-4,  # QLoRA always trains adapters
    ("dpo", True): 5e-6,
    ("dpo", False): 1e-6,
    ("grpo", True): 1e-5,
    ("grpo", False): 1e-6,
}
CPU_PROCESSES_PER_NODE = 2


def is_builtin(cfg: Any) -> bool:
    return str(cfg.model.name_or_path).startswith(BUILTIN_PREFIX)


def learning_rate(cfg: Any) -> float:
    if is_builtin(cfg):
        return TINY_LEARNING_RATE
    adapters = str(cfg.recipe.name) == "qlora" or str(cfg.recipe.peft) == "lora"
    return LEARNING_RATES.get((str(cfg.recipe.name), adapters), 2e-5)


def mixed_precision(cfg: Any) -> str:
    gpu = str(cfg.compute.gpu_type).lower()
    if is_cpu(gpu) or int(cfg.compute.gpus_per_node or 0) == 0:
        return "no"
    if GPUS.get(gpu) is None or GPUS[gpu].bf16:  # an unknown GPU type is taken as a current one
        return "bf16"
    return "no" if str(cfg.model.dtype) == "bfloat16" else "fp16"


def processes_per_node(cfg: Any) -> int:
    if str(cfg.distributed.name) == "none":
        return 1
    gpus = int(cfg.compute.gpus_per_node or 0)
    return gpus if gpus > 0 else CPU_PROCESSES_PER_NODE


def fill_auto(cfg: Any) -> None:
    """Set each auto (``null``) setting of ``cfg`` in place to the value that fits the job (the table above)."""
    train = cfg.train
    if train.learning_rate is None:
        train.learning_rate = learning_rate(cfg)
    if train.gradient_checkpointing is None:
        train.gradient_checkpointing = not is_builtin(cfg)
    if str(train.mixed_precision) == "auto":
        train.mixed_precision = mixed_precision(cfg)
    if cfg.distributed.processes_per_node is None:
        cfg.distributed.processes_per_node = processes_per_node(cfg)
    if cfg.tracking.log_system_metrics is None:  # MLflow's CPU/GPU sampling: beside the cost of a GPU job
        cfg.tracking.log_system_metrics = int(cfg.compute.gpus_per_node or 0) > 0
