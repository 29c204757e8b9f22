"""Build, ahead of the tests, what their first jobs would otherwise build while the clock runs.

    python scripts/warm_caches.py        # scripts/test.sh runs it in the background, beside its apt installs

1. the tiny model every test job trains (``recipes.tiny.ensure_tiny_model``, into ``ORCH_CACHE_DIR``);
2. DeepSpeed's CPU shared-memory communication op (``deepspeed_shm_comm``): the first DeepSpeed job on a new
   machine compiles it, about 45 s of its restore phase, and keeps it in ``~/.cache/torch_extensions``.

Both are cached exactly where the jobs look, under the same locks the jobs take, so a test that starts before this
ends waits for the build instead of starting a second one. Nothing here is needed for correctness: a failure
is printed and the tests build what they need themselves.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def tiny_model() -> str:
    from recipes.tiny import ensure_tiny_model

    return str(ensure_tiny_model())


def deepspeed_shm_op() -> str:
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return "not used on this machine"
    builder.load(verbose=False)
    return builder.absolute_name()


def main() -> int:
    for what, build in (("tiny model", tiny_model), ("DeepSpeed CPU shm op", deepspeed_shm_op)):
        start = time.monotonic()
        try:
            result = build()
        except Exception as err:  # noqa: BLE001 - a warm-up: the tests build it themselves if this fails
            print(f"warm_caches: {what}: not built ({type(err).__name__}: {err}); the first job builds it",
                  flush=True)
            continue
        print(f"warm_caches: {what}: {result} ({time.monotonic() - start:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
