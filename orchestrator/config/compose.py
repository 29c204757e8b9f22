"""The config boundary: compose ``conf/`` with the overrides against the typed schemas.

This module holds the composing: the conf dir, Hydra's errors explained, that every value resolves, and the
pinning of relative local paths to the launch directory. Every config error is found at launch, by the launch
checks (``orchestrator.app.checks``) that ``orchestrator.app.compose.compose_config`` runs on top of this, and
raised as ``ConfigError`` (exit 4, never requeued) with the key and the fix in the message.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from orchestrator.config import aliases, defaults
from orchestrator.config.schema import RECIPE_SCHEMAS, RecipeConfig, register_configs
from orchestrator.core.errors import ConfigError


def conf_dir() -> Path:
    """The config tree: ``$ORCH_CONF_DIR`` or the repository's ``conf/``."""
    env = os.environ.get("ORCH_CONF_DIR")
    return Path(env).resolve() if env else Path(__file__).resolve().parents[2] / "conf"


# composed ahead for a process about to be forked (``prime``): taken by the first compose of the same overrides
_primed: dict[tuple, DictConfig] = {}


def prime(overrides: list[str]) -> None:
    """Compose ``overrides`` now, for the next ``compose_resolved(overrides)`` here or in each process forked from
    here (an attempt forked from its supervisor, a rank from its agent), which then skips Hydra's composing: ~0.2
    CPU-s of every attempt's start-up. Only the composing is shared; each caller's checks run in the caller (the
    environment they resolve against is the child's), and each process takes its copy once."""
    key = (conf_dir(), tuple(overrides))
    _primed.pop(key, None)
    try:
        _primed[key] = _compose(overrides)
    except ConfigError:
        pass  # the caller composes them again and says why


def compose_resolved(overrides: list[str]) -> DictConfig:
    """Compose the job config and check that every value resolves (environment variables, a choice's too).

    Raises ConfigError with the fix in the message. This is what a process that runs overrides the launcher
    already validated needs (the worker, a sweep's driver): only what can differ on its machine is checked
    again. The launch checks (``orchestrator.app.checks.validate``) run on top of it in
    ``orchestrator.app.compose.compose_config``.
    """
    cfg = composed(overrides)
    check_resolvable(cfg)
    return cfg


def composed(overrides: list[str]) -> DictConfig:
    """The job config of ``overrides`` as Hydra composes it against the schemas, checked for nothing more (the
    one composed ahead by ``prime``, when there is one). Raises ConfigError for what Hydra refuses."""
    cfg = _primed.pop((conf_dir(), tuple(overrides)), None)
    return cfg if cfg is not None else _compose(overrides)


