"""Price lookup from the catalog, overrides, and the meter's arithmetic."""
from __future__ import annotations

import pytest

from orchestrator.config.schema import ComputeConfig
from orchestrator.records.ledger import attempts_cost_usd
from orchestrator.money.cost import CostMeter, load_catalog, lost_work, price_for, spot_savings_usd, usd_per_million_tokens, usd_per_step

CATALOG = {
    "a100-80gb": {
        "memory_gb": 80,
        "clouds": {
            "aws": {"on_demand": {"usd": 4.0, "as_of": "2025-06", "source": "aws page"}, "spot": {"usd": 1.5, "as_of": "2025-06", "source": "aws spot page"}},
            "gcp": {"on_demand": {"usd": 5.0, "as_of": "2025-06", "source": "gcp page"}, "spot": {"usd": 1.2, "as_of": "2025-06", "source": "gcp spot page"}},
        },
    },
    "cpu": {"memory_gb": 0, "unit": "node", "clouds": {"any": {"on_demand": {"usd": 0.1}, "spot": {"usd": 0.1}}}},
}


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_shipped_catalog_has_every_gpu_type_with_sources():
    catalog = load_catalog()
    assert {"t4", "a10g", "l4", "l40s", "a100-40gb", "a100-80gb", "h100-80gb", "h200", "cpu"} <= set(catalog)
    for gpu_type, entry in catalog.items():
        for cloud, figures in entry["clouds"].items():
            for mode in ("on_demand", "spot"):
                assert figures[mode]["usd"] > 0, (gpu_type, cloud, mode)
                assert figures[mode]["as_of"] and figures[mode]["source"], (gpu_type, cloud, mode)
            # a spot price above on-demand would make "savings" negative by typo
            assert figures["spot"]["usd"] <= figures["on_demand"]["usd"], (gpu_type, cloud)


def test_catalog_path_can_be_overridden_by_environment(tmp_path, monkeypatch):
    custom = tmp_path / "prices.yaml"
    custom.write_text("x1:\n  memory_gb: 8\n  clouds:\n    aws:\n      on_demand: {usd: 2.0}\n      spot: {usd: 1.0}\n")
    monkeypatch.setenv("ORCH_PRICING_FILE", str(custom))
    assert list(load_catalog()) == ["x1"]


def test_missing_catalog_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="price_per_hour"):
        load_catalog(tmp_path / "nope.yaml")


def test_spot_price_is_per_gpu_times_gpus_times_nodes():
    price = price_for(ComputeConfig(gpu_type="a100-80gb", gpus_per_node=8, nodes=2, spot=True, cloud="aws"), CATALOG)
    assert price.usd_per_gpu_hour == 1.5
    assert price.usd_per_hour_total == pytest.approx(1.5 * 16)
    assert price.on_demand_usd_per_hour_total == pytest.approx(4.0 * 16)
    assert price.gpus == 16
    assert "aws spot page" in price.source


def test_cloud_any_takes_the_cheapest_cloud_for_the_mode():
    spot = price_for(ComputeConfig(gpu_type="a100-80gb", gpus_per_node=1, spot=True, cloud="any"), CATALOG)
    on_demand = price_for(ComputeConfig(gpu_type="a100-80gb", gpus_per_node=1, spot=False, cloud="any"), CATALOG)
    assert (spot.cloud, spot.usd_per_gpu_hour) == ("gcp", 1.2)
    assert (on_demand.cloud, on_demand.usd_per_gpu_hour) == ("aws", 4.0)


def test_price_per_hour_overrides_the_catalog():
    price = price_for(ComputeConfig(gpu_type="a100-80gb", gpus_per_node=4, spot=True, cloud="aws", price_per_hour=1.2), CATALOG)
    assert price.usd_per_hour_total == pytest.approx(4.8)
    assert price.on_demand_usd_per_hour_total == pytest.approx(16.0)  # the baseline stays the list price
    assert "override" in price.source


