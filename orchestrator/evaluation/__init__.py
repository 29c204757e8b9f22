"""Benchmark scores of checkpoints with lm-evaluation-harness (``eval`` config group, docs/quality.md).

- ``spec``: ``eval.tasks`` resolved to the harness's task configs without loading a model; the launch checks;
  the task configuration's hash.
- ``harness``: one ``lm_eval.simple_evaluate`` of a model (in memory, or a folder: full weights or base + adapter).
- ``results``: results stored in ``<storage.uri>/<run>/bench/<key>/``, each with its checkpoint manifest's hash, the
  harness version, the task hash and the seed, and a hash of its own; a result that does not match is refused.
- ``stats``: the gain over the base model with its 95% interval; USD per point only beyond noise.
- ``watch``: the training attempt's evaluations, after the ``eval.every``-th commits and of the final weights.
"""