def _compose(overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    aliases.refuse_hydra(overrides)
    overrides = aliases.rewrite(list(overrides), _is_field)  # TRL's option names as the project's keys
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(_unparsed(overrides) or _explain(err)) from None
    finally:
        GlobalHydra.instance().clear()
    recipe_schema = RECIPE_SCHEMAS.get(str(cfg.recipe.name), RecipeConfig)
    aliases.check_added(overrides, recipe_schema, lambda key: (conf_dir() / key).is_dir())
    try:
        defaults.fill_auto(cfg)  # what auto (null) settings mean for this job, settled once
    except OmegaConfBaseException:
        pass  # an unset or unresolvable value it reads: check_resolvable names it
    return cfg


def _is_field(key: str) -> bool:
    """Whether ``key`` is a field of the schema, under any recipe's."""
    return any(aliases.lookup(key, schema) == aliases.FIELD for schema in (RecipeConfig, *RECIPE_SCHEMAS.values()))


def _unparsed(overrides: list[str]) -> str | None:
    """One line naming the first override Hydra's grammar cannot read (its own error spans lines), else None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for item in overrides:
        try:
            parser.parse_override(item)
        except HydraException as err:
            reason = str(err).strip().splitlines()[-2 if "override_grammar" in str(err) else -1].strip()
            return (
                f"{item}: not an override ({reason.rstrip('^ ')}). Write key=value, group=option, +key=value or "
                "~key, and quote a value with spaces or brackets (key='a b'); flags: --help, --cfg job."
            )
    return None


def _explain(err: Exception) -> str:
    """Turn Hydra's and OmegaConf's errors into one paragraph naming the key and the valid choices."""
    text = str(err).strip()
    cause = str(err.__cause__).strip().splitlines()[0] if err.__cause__ else ""
    m = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    if m:
        group, choice = m.groups()
        options = sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))
        return f"{group}={choice} is not a known {group}; choose one of: {', '.join(options)} (the files in conf/{group}/)."
    m = re.search(r"Could not override '([^']+)'", text)
    if m:
        key = m.group(1)
        if aliases.instead(key):
            return f"{key}: the orchestrator sets TRL's {key.rpartition('.')[2]} itself; {aliases.instead(key)}."
        parent, _, leaf = key.rpartition(".")
        valid = _schema_keys(parent)
        if valid is None:
            return f"{key}: there is no config group {parent or leaf!r}; the groups are: {', '.join(_schema_keys('') or [])}."
        owners = [name for name, schema in RECIPE_SCHEMAS.items() if leaf in schema.__dataclass_fields__]
        if parent == "recipe" and owners:
            return (
                f"{key} is a key of recipe={' or recipe='.join(owners)} only; this job's recipe has none. "
                f"Drop {key}, or choose recipe={owners[0]}."
            )
        return f"{key}: {parent!r} has no key {leaf!r}; its keys are: {', '.join(valid)}."
    choice = choice_message(err.__cause__) if err.__cause__ else None
    if choice:  # an Enum field (orchestrator.core.choices): the value and the valid ones
        m = re.search(r"Error merging override ([^=\s]+)", text)
        return f"{m.group(1)}: {choice}" if m and not choice.startswith(m.group(1)) else choice
    m = re.search(r"Error merging override (\S+)", text)
    if m:
        return (
            f"{m.group(1)}: {cause or text}. Give a value of the field's type (see the config reference in README.md)."
        )
    return f"{text} {cause}".strip()


def _schema_keys(path: str) -> list[str] | None:
    from orchestrator.config.schema import Config

    node = OmegaConf.structured(Config)
    sub = OmegaConf.select(node, path) if path else node
    if not isinstance(sub, DictConfig):
        return None
    return cast("list[str]", list(sub.keys()))


# paths the launcher pins to its own directory, so the supervisor, every attempt, every rank and every
# backend's worker (which may start elsewhere) read the same folders
LOCAL_PATH_KEYS = ("storage.uri", "data.path", "run.work_dir")


def absolutize(overrides: list[str]) -> list[str]:
    """Resolve relative local paths in ``overrides`` against the launch directory (one base for every process).

    ``storage.uri``, ``data.path`` and ``run.work_dir`` when not a URL; ``model.name_or_path``
    when it is written as a path (``./``, ``../``, ``~``), not a hub id.
    """
    out = []
    for item in overrides:
        key, _, value = item.partition("=")
        local = (
            (key in LOCAL_PATH_KEYS and value and "://" not in value and not value.startswith("/"))
            or (key == "model.name_or_path" and value.startswith(("./", "../", "~")))
            or (
                key == "data.chat_template"
                and value.endswith((".jinja", ".j2"))
                and not value.startswith("/")
                and "://" not in value
            )
        )
        if local:
            item = f"{key}={Path(value).expanduser().resolve()}"
        out.append(item)
    return out


def with_default_storage(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """The overrides plus the config's own relative defaults of ``storage.uri`` and ``run.work_dir``, pinned
    to the launch directory like the user's (``absolutize``)."""
    for key in ("storage.uri", "run.work_dir"):
        value = str(OmegaConf.select(cfg, key))
        if not any(o.startswith(f"{key}=") for o in overrides) and "://" not in value and not value.startswith("/"):
            overrides = overrides + [f"{key}={Path(value).expanduser().resolve()}"]
    return overrides


def split_sweep_overrides(overrides: list[str]) -> tuple[list[str], dict[str, tuple]]:
    """The overrides that set one value, and the search space the others give, as plain tuples by key:
    ``("choice", [values])`` (``a=1,2``, ``choice(...)``), ``("range", start, stop, step)``,
    ``("interval", low, high, log)`` (``interval(...)``, ``tag(log, interval(...))``), parsed by Hydra's own
    override grammar. Raises ConfigError naming an override that does not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    fixed: list[str] = []
    space: dict[str, tuple[Any, ...]] = {}
    for item in overrides:
        try:
            override = parser.parse_override(item)
        except HydraException as err:
            raise ConfigError(
                f"{item}: the override does not parse ({str(err).splitlines()[0]}). Write a search space "
                "as Hydra's sweeps do: a=1,2 | 'a=choice(1,2)' | 'a=range(1,5)' | 'a=interval(1e-5,1e-3)' | "
                "'a=tag(log, interval(1e-5,1e-3))' (docs/sweeps.md)."
            ) from None
        if not override.is_sweep_override():
            fixed.append(item)
            continue
        value: Any = override.value()
        key = override.key_or_group
        if override.is_choice_sweep():
            space[key] = ("choice", list(value.list))
        elif override.is_range_sweep():
            space[key] = ("range", value.start, value.stop, value.step)
        else:
            space[key] = ("interval", value.start, value.end, "log" in value.tags)
    return fixed, space


def check_resolvable(cfg: DictConfig) -> None:
    """Every value is set and resolves (environment variables), and an interpolated choice is one of the choices."""
    from omegaconf.errors import InterpolationResolutionError, InterpolationValidationError, MissingMandatoryValue

    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except InterpolationValidationError as err:
        raise ConfigError(choice_message(err) or str(err)) from None
    except MissingMandatoryValue as err:
        raise ConfigError(
            f"{err.full_key} is required but not set. Set it on the command line: {err.full_key}=VALUE."
        ) from None
    except InterpolationResolutionError as err:
        missing = re.search(r"Environment variable '([^']+)' not found", str(err))
        if not missing:
            raise
        raise ConfigError(
            f"{err.full_key} reads the environment variable {missing.group(1)}, which is not set. "
            f"export {missing.group(1)}=... before launching (or give a default: ${{oc.env:{missing.group(1)},VALUE}})."
        ) from None


def choice_message(err: BaseException) -> str | None:
    """The message for an invalid choice of an ``Enum`` field (OmegaConf's ``ValidationError``), else None."""
    m = re.search(r"Invalid value '(.*)', expected one of \[(.*)\]", str(err))
    key = getattr(err, "full_key", None)
    if not m or not key:
        return None
    return f"{key}={m.group(1)!r} is not a valid choice; choose one of: {m.group(2)}."
