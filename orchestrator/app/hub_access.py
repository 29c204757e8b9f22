"""Launch check: the hub model a job downloads can be fetched, with the token the job will have.

A model id with a typo, or a gated repository (Llama) without ``HF_TOKEN``, used to pass the launch and crash
every attempt on ``from_pretrained``: requeued, a traceback each, status "crashed". ``check_hub_model`` asks the
hub for the model's ``config.json`` (one HEAD request through ``huggingface_hub``, at the revision the launcher
pinned, ``HF_ENDPOINT`` and the token as ``huggingface_hub`` finds them: ``HF_TOKEN``, then ``hf auth login``'s
file) and turns what the hub answers into one line naming the fix, exit 4:

- gated (``GatedRepoError``: 401 without a token, 403 with one whose account has not accepted the licence):
  export HF_TOKEN / accept the licence at the repository's page;
- not found (``RepositoryNotFoundError``: no such repository, or a private one the token cannot read), a revision
  that is not there (``RevisionNotFoundError``), no ``config.json`` (``RemoteEntryNotFoundError``), a token the hub
  refuses (401 "Invalid credentials"), an id that is no hub id (``HFValidationError``).

What is not a config error is a warning, and the launch goes on: the hub unreachable (a network error, a
timeout, a 5xx or 429), or ``HF_HUB_OFFLINE`` set with the model not in the local cache (a model in the cache
passes offline, silently). Local folders, ``builtin:`` and ``s3://`` models are not hub models
(``orchestrator.config.hub.hub_inputs``). On SkyPilot and Kubernetes the job reads the token from the variable
``HF_TOKEN`` only (``orchestrator.backends.hub_token_names``), so a gated model reached with ``hf auth login``'s token
alone is refused there, asking for ``export HF_TOKEN``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from orchestrator.config.hub import hub_endpoint, hub_inputs, hub_offline
from orchestrator.core.errors import ConfigError

log = logging.getLogger(__name__)
HUB_TIMEOUT_SECONDS = 5.0
TOKEN_ENV = "HF_TOKEN"
# backends whose job gets the token from the variable only (no shared home holding hf auth login's file)
ENV_TOKEN_ONLY_BACKENDS = ("skypilot", "kubernetes")


def hub_model(cfg: Any) -> Optional[tuple[str, Optional[str]]]:
    """(repo id, revision) of the hub model the job downloads, or None (a local folder, builtin:, s3://)."""
    return next(((repo, rev) for _, kind, repo, rev in hub_inputs(cfg) if kind == "model"), None)


def check_hub_model(cfg: Any) -> None:
    """Raise ConfigError when the hub says the job's model cannot be fetched; warn when it cannot be asked."""
    model = hub_model(cfg)
    if model is None:
        return
    repo_id, revision = model
    if hub_offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str):
            log.warning(
                "model.name_or_path=%s not checked: HF_HUB_OFFLINE is set and it is not in the local "
                "Hugging Face cache",
                repo_id,
            )
        return
    err = fetch_error(repo_id, revision, token=None)  # None: the token huggingface_hub finds
    if err is None and str(cfg.backend.name) in ENV_TOKEN_ONLY_BACKENDS and not os.environ.get(TOKEN_ENV):
        from huggingface_hub import get_token

        if get_token():  # reached with hf auth login's token, which stays on this machine
            without = fetch_error(repo_id, revision, token=False)
            if _is_access_error(without):
                raise ConfigError(
                    f"model.name_or_path={repo_id} needs a Hugging Face token, and backend={cfg.backend.name} "
                    f"gives the job the variable {TOKEN_ENV} only (the token from `hf auth login` stays on this "
                    f"machine): export {TOKEN_ENV}=hf_... before launching{_k8s_hint(cfg)}."
                )
    if err is not None:
        problem = describe(err, cfg, repo_id, revision)
        if problem is None:
            log.warning(
                "model.name_or_path=%s not checked on the hub at %s (%s); launching anyway",
                repo_id,
                hub_endpoint(),
                _first_line(err),
            )
            return
        raise ConfigError(problem)


def fetch_error(repo_id: str, revision: Optional[str], *, token: Any) -> Optional[Exception]:
    """What the hub answers a HEAD of the model's config.json with: None (it is there) or the error.

    One request, no retries (``hf_hub_download`` retries a network error for ~20 s)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    endpoint = hub_endpoint()
    try:
        url = hf_hub_url(repo_id, "config.json", revision=revision, endpoint=endpoint)
        get_hf_file_metadata(url, token=token, timeout=HUB_TIMEOUT_SECONDS, endpoint=endpoint)
    except Exception as err:  # noqa: BLE001 - classified by describe()
        return err
    return None


def _is_access_error(err: Optional[Exception]) -> bool:
    from huggingface_hub.errors import RepositoryNotFoundError  # GatedRepoError is one

    return isinstance(err, RepositoryNotFoundError)


def describe(err: Exception, cfg: Any, repo_id: str, revision: Optional[str]) -> Optional[str]:
    """The config error's line for what the hub answered, or None when it is not a config error (unreachable)."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    key, page = f"model.name_or_path={repo_id}", f"{hub_endpoint()}/{repo_id}"
    has_token = bool(get_token())
    if isinstance(err, GatedRepoError):
        if not has_token:
            return (
                f"{key} is a gated repository and no Hugging Face token is set: accept its licence at {page} "
                f"and export {TOKEN_ENV}=hf_... (a read token of that account) before launching{_k8s_hint(cfg)}."
            )
        return (
            f"{key} is a gated repository and the account of the token set ({TOKEN_ENV} or hf auth login) has "
            f"no access: accept the licence at {page} with that account (or use a token of one that has)."
        )
    if isinstance(err, RepositoryNotFoundError):
        private = "" if has_token else f"; for a private repository, export {TOKEN_ENV}=hf_... before launching"
        return (
            f"{key} is not a model on the hub ({hub_endpoint()}), or not one this token can read: fix the name "
            f"(e.g. Qwen/Qwen2.5-0.5B), or give a local folder with config.json{private}."
        )
    if isinstance(err, RevisionNotFoundError):
        return (
            f"model.revision={revision} is not a branch, tag or commit of {repo_id}: fix model.revision, or "
            "drop it for the default branch."
        )
    if isinstance(err, RemoteEntryNotFoundError):
        return (
            f"{key} has no config.json{f' at {revision}' if revision else ''}, so transformers cannot load it "
            f"as a model: give the id of a transformers model (see {page})."
        )
    if isinstance(err, HFValidationError):
        return f"{key} is not a hub id (org/name) nor an existing local folder: fix model.name_or_path."
    response = getattr(err, "response", None)
    if isinstance(err, HfHubHTTPError) and getattr(response, "status_code", None) == 401:
        return (
            f"{key}: the hub refused the Hugging Face token set ({TOKEN_ENV} or hf auth login) as invalid: "
            f"export {TOKEN_ENV} with a valid read token (huggingface.co/settings/tokens), or unset it."
        )
    return None


def _k8s_hint(cfg: Any) -> str:
    if str(cfg.backend.name) != "kubernetes":
        return ""
    from orchestrator.backends.settings import backend_settings

    return (
        f", and put it in the pod's Secret: kubectl create secret generic {backend_settings(cfg).secret_name} "
        f'--from-literal={TOKEN_ENV}="${TOKEN_ENV}"'
    )


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__
