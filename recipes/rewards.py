"""GRPO's reward functions: the shipped ones for the built-in task, the user's by import path, checked at launch.

``recipe.reward_funcs`` lists ``"package.module:function"`` paths, TRL's dotted ``"package.module.function"`` (split
at the last dot, as TRL's GRPO script does) or TRL's named rewards (``accuracy_reward``, ``think_format_reward``, ...
from ``trl.rewards``). Each must import and be callable with
TRL's reward signature: ``fn(prompts, completions, **kwargs)`` returning one float (or None) per completion;
the dataset's other columns (``answer`` for the built-in task), ``completion_ids`` and ``trainer_state``
arrive as keyword arguments. The checks run at launch (exit 4, never requeued).

``CachedReward`` wraps each function so a (prompt, completion) pair it has scored is never scored again,
not in the same run and not after a resume (``orchestrator.checkpoint.reward_cache``); a function
decorated with ``uncached`` is called every time.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import keyword
import math
import re
import sys
from typing import Any

from orchestrator.core.errors import ConfigError

_NUMBER = re.compile(r"-?\d+")
# what TRL passes to every reward function besides the dataset's columns (TRL 1.16, GRPOTrainer._calculate_rewards)
TRL_KWARGS = ("completion_ids", "trainer_state", "log_extra", "log_metric")


def exact_answer(prompts, completions, answer=None, **kwargs) -> list[float]:
    """1.0 when the completion's first number is the row's ``answer`` (the built-in arithmetic task), else 0.0."""
    if answer is None:
        raise ValueError(
            "recipes.rewards:exact_answer needs an 'answer' column in the dataset (data=synthetic has one)"
        )
    out = []
    for completion, want in zip(completions, answer):
        found = _NUMBER.search(_text(completion))
        out.append(1.0 if found and found.group(0) == str(want).strip() else 0.0)
    return out


def answer_format(prompts, completions, **kwargs) -> list[float]:
    """0.5 when the completion is a single number (spaces around it allowed), else 0.0: the task's answer format."""
    return [0.5 if re.fullmatch(r"\s*-?\d+\s*", _text(c)) else 0.0 for c in completions]


def _text(completion) -> str:
    """A completion as text: a string, or the last message of a conversational completion."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"]) if completion else ""


# TRL's named rewards (trl.rewards), as its GRPO script takes them; a factory's instance made with the script's values
TRL_NAMED = {
    "accuracy_reward": None,
    "reasoning_accuracy_reward": None,
    "think_format_reward": None,
    "get_soft_overlong_punishment": {"max_completion_len": 1280, "soft_punish_cache": 256},
}
_NEEDS_MATH_VERIFY = ("accuracy_reward", "reasoning_accuracy_reward")
_FORMS = (
    "'package.module:function', TRL's dotted 'package.module.function', or one of TRL's named rewards: "
    + ", ".join(TRL_NAMED)
)


def split_path(path: str) -> tuple[str, str]:
    """``(module, function)`` of ``pkg.mod:fn`` or TRL's ``pkg.mod.fn`` (split at the last dot). Every part must
    be a Python identifier: a file path, a relative import or an expression is refused, never imported."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    parts = module_name.split(".") + [attr]
    if not module_name or not all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        raise ConfigError(
            f"recipe.reward_funcs entry {path!r} is not an import path. Write it as {_FORMS} "
            "(e.g. recipes.rewards:exact_answer)."
        )
    if parts[0] in sys.stdlib_module_names:  # never a reward; some act on import (antigravity) or run commands
        raise ConfigError(
            f"recipe.reward_funcs entry {path!r} names Python's standard library ({parts[0]}), not a "
            "reward function. Name your own module's function, e.g. my_rewards:score."
        )
    return module_name, attr


def resolve(path: str, columns: set[str] | None = None):
    """The function ``path`` names ("pkg.mod:fn", "pkg.mod.fn" or a TRL named reward), checked against TRL's reward
    signature (``columns``: the dataset's, when known at launch); ConfigError otherwise."""
    path = str(path).strip()
    if path in TRL_NAMED:
        fn = trl_named(path)
    else:
        module_name, attr = split_path(path)
        try:
            module = importlib.import_module(module_name)
        except Exception as err:  # noqa: BLE001 - any import failure is the user's to fix
            raise ConfigError(
                f"recipe.reward_funcs entry {path!r}: module {module_name!r} cannot be imported "
                f"({type(err).__name__}: {err}). Put it on PYTHONPATH, or fix the module."
            ) from None
        fn = getattr(module, attr, None)
        if inspect.ismodule(fn):
            raise ConfigError(
                f"recipe.reward_funcs entry {path!r} is a module, not a function: name a function in "
                f"it ({path}:NAME or {path}.NAME)."
            )
        if fn is None or not callable(fn) or inspect.isclass(fn):
            raise ConfigError(
                f"recipe.reward_funcs entry {path!r}: {module_name} has no callable {attr!r}. "
                "Name a function defined in that module."
            )
    check_signature(fn, path, columns)
    return fn


