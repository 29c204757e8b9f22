"""Training recipes: one readable module per method, each building one TRL trainer.

Recipes know nothing of storage, cost or requeue; the orchestrator reaches them
through Trainer callbacks. Shared loading code lives in ``recipes.common``.
"""
