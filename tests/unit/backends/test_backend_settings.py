"""``backend.extra`` is typed per backend by a structured schema: values converted, unknown keys and wrong types refused."""
from __future__ import annotations

import pytest

from orchestrator.backends.settings import KubernetesSettings, SkyPilotSettings, SlurmSettings, backend_settings
from orchestrator.app.compose import compose_config
from orchestrator.core.errors import ConfigError


def _settings(*overrides: str):
    return backend_settings(compose_config(list(overrides), launch_checks=False))


def test_each_backend_reads_its_own_typed_settings():
    assert _settings("backend=slurm", "+backend.extra.sbatch_args=['--time=01:00:00']", "+backend.extra.output=/x/%j") \
        == SlurmSettings(output="/x/%j", sbatch_args=("--time=01:00:00",))
    k8s = _settings("backend=kubernetes", "+backend.extra.namespace=training", "+backend.extra.image_paths=[/app/data]")
    assert k8s == KubernetesSettings(namespace="training", image_paths=("/app/data",))
    sky = _settings("backend=skypilot", "+backend.extra.disk_size='12'", "+backend.extra.file_mounts={/mnt/d: /tmp}")
    assert sky == SkyPilotSettings(disk_size=12, file_mounts={"/mnt/d": "/tmp"})


@pytest.mark.parametrize("overrides,message", [
    (["backend=slurm", "+backend.extra.partiton=gpu"],
     "backend.extra.partiton is not a setting of backend=slurm (its settings: output, python, sbatch_args, zone_partitions)"),
    (["+backend.extra.python=x"], "backend.extra.python is not a setting of backend=local (its settings: none)"),
    (["backend=skypilot", "+backend.extra.disk_size=big"], "backend.extra.disk_size must be a whole number; got 'big'"),
    (["backend=slurm", "+backend.extra.sbatch_args=one-option"], "backend.extra.sbatch_args must be a list"),
    (["backend=slurm", "+backend.extra.output=[a, b]"], "backend.extra.output must be a single value"),
    (["backend=skypilot", "+backend.extra.file_mounts={/a: [1]}"], "backend.extra.file_mounts must map paths to paths"),
    (["backend=slurm", "+backend.extra.zone_partitions={us-east-1a: [a]}"],
     "backend.extra.zone_partitions must map zones to partitions"),
])
def test_an_unknown_setting_or_a_wrong_type_is_a_config_error_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        _settings(*overrides)
    assert message in str(err.value)
