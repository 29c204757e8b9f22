"""One training attempt as a composed runner (see docs/architecture.md).

``build.build_attempt(cfg)`` makes the parts once and hands them to a
``runner.Runner``, which sequences them: begin -> load data (the checkpoint's download starts) ->
build (the model's load) -> restore (the download joined) -> train -> finish | stop.
"""
