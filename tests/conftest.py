"""Shared fixtures. Servers (S3 via moto's server mode, MLflow) are real processes on 127.0.0.1."""
pytest_plugins = ["tests.helpers.fixtures_s3", "tests.helpers.fixtures_mlflow", "tests.helpers.references"]

import pytest


def pytest_collection_modifyitems(items):
    """A module named ``*_e2e.py`` is end-to-end as a whole (its fixtures run jobs), whatever its tests' own marks."""
    for item in items:
        if item.module.__name__.endswith("_e2e"):
            item.add_marker(pytest.mark.e2e)