def test_cpu_job_is_never_free():
    price = price_for(ComputeConfig(), CATALOG)  # defaults: gpu_type none, 0 GPUs, 1 node
    assert price.usd_per_hour_total == pytest.approx(0.1)
    assert price.gpus == 0


def test_unknown_gpu_type_lists_known_types():
    with pytest.raises(ValueError) as err:
        price_for(ComputeConfig(gpu_type="b200", gpus_per_node=8), CATALOG)
    assert "'b200'" in str(err.value) and "a100-80gb, cpu" in str(err.value) and "price_per_hour" in str(err.value)


def test_unknown_gpu_type_with_an_override_is_priced_by_the_override():
    price = price_for(ComputeConfig(gpu_type="b200", gpus_per_node=8, price_per_hour=6.0), CATALOG)
    assert price.usd_per_hour_total == pytest.approx(48.0)


def test_cloud_without_that_gpu_names_the_clouds_that_have_it():
    with pytest.raises(ValueError, match="aws, gcp"):
        price_for(ComputeConfig(gpu_type="a100-80gb", gpus_per_node=1, cloud="azure"), CATALOG)


def test_meter_charges_wall_time_from_attempt_start():
    clock = FakeClock(1000.0)
    price = price_for(ComputeConfig(gpu_type="a100-80gb", gpus_per_node=2, spot=True, cloud="aws"), CATALOG)
    meter = CostMeter(price, started_at=100.0, clock=clock)  # set-up began 900 s ago
    assert meter.attempt_seconds() == 900.0
    clock.now = 100.0 + 7200.0
    assert meter.attempt_cost_usd() == pytest.approx(2 * 1.5 * 2)  # 2 h x 2 GPUs x 1.5
    assert meter.gpu_hours() == pytest.approx(4.0)
    assert meter.on_demand_cost_usd() == pytest.approx(2 * 4.0 * 2)
    assert spot_savings_usd(meter.on_demand_cost_usd(), meter.attempt_cost_usd()) == pytest.approx(10.0)


def test_meter_starts_at_construction_by_default():
    clock = FakeClock(50.0)
    meter = CostMeter(price_for(ComputeConfig(), CATALOG), clock=clock)
    assert meter.attempt_cost_usd() == 0.0
    clock.now = 50.0 + 3600.0
    assert meter.attempt_cost_usd() == pytest.approx(0.1)


def test_ratios():
    assert usd_per_million_tokens(2.0, 4_000_000) == pytest.approx(0.5)
    assert usd_per_step(10.0, 200) == pytest.approx(0.05)
    assert usd_per_step(10.0, 0) is None and usd_per_million_tokens(1.0, 0) is None
    assert attempts_cost_usd([{"cost_usd": 1.25}, {"cost_usd": None}, {"cost_usd": 0.75}]) == pytest.approx(2.0)


def test_lost_work_counts_steps_redone_after_interruptions():
    attempts = [
        {"step_start": 0, "checkpoint_step_at_start": 0, "step_end": 130},  # preempted; last checkpoint at 100
        {"step_start": 100, "checkpoint_step_at_start": 100, "step_end": 120},  # preempted again before 130: redid 20
        {"step_start": 100, "checkpoint_step_at_start": 100, "step_end": None},  # vanished at once: no progress
        {"step_start": 100, "checkpoint_step_at_start": 100, "step_end": 200},  # redid 100..130, then new work
    ]
    lost = lost_work(attempts, seconds_per_step=36.0, usd_per_hour=10.0)
    assert lost.steps == 20 + 30
    assert lost.seconds == pytest.approx(50 * 36.0)
    assert lost.usd == pytest.approx(50 * 36.0 / 3600 * 10.0)


def test_no_interruption_means_no_lost_work():
    assert lost_work([{"step_start": 0, "step_end": 500}], seconds_per_step=1.0, usd_per_hour=1.0).steps == 0
