"""Sweeps: many jobs, one dollar budget, successive halving (docs/sweeps.md).

``space`` (the search space from Hydra-style overrides, as Optuna distributions), ``state`` (the sweep's
record in ``<storage.uri>/<sweep.name>/sweep.json``, conditional writes), ``decide`` (Optuna's samplers and
pruner over that record), ``driver`` (launching trials as ordinary jobs, asynchronously), ``cli`` (the
``launch -m`` entry and ``orchestrator status`` of a sweep).
"""
