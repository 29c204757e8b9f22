"""Build, ahead of the tests, what their first jobs would otherwise build while the clock runs.

    python scripts/warm_caches.py        # scripts/test.sh runs it in the background, beside its apt installs

The tiny model every test job trains (``recipes.tiny.ensure_tiny_model``, into ``ORCH_CACHE_DIR``), cached
exactly where the jobs look, under the same lock the jobs take, so a test that starts before this ends waits for
the build instead of starting a second one. Nothing here is needed for correctness: a failure is printed and
the tests build what they need themselves. (DeepSpeed's CPU shared-memory op, built here before, is no longer
built at all: ``orchestrator.process.training_stack.settle_deepspeed``.)
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from recipes.tiny import ensure_tiny_model

    start = time.monotonic()
    try:
        path = ensure_tiny_model()
    except Exception as err:  # noqa: BLE001 - a warm-up: the tests build it themselves if this fails
        print(f"warm_caches: tiny model: not built ({type(err).__name__}: {err}); the first job builds it", flush=True)
        return 0
    print(f"warm_caches: tiny model: {path} ({time.monotonic() - start:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
