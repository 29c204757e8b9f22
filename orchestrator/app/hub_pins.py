"""Pin hub inputs to commits: ``model.revision`` and ``data.revision`` name a branch or tag; the launcher
resolves each to the commit it names now, so every attempt of the job (requeued tomorrow, on another
machine) downloads the same files, and the reproducibility record holds the commit.

A revision that already is a 40-hex commit is kept; when the hub cannot be reached within a few seconds
the revision is left as given, with one warning (the job still runs, unpinned). A model the hub says is not
there is left to the launch check (``orchestrator.app.hub_access``), which refuses it with the fix. Entries of ``data.mix``
are recorded as given (Hydra has no override for one field of a list entry).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Optional

from orchestrator.config.hub import hub_endpoint, hub_inputs

log = logging.getLogger(__name__)
COMMIT = re.compile(r"[0-9a-f]{40}")
HUB_TIMEOUT_SECONDS = 5.0


def resolve_commit(repo_type: str, repo_id: str, revision: Optional[str]) -> str:
    """The commit ``revision`` (None: the default branch) of a hub repository names now."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_endpoint())  # HF_ENDPOINT as set now, as the launch check reads it
    info = (api.model_info if repo_type == "model" else api.dataset_info)(
        repo_id, revision=revision, timeout=HUB_TIMEOUT_SECONDS
    )
    return str(info.sha)


def pin_revisions(
    cfg: Any, overrides: list[str], resolve: Callable[[str, str, Optional[str]], str] = resolve_commit
) -> list[str]:
    """``overrides`` with each hub input's revision replaced by the commit it resolves to."""
    inputs = hub_inputs(cfg)
    if not inputs:
        return overrides
    from huggingface_hub import constants

    pins = {}
    for key, repo_type, repo_id, revision in inputs:
        if revision and COMMIT.fullmatch(str(revision)):
            continue
        if constants.HF_HUB_OFFLINE:
            log.warning("%s=%s of %s not pinned to a commit: HF_HUB_OFFLINE is set", key, revision, repo_id)
            continue
        try:
            pins[key] = resolve(repo_type, repo_id, revision)
        except Exception as err:  # noqa: BLE001 - unreachable hub, unknown repo: the attempt reports it
            if repo_type == "model" and _refused(err):
                continue  # the launch check (orchestrator.app.hub_access) says why, with the fix: exit 4
            log.warning(
                "%s=%s of %s not pinned to a commit (%s)",
                key,
                revision,
                repo_id,
                str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__,
            )
            continue
        log.info("%s pinned: %s@%s is commit %s", key, repo_id, revision or "main", pins[key])
    kept = [o for o in overrides if o.partition("=")[0] not in pins]
    return kept + [f"{key}={sha}" for key, sha in pins.items()]


def _refused(err: Exception) -> bool:
    """The hub said the repository or revision is not there (not: the hub could not be reached)."""
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    return isinstance(err, (RepositoryNotFoundError, RevisionNotFoundError))
