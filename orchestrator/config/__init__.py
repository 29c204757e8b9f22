"""The config boundary: typed schemas (``schema``, registered in Hydra's ConfigStore), composing ``conf/`` with a job's
overrides (``compose``), the catalogue of launch checks (``checks``), finite numbers (``numbers``) and durations."""
