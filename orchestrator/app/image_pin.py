"""Launch check: an image a remote job runs is pinned by digest, so every attempt runs the same packages.

A recovery can land on a node that pulls ``backend.image`` again, days later; a tag (``:0.1``, ``:latest``) may
have been pushed over meanwhile, and the resumed attempt would run other versions of torch, transformers, TRL
and PEFT than the job started on (the ledger's reproducibility record would say so, after the fact). A digest
(``name@sha256:...``) cannot move. A tag is warned about, once per launch, with the fix; not refused: a registry
with immutable tags gives the same guarantee, which the launcher cannot see.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)
IMAGE_BACKENDS = ("kubernetes", "skypilot")


def warn_unpinned_image(cfg: Any) -> None:
    image = str(cfg.backend.image or "")
    if not image or str(cfg.backend.name) not in IMAGE_BACKENDS or "@sha256:" in image:
        return
    log.warning(
        "backend.image=%s is not pinned by digest: a node a recovery lands on pulls whatever the tag names "
        "then, and a resume is bit-for-bit on the same packages only; give %s@sha256:<digest> (docker "
        "buildx imagetools inspect %s prints it), or use a registry whose tags cannot be overwritten",
        image,
        image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image,
        image,
    )