def trl_named(name: str):
    """TRL's reward ``name`` from trl.rewards (a factory's with TRL's GRPO script's values); ConfigError when the
    package it needs is not installed."""
    from trl.import_utils import is_math_verify_available

    if name in _NEEDS_MATH_VERIFY and not is_math_verify_available():
        raise ConfigError(
            f"recipe.reward_funcs entry {name!r} (TRL's) needs the math_verify package, which is not "
            "installed here: pip install 'math-verify[antlr4_13_2]', or choose another reward."
        )
    try:
        fn = getattr(importlib.import_module("trl.rewards"), name)
    except Exception as err:  # noqa: BLE001 - a package the reward imports is missing here
        raise ConfigError(
            f"recipe.reward_funcs entry {name!r} cannot be loaded from trl.rewards "
            f"({type(err).__name__}: {str(err).splitlines()[0]}). Install what it needs."
        ) from None
    kwargs = TRL_NAMED[name]
    return fn(**kwargs) if kwargs else fn


def check_signature(fn, path: str, columns: set[str] | None = None) -> None:
    """``fn`` takes TRL's call: ``prompts=``, ``completions=`` and the dataset's other columns as ``**kwargs``.
    ``columns`` None (not known before the data loads): a required argument is taken to be a column."""
    fix = f"Define it as def {getattr(fn, '__name__', 'reward')}(prompts, completions, **kwargs) -> list[float]."
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function: whether it takes TRL's call cannot be checked
        raise ConfigError(
            f"recipe.reward_funcs entry {path!r} is a built-in without an inspectable signature, so "
            f"it cannot be checked against TRL's call. Wrap it in a Python function: {fix}"
        ) from None
    params = sig.parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        raise ConfigError(
            f"recipe.reward_funcs entry {path!r} takes no **kwargs, but TRL passes the dataset's "
            f"columns and {', '.join(TRL_KWARGS)} as keyword arguments. {fix}"
        )
    given: dict[str, Any] = {"prompts": [], "completions": [], **{k: None for k in TRL_KWARGS}}
    if columns is None:
        given.update(
            {
                p.name: None
                for p in params
                if p.default is p.empty and p.name not in given and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            }
        )
    else:
        given.update({c: None for c in columns - {"prompt"}})
    try:
        sig.bind(**given)
    except TypeError as err:
        have = f"; this job's dataset has the columns {', '.join(sorted(columns))}" if columns else ""
        raise ConfigError(
            f"recipe.reward_funcs entry {path!r} cannot be called as TRL calls it ({err}{have}). {fix}"
        ) from None


def known_columns(cfg) -> set[str] | None:
    """The dataset's columns where the launch knows them without loading it (data=synthetic), else None."""
    if str(cfg.data.source) == "synthetic":
        from recipes.data import synthetic_rows

        return set(synthetic_rows("grpo", 1, 0)[0])
    return None


def check_grpo_config(cfg) -> None:
    """recipe=grpo's launch checks: the reward functions, the generation batch's shape, beta, vLLM."""
    r = cfg.recipe
    funcs = list(r.reward_funcs or [])
    if not funcs:
        raise ConfigError(
            "recipe=grpo needs at least one reward function: set recipe.reward_funcs, e.g. "
            "[recipes.rewards:exact_answer]."
        )
    columns = known_columns(cfg)
    for path in funcs:
        resolve(path, columns)
        if columns is not None and str(path).strip() in ("think_format_reward", *_NEEDS_MATH_VERIFY):
            raise ConfigError(
                f"recipe.reward_funcs entry {path!r} (TRL's) reads conversational completions "
                f"(a 'prompt' column of messages) and data={cfg.data.source}'s prompts are text: "
                "give conversational data (data=jsonl or hub), or a reward for text completions."
            )
    if r.reward_weights is not None and len(r.reward_weights) != len(funcs):
        raise ConfigError(
            f"recipe.reward_weights has {len(r.reward_weights)} weights for {len(funcs)} reward "
            "functions; give one weight per entry of recipe.reward_funcs, or drop recipe.reward_weights."
        )
    if r.num_generations < 2:
        raise ConfigError(
            f"recipe.num_generations={r.num_generations}: GRPO's advantages compare completions of one "
            "prompt, so it needs at least 2. Set recipe.num_generations=2 or more."
        )
    if r.beta < 0 or not math.isfinite(r.beta):
        raise ConfigError(
            f"recipe.beta={r.beta} must be a finite number of at least 0 (0: no KL term, no reference "
            "model). Set e.g. recipe.beta=0.04."
        )
    if r.num_iterations < 1 or r.max_completion_length < 1:
        raise ConfigError("recipe.num_iterations and recipe.max_completion_length must be at least 1.")
    check_generation_batch(cfg)
    if r.use_vllm:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "recipe.use_vllm=true needs a CUDA GPU (vLLM is CUDA-only) and this machine has none. "
                "Set recipe.use_vllm=false: TRL then generates with transformers' generate."
            )
    if r.vllm_mode not in ("colocate", "server"):
        raise ConfigError(f"recipe.vllm_mode={r.vllm_mode!r}; choose colocate or server.")
    if int(cfg.train.eval_steps) > 0:
        raise ConfigError(
            "recipe=grpo evaluates at the end only here (TRL's evaluation would sample and score the "
            "held-out prompts at every evaluation). Set train.eval_steps=0."
        )


