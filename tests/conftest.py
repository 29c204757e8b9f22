"""Shared fixtures. Servers (S3 via moto's server mode, MLflow) are real processes on 127.0.0.1."""
pytest_plugins = ["tests.fixtures_s3", "tests.fixtures_mlflow", "tests.references"]
