"""One logging set-up for every entry point (launch, worker, supervisor)."""
from __future__ import annotations

import logging
import os
import sys


def setup_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("ORCH_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