def generation_batch(cfg) -> tuple[int, int]:
    """(generation_batch_size, steps_per_generation) as TRL derives them from the config (one process)."""
    from orchestrator.core.ranks import configured_world_size

    r, t = cfg.recipe, cfg.train
    step_batch = int(t.per_device_batch_size) * configured_world_size(cfg)
    if r.generation_batch_size is not None and r.steps_per_generation is not None:
        raise ConfigError("recipe.generation_batch_size and recipe.steps_per_generation say the same thing; set one.")
    if r.generation_batch_size is not None:
        if int(r.generation_batch_size) % step_batch:
            raise ConfigError(
                f"recipe.generation_batch_size={r.generation_batch_size} must be a multiple of the "
                f"global micro-batch ({step_batch} = train.per_device_batch_size x processes)."
            )
        return int(r.generation_batch_size), int(r.generation_batch_size) // step_batch
    steps = int(r.steps_per_generation or t.gradient_accumulation_steps)
    if steps < 1:
        raise ConfigError(f"recipe.steps_per_generation={steps} must be at least 1.")
    return step_batch * steps, steps


def check_generation_batch(cfg) -> None:
    size, _ = generation_batch(cfg)
    n = int(cfg.recipe.num_generations)
    if size % n:
        raise ConfigError(
            f"recipe.num_generations={n} does not divide the generation batch of {size} completions "
            "(train.per_device_batch_size x processes x recipe.steps_per_generation). Choose "
            f"num_generations among the divisors of {size}, or change the batch."
        )


def row_id(prompt, columns: dict) -> str:
    """A prompt's id: SHA-256 of its text and its row's other columns (what a reward may read)."""
    body = json.dumps({"prompt": prompt, "columns": columns}, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def completion_hash(completion) -> str:
    return hashlib.sha256(json.dumps(completion, sort_keys=True, default=str).encode()).hexdigest()[:32]


class CachedReward:
    """A reward function that scores each (prompt id, completion hash) once; ``cache``: a RewardCache."""

    def __init__(self, fn, path: str, cache):
        self.fn, self.path, self.cache = fn, path, cache
        functools.update_wrapper(self, fn)  # TRL names the reward's metrics after __name__

    def __call__(self, prompts, completions, **kwargs):
        n = len(completions)
        per_row = {k: v for k, v in kwargs.items() if k not in TRL_KWARGS and isinstance(v, list) and len(v) == n}
        keys = [
            (row_id(prompts[i], {k: v[i] for k, v in per_row.items()}), completion_hash(completions[i]))
            for i in range(n)
        ]
        missing = [i for i, key in enumerate(keys) if self.cache.get(self.path, key) is None]
        first = list({keys[i]: i for i in reversed(missing)}.values())  # one call per distinct pair
        if first:
            first.sort()
            sub = {k: ([v[i] for i in first] if isinstance(v, list) and len(v) == n else v) for k, v in kwargs.items()}
            values = self.fn(prompts=[prompts[i] for i in first], completions=[completions[i] for i in first], **sub)
            if len(values) != len(first):
                raise ValueError(
                    f"reward function {self.path} returned {len(values)} rewards for {len(first)} "
                    "completions; return one per completion"
                )
            computed = {keys[i]: v for i, v in zip(first, values)}
            self.cache.put(self.path, computed)  # what it keeps: finite rewards within reward_cache.REWARD_BOUND
        else:
            computed = {}
        # a value just computed is the function's own (as uncached); a cached one passed the cache's checks
        return [computed[key] if key in computed else self.cache.get(self.path, key) for key in keys]


def uncached(fn):
    """Keep ``fn``'s rewards out of the reward cache: for a reward that reads ``trainer_state`` (shaping by step),
    is meant to be drawn again (a sampled judge), or must see every generation batch."""
    fn.reward_cache = False
    return fn


def reward_functions(cfg, cache=None) -> list:
    """The configured reward functions, each behind the reward cache when there is one (unless ``uncached``)."""
    out = []
    for path in cfg.recipe.reward_funcs:
        fn = resolve(path)
        out.append(CachedReward(fn, path, cache) if cache is not None and getattr(fn, "reward_cache", True) else fn)
    return out
