"""What an attempt imports before its first step, and what it keeps out.

The worker keeps the quantisation stack and DeepSpeed out of jobs that do not use them (before transformers is
imported); a process that forks attempts or ranks (``orchestrator.process.warm_start``, ``orchestrator.process.forked_ranks``)
imports the rest once, before its first fork.
"""

from __future__ import annotations

import sys
from typing import Any


def skip_unused_quantisation_stack(cfg) -> None:
    """Keep bitsandbytes out of a job that quantises nothing.

    PEFT and transformers import bitsandbytes whenever it is installed (and it
    pulls torch's inductor in): about 1.5 s of every attempt's start-up on
    this stack, for nothing unless the base is 4-bit. Marking the module absent
    before transformers is imported makes their availability checks say
    "not installed". Must run before anything imports transformers.
    """
    from recipes.common import quantisation_stack_needed

    if not quantisation_stack_needed(cfg) and "bitsandbytes" not in sys.modules:
        sys.modules["bitsandbytes"] = None  # type: ignore[assignment]  # importlib.util.find_spec -> None; import -> ImportError


def skip_unused_deepspeed(cfg) -> None:
    """Keep DeepSpeed out of a job that does not train with it (``distributed`` other than zero2/zero3).

    Accelerate imports DeepSpeed whenever it is installed, when TRL's trainer asks whether the model is
    wrapped (``extract_model_from_parallel``), and DeepSpeed imports MLflow: about 2.2 s of CPU in every
    attempt's start-up on this stack, for nothing. Same mechanism as ``skip_unused_quantisation_stack``.
    """
    if str(cfg.distributed.name) not in ("zero2", "zero3") and "deepspeed" not in sys.modules:
        sys.modules["deepspeed"] = None  # type: ignore[assignment]


def settle_deepspeed(cfg) -> None:
    """For a ZeRO job on CPU machines (``compute.gpus_per_node=0``): run DeepSpeed's op-compatibility probe now,
    while this process has one thread, and mark its CPU shared-memory op unavailable.

    The probe (``deepspeed.ops.__compatible_ops__``, once per process) compiles test programs with the process's
    file descriptor 2 pointed at a temporary file, so whatever another thread logs to stderr meanwhile is lost
    (rank 0's background restore's lines, seen here). The op, ``deepspeed_shm_comm``, serves only DeepSpeed's
    tensor-parallel inference, never ZeRO's collectives (torch.distributed's), yet DeepSpeed's communication
    compiles it on its first start on a machine (about 45 s on 2 cores) and loads it in every rank after. A
    process that forks ranks runs this before forking, and they inherit the result. A GPU job is left as it was:
    the probe queries the GPUs, which a process that forks ranks must not do first.
    """
    if str(cfg.distributed.name) not in ("zero2", "zero3") or int(cfg.compute.gpus_per_node) != 0:
        return
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def import_stack(cfg: Any) -> None:
    """The modules an attempt of ``cfg`` imports before its first step (the recipe's trainer, PEFT, datasets).
    The libraries' telemetry is switched off first, as the worker does: they read the switch when imported."""
    from orchestrator.tracking.run import quiet_telemetry

    quiet_telemetry()
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import transformers  # noqa: F401

    from orchestrator.attempt import build, checkpoints, restart, runner  # noqa: F401
    from recipes import recipe_for

    preload = getattr(recipe_for(str(cfg.recipe.name)), "preload", None)
    if preload is not None:
        preload()
    if str(cfg.distributed.name) in ("zero2", "zero3"):
        import deepspeed  # noqa: F401

        settle_deepspeed(cfg)
    if cfg.tracking.enabled:
        import mlflow  # noqa: F401
