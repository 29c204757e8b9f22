"""``compute.zones`` and ``compute.zone_cooldown`` are checked at launch (exit 4) and read once."""
import pytest

from orchestrator.app.compose import compose_config
from orchestrator.config.zones import AUTO, configured_zones, zone_cooldown_seconds
from orchestrator.core.errors import ConfigError

GPU = ["compute=t4-spot", "backend=skypilot", "storage.uri=s3://bucket/runs"]


def test_zones_compose_as_a_list_auto_or_unset():
    cfg = compose_config([*GPU, "compute.zones=[us-east-1a,us-west-2b]"], launch_checks=True)
    assert configured_zones(cfg.compute.zones) == ("us-east-1a", "us-west-2b")
    assert configured_zones(compose_config([*GPU, "compute.zones=auto"], launch_checks=True).compute.zones) == AUTO
    plain = compose_config(GPU, launch_checks=True)
    assert configured_zones(plain.compute.zones) is None
    assert zone_cooldown_seconds(plain.compute.zone_cooldown) == 600.0


@pytest.mark.parametrize("override,words", [
    ("compute.zones=[US_EAST]", "lower-case"),
    ("compute.zones=[us-east-1a,us-east-1a]", "twice"),
    ("compute.zone_cooldown=soon", "compute.zone_cooldown"),
])
def test_a_bad_zone_setting_is_a_config_error_naming_the_key(override, words):
    with pytest.raises(ConfigError, match=words):
        compose_config([*GPU, override], launch_checks=True)


def test_zones_on_a_cpu_job_are_refused():
    with pytest.raises(ConfigError, match="compute.zones"):
        compose_config(["compute.zones=[us-east-1a]"], launch_checks=True)
