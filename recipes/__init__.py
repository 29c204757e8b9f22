"""Training recipes: one readable module per method, each building one TRL trainer.

Recipes know nothing of storage, cost or requeue; the orchestrator reaches them
through Trainer callbacks. Shared loading code lives in ``recipes.common``.

A recipe is a module with the three functions of :class:`Recipe`; :data:`REGISTRY` names each one
(``recipe.name`` in the config, ``conf/recipe/<name>.yaml``) and :func:`recipe_for` is how the
orchestrator gets it. A new recipe: a module with those functions, a line in the registry, a YAML file.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable


@runtime_checkable
class Recipe(Protocol):
    """What the orchestrator asks of a recipe (the trainer it builds is TRL's, with the callbacks it is given)."""

    def build_trainer(
        self, cfg: Any, *, train_dataset: Any, eval_dataset: Any, output_dir: str, callbacks: list, **options: Any
    ) -> Any:
        """The TRL trainer of this job, with ``callbacks`` (the orchestrator's) attached."""

    def evaluate(self, trainer: Any, cfg: Any, eval_dataset: Any = None) -> dict:
        """Held-out metrics of the trainer's model (eval loss and the recipe's quality metric)."""

    def accuracy(self, trainer: Any, cfg: Any, eval_dataset: Any) -> float:
        """The recipe's generation metric alone (the plan's trial and the quality watch use it)."""


def _sft():
    from recipes import sft

    return sft


def _dpo():
    from recipes import dpo

    return dpo


def _qlora():
    from recipes import qlora

    return qlora


def _grpo():
    from recipes import grpo

    return grpo


# recipe.name -> its module, imported when a job asks for it (each imports TRL's trainer lazily)
REGISTRY: dict[str, Callable[[], Recipe]] = {"sft": _sft, "dpo": _dpo, "qlora": _qlora, "grpo": _grpo}


def recipe_for(name: str) -> Recipe:
    """The recipe named ``name``; a name the registry lacks is a config error naming the choices."""
    if name not in REGISTRY:
        from orchestrator.core.errors import ConfigError

        raise ConfigError(
            f"recipe={name} is not a recipe; choose one of {', '.join(sorted(REGISTRY))} "
            "(a new recipe is a module with build_trainer/evaluate/accuracy and a line in "
            "recipes.REGISTRY)."
        )
    module = REGISTRY[name]()
    if not isinstance(module, Recipe):  # a module missing one of the three functions
        raise TypeError(f"recipes.{name} does not provide build_trainer, evaluate and accuracy")
    return module
