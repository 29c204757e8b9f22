"""The evaluated job's own config: what ``orchestrator eval <uri>/<run>`` defaults to (its model and recipe).

Every checkpoint's manifest (and ``final/``'s) records the config fields that shape the training trajectory
(``checkpoint.fingerprint.trajectory_config``), and is hashed, and signed with ``ORCH_MANIFEST_HMAC_KEY``. The
newest sound one gives the evaluation its model (name, revision, dtype, attention, the tiny model's shape) and
its recipe (name, peft, quantization): an override changes only what the user names. A model that is not the
checkpoint's (another name, revision or shape) is refused with one message, instead of a PEFT size-mismatch
traceback from loading one model's adapter into another; a local folder named instead of the job's hub model is
taken as its copy (with a warning: not checked).

Storage is untrusted: the fields are decoded once (``JobConfig.decode``: types, choices, no interpolation), and a
manifest that is not sound is skipped for the next older one (with a warning naming it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from orchestrator.core.choices import Dtype, Peft, Quantization, Recipe
from orchestrator.core.errors import ConfigError

log = logging.getLogger(__name__)

_TEXT, _OPTIONAL_TEXT, _SIZE = "text", "optional text", "size"
FIELDS = {
    "model.name_or_path": _TEXT,
    "model.revision": _OPTIONAL_TEXT,
    "model.dtype": Dtype,
    "model.attn_implementation": _OPTIONAL_TEXT,
    "model.hidden_size": _SIZE,
    "model.num_layers": _SIZE,
    "model.num_heads": _SIZE,
    "model.vocab_size": _SIZE,
    "recipe.name": Recipe,
    "recipe.peft": Peft,
    "recipe.quantization": Quantization,
}
TINY_SHAPE = ("model.hidden_size", "model.num_layers", "model.num_heads", "model.vocab_size")
BUILTIN = "builtin:"


def _checked(key: str, value: Any, kind: Any) -> Any:
    if kind == _SIZE:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
            raise ValueError(f"{key} is {str(value)[:40]!r}, not a size")
        return value
    if value is None and kind == _OPTIONAL_TEXT:
        return None
    if not isinstance(value, str) or not value or "${" in value or "\n" in value or value.startswith("sha256:"):
        raise ValueError(f"{key} is {str(value)[:40]!r}, not a plain value")  # sha256: a secret's digest
    if kind not in (_TEXT, _OPTIONAL_TEXT) and value not in kind.__members__:
        raise ValueError(f"{key} is {value[:40]!r}, not one of {', '.join(kind.__members__)}")
    return value


def _quoted(value: Any) -> str:
    """A checked value as a Hydra override's value."""
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def named_keys(overrides: list[str]) -> set[str]:
    """The keys (``model.dtype``) and groups (``model``) the user's overrides name."""
    out = set()
    for override in overrides:
        key = str(override).split("=", 1)[0].lstrip("+~").split("@", 1)[0]
        if key:
            out.add(key)
    return out


@dataclass(frozen=True)
class JobConfig:
    """``values``: the job's checked fields (``FIELDS``); ``where``: the manifest they come from."""

    run_name: str
    where: str
    values: dict

    @classmethod
    def decode(cls, manifest: dict, run_name: str, where: str) -> "JobConfig":
        """Raises ValueError naming the field that is not sound."""
        meta = manifest.get("meta")
        trajectory = meta.get("trajectory") if isinstance(meta, dict) else None
        if not isinstance(trajectory, dict):
            raise ValueError("it records no trajectory config")
        return cls(
            run_name,
            where,
            {key: _checked(key, trajectory[key], kind) for key, kind in FIELDS.items() if key in trajectory},
        )

    def overrides(self, user: list[str], user_cfg: Any) -> list[str]:
        """The job's fields as overrides, for every one the user does not name: a group the user chose
        (``model=...``, ``recipe=...``) is theirs, but for the revision the launch pinned of the same model."""
        named, out = named_keys(user), []
        if "recipe" not in named and "recipe.name" in self.values:
            out.append(f"recipe={self.values['recipe.name']}")
        for key, value in self.values.items():
            group = key.split(".", 1)[0]
            if key in named or key == "recipe.name":
                continue
            if group in named:
                same_model = str(user_cfg.model.name_or_path) == self.values.get("model.name_or_path")
                if not (key == "model.revision" and same_model and user_cfg.model.revision is None):
                    continue
            out.append(f"{key}={_quoted(value)}")
        return out

    def mismatch(self, cfg: Any) -> Optional[str]:
        """Why ``cfg``'s model is not the one the job's checkpoints hold (None: it is)."""
        keys = ["model.name_or_path", "model.revision"]
        given_name = str(cfg.model.name_or_path)
        if given_name != self.values.get("model.name_or_path") and Path(given_name).expanduser().is_dir():
            log.warning(
                "model.name_or_path=%s is a local folder, taken as a copy of the job's %r (not checked)",
                given_name,
                self.values.get("model.name_or_path"),
            )
            return None
        if str(self.values.get("model.name_or_path", "")).startswith(BUILTIN):
            keys += list(TINY_SHAPE)
        for key in keys:
            job, given = self.values.get(key), cfg.model[key.split(".", 1)[1]]
            if key not in self.values or (key == "model.revision" and (job is None or given is None)):
                continue
            if given != job:
                return (
                    f"job {self.run_name!r} was trained on {key}={job!r} ({self.where}); this evaluation names "
                    f"{key}={given!r}, and one model's weights or adapter do not load into another. Drop the "
                    f"override to evaluate with the job's own model (its config is the default), or evaluate "
                    "a job trained on that model."
                )
        return None


def _newest_manifests(store: Any, run_name: str) -> list[str]:
    import tempfile

    from orchestrator.checkpoint.store import CheckpointStore

    with tempfile.TemporaryDirectory(prefix="orch-eval-list-") as staging:  # a listing stages nothing
        committed = CheckpointStore(store, run_name, keep_last=10**6, staging_dir=Path(staging)).committed()
    keys = [c.manifest_key for c in reversed(committed)]
    final = f"{run_name}/final/manifest.json"
    return ([final] if store.exists(final) else []) + keys


def stored(store: Any, run_name: str) -> Optional[JobConfig]:
    """The job's config from its newest sound manifest (final first); None when it has none."""
    from orchestrator.checkpoint import manifest as mf

    for key in _newest_manifests(store, run_name):
        where = store.get_uri(key)
        try:
            return JobConfig.decode(mf.loads(store.get_bytes(key)), run_name, where)
        except FileNotFoundError:
            continue
        except (mf.CorruptCheckpoint, ValueError) as err:
            log.warning("%s gives no config for the evaluation (%s); trying an older checkpoint", where, err)
    return None


def check_model(cfg: Any, job: Optional[JobConfig]) -> None:
    """Raises ConfigError (exit 4) when ``cfg``'s model is not the job's."""
    problem = job.mismatch(cfg) if job is not None else None
    if problem:
        raise ConfigError(problem)
