"""Current prices: fetched per zone from the clouds' APIs (a local server replaying their recorded responses),
cached in storage, preferred over the shipped catalog while fresh, refreshed when stale, and never a failure of
the plan when the network or the cache is bad."""
from __future__ import annotations

import json
import logging
import statistics
from datetime import datetime, timezone
from functools import partial

import pytest

from orchestrator.config.schema import ComputeConfig
from orchestrator.money import price_gcp, price_refresh, price_sources, prices
from orchestrator.money.cost import load_catalog, price_for
from orchestrator.storage import LocalStore
from tests.helpers.fake_prices import TOKEN, FakePrices

NOW = datetime(2026, 12, 7, 22, 0, tzinfo=timezone.utc).timestamp()
# the newest entry per zone in the recorded DescribeSpotPriceHistory pages (an older one for us-east-1a is on page 1)
G4DN_SPOT = {"us-east-1a": 0.1987, "us-east-1b": 0.2263, "us-east-1d": 0.2125}
G6E_SPOT = {"us-east-1a": 0.8874, "us-east-1b": 0.912, "us-east-1c": 0.9351}


@pytest.fixture
def aws_env(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", "/nonexistent")


@pytest.fixture
def fake(aws_env):
    with FakePrices() as server:
        yield server


def _fetch(fake, clouds=("aws", "azure", "gcp")):
    return price_sources.fetch_prices(prices.targets(load_catalog(), clouds), now=NOW, endpoints=fake.endpoints)


def _by(got, cloud, capacity, machine):
    return {p.zone or p.region: p.usd_per_hour for p in got if (p.cloud, p.capacity, p.machine) == (cloud, capacity, machine)}


def test_aws_spot_is_the_newest_price_of_each_zone_and_on_demand_the_listed_one(fake):
    got, notes = _fetch(fake, ["aws"])
    assert _by(got, "aws", "spot", "g4dn.xlarge") == G4DN_SPOT  # 0.2418 of 18:02 in us-east-1a lost to 0.1987 of 21:31
    assert _by(got, "aws", "spot", "g6e.xlarge") == G6E_SPOT
    # the on-demand term's price, not the reserved one in the same product (0.331)
    assert _by(got, "aws", "on_demand", "g4dn.xlarge") == {"us-east-1": 0.526}
    assert fake.requests.count("ec2.DescribeSpotPriceHistory") == 2, "both pages read"
    # the machines the recorded answers do not price are said, one line each, and keep the catalog's price
    assert "aws spot g5.xlarge in us-east-1: no price in the answer; the catalog's stands" in notes
    assert not [n for n in notes if "g4dn.xlarge" in n or "g6e.xlarge" in n], notes


def test_azure_reads_every_page_and_keeps_linux_pay_as_you_go_and_spot(fake):
    got, notes = _fetch(fake, ["azure"])
    # page 1: not Windows (0.71), not Low Priority (0.1052), not a reservation or dev/test; spot: the newest (0.1711)
    assert _by(got, "azure", "on_demand", "Standard_NC4as_T4_v3") == {"eastus": 0.526}
    assert _by(got, "azure", "spot", "Standard_NC4as_T4_v3") == {"eastus": 0.1711}
    # page 2, through NextPageLink: the Linux spot price, not the Windows one
    assert _by(got, "azure", "spot", "Standard_NC24ads_A100_v4") == {"eastus": 1.3498}
    assert fake.requests.count("azure.retail") == 2
    assert "armRegionName eq 'eastus'" in fake.azure_filters[0] and "Standard_NC4as_T4_v3" in fake.azure_filters[0]
    assert fake.raw_queries[0].startswith("$filter=serviceName%20eq%20%27Virtual%20Machines%27"), fake.raw_queries[0]
    assert notes == [f"azure {c} Standard_NC40ads_H100_v5 in eastus: no price in the answer; the catalog's stands"
                     for c in ("spot", "on_demand")]


def test_gcp_without_credentials_is_skipped_with_one_note(fake):
    got, notes = _fetch(fake, ["gcp"])
    assert got == [] and len(notes) == 1 and notes[0].startswith("gcp: skipped")


def test_gcp_with_credentials_sums_the_gpu_vcpus_and_memory_of_each_machine(fake, tmp_path, monkeypatch):
    key = tmp_path / "adc.json"
    key.write_text("{}")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    monkeypatch.setattr(price_gcp, "access_token", lambda: TOKEN)
    got, notes = _fetch(fake, ["gcp"])
    # T4 + 4 vCPU + 15 GiB (n1-standard-4); L4 + 8 vCPU + 32 GiB (g2-standard-8): us-central1's SKUs, both pages,
    # not the T4's Virtual Workstation SKU, not a commitment, not Belgium's L4
    assert _by(got, "gcp", "on_demand", "n1-standard-4 + 1x T4") == {"us-central1": pytest.approx(0.35 + 4 * 0.031611 + 15 * 0.004237)}
    assert _by(got, "gcp", "spot", "n1-standard-4 + 1x T4") == {"us-central1": pytest.approx(0.14 + 4 * 0.00698 + 15 * 0.000936)}
    assert _by(got, "gcp", "on_demand", "g2-standard-8") == {"us-central1": pytest.approx(0.56 + 8 * 0.024988 + 32 * 0.002927)}
    assert _by(got, "gcp", "spot", "g2-standard-8") == {"us-central1": pytest.approx(0.224 + 8 * 0.009996 + 32 * 0.001171)}
    assert fake.requests == ["gcp.skus", "gcp.skus"]
    assert notes == ["gcp: machine types sold whole (A2, A3) are not read from the Cloud Billing Catalog; their "
                     "shipped prices stand"]


def test_the_cache_round_trips_as_typed_records(fake, tmp_path):
    got, _ = _fetch(fake)
    store = LocalStore(tmp_path)
    prices.write_cache(store, got)
    back = prices.read_cache(store, now=NOW)
    assert back == got
    assert all(isinstance(p.usd_per_hour, float) and isinstance(p.gpus, int) for p in back)
    doc = json.loads((tmp_path / prices.CACHE_KEY).read_text())
    assert {e["fetched_at"] for e in doc["entries"]} == {"2026-12-07T22:00:00Z"} and all(e["source"] for e in doc["entries"])


@pytest.mark.parametrize(("change", "why"), [
    (lambda e: e.update(usd_per_hour=-0.2), "usd_per_hour"),
    (lambda e: e.update(usd_per_hour=float("nan")), "usd_per_hour"),
    (lambda e: e.update(usd_per_hour="0.2"), "usd_per_hour"),
    (lambda e: e.update(gpus=True), "gpus"),
    (lambda e: e.update(fetched_at="yesterday"), "fetched_at"),
    (lambda e: e.update(fetched_at="2027-06-01T00:00:00Z"), "fetched_at"),
    (lambda e: e.update(cloud="oracle"), "cloud"),
])
def test_a_bad_cache_is_ignored_with_a_warning(tmp_path, caplog, change, why):
    entry = {"gpu_type": "t4", "cloud": "aws", "capacity": "spot", "region": "us-east-1", "zone": "us-east-1a",
             "machine": "g4dn.xlarge", "gpus": 1, "usd_per_hour": 0.2, "fetched_at": "2026-12-07T21:59:00Z", "source": "x"}
    change(entry)
    raw = json.dumps({"version": 1, "entries": [entry]}, allow_nan=True)
    (tmp_path / "_prices").mkdir()
    (tmp_path / prices.CACHE_KEY).write_text(raw)
    with caplog.at_level(logging.WARNING):
        assert prices.read_cache(LocalStore(tmp_path), now=NOW) == []
    assert "ignoring the cached prices" in caplog.text and why in caplog.text
    (tmp_path / prices.CACHE_KEY).write_text("{not json")
    assert prices.read_cache(LocalStore(tmp_path), now=NOW) == []


def _job(tmp_path, *overrides):
    from orchestrator.app.compose import compose_config

    return compose_config(["compute=l40s-spot", f"storage.uri={tmp_path}", *overrides])


def test_a_stale_cache_is_refreshed_and_the_meter_prices_with_the_fetched_prices(fake, tmp_path, monkeypatch):
    monkeypatch.delenv(prices.OFFLINE_ENV, raising=False)
    store = LocalStore(tmp_path)
    old = prices.FetchedPrice("l40s", "aws", "spot", "us-east-1", "us-east-1a", "g6e.xlarge", 1, 5.0, NOW - 7200, "old")
    prices.write_cache(store, [old])  # two hours old: stale at pricing.max_age=1h
    fetcher = partial(price_sources.fetch_prices, endpoints=fake.endpoints)
    cfg = _job(tmp_path)
    catalog, line = price_refresh.current_catalog(cfg, now=NOW, fetcher=fetcher)
    assert line.startswith("prices: fetched just now from aws, azure"), line
    price = price_for(ComputeConfig(gpu_type="l40s", gpus_per_node=1, spot=True, cloud="aws"), catalog)
    assert price.usd_per_hour_total == pytest.approx(statistics.median(G6E_SPOT.values()))
    assert "median of 3 zones" in price.source
    t4 = price_for(ComputeConfig(gpu_type="t4", gpus_per_node=2, spot=True, cloud="any"), catalog)
    assert (t4.cloud, t4.usd_per_hour_total) == ("azure", pytest.approx(2 * 0.1711))  # cheapest machine now
    cached = prices.read_cache(store, now=NOW)
    assert old not in cached and {p.fetched_at for p in cached} == {NOW}
    asked = len(fake.requests)
    _, again = price_refresh.current_catalog(cfg, now=NOW + 600, fetcher=fetcher)  # fresh: no request
    assert len(fake.requests) == asked and again.startswith("prices: fetched 10 min ago from aws, azure")
    price_refresh.current_catalog(_job(tmp_path, "pricing.max_age=5m"), now=NOW + 600, fetcher=fetcher)
    assert len(fake.requests) > asked, "older than pricing.max_age: fetched again"


def test_a_network_failure_keeps_the_catalog_with_a_warning(aws_env, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(prices.OFFLINE_ENV, raising=False)
    closed = FakePrices()  # bound, never served: nothing answers on its port once closed
    closed.server.server_close()
    fetcher = partial(price_sources.fetch_prices, endpoints=closed.endpoints, timeout=2)
    store = LocalStore(tmp_path)
    old = prices.FetchedPrice("l40s", "aws", "spot", "us-east-1", "us-east-1a", "g6e.xlarge", 1, 5.0, NOW - 7200, "old")
    prices.write_cache(store, [old])
    before = (tmp_path / prices.CACHE_KEY).read_bytes()
    with caplog.at_level(logging.WARNING):
        catalog, line = price_refresh.current_catalog(_job(tmp_path), now=NOW, fetcher=fetcher)
    assert catalog == load_catalog(), "the shipped catalog, whole"
    assert line.startswith("prices: shipped catalog of 2025-06, ") and "days old" in line
    assert "no current prices fetched" in caplog.text and "aws spot in us-east-1" in caplog.text
    assert (tmp_path / prices.CACHE_KEY).read_bytes() == before, "the cache is kept as it was"


def test_the_plan_refreshes_stale_prices_and_says_where_they_come_from(fake, tmp_path, monkeypatch):
    from orchestrator.planning.plan import plan_text

    monkeypatch.delenv(prices.OFFLINE_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", fake.url)  # botocore's own per-service endpoint variables
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", fake.url)
    monkeypatch.setattr(price_sources, "AZURE_RETAIL_URL", fake.endpoints["azure"])
    text = plan_text(_job(tmp_path, "model=llama-3.1-8b", "recipe=qlora"))
    assert "\nprices: fetched just now from aws, azure (the rest: shipped catalog of 2025-06" in text, text
    assert f"  l40s          48 GB      ${statistics.median(G6E_SPOT.values()):.2f}/h" in text, text
    assert (tmp_path / prices.CACHE_KEY).is_file()
    doc = json.loads(plan_text(_job(tmp_path, "model=llama-3.1-8b", "recipe=qlora", "pricing.refresh=false"), as_json=True))
    assert doc["prices"].startswith("prices: fetched just now from aws, azure")


def test_offline_the_plan_never_asks_and_states_the_shipped_catalogs_age(fake, tmp_path, monkeypatch):
    monkeypatch.setenv(prices.OFFLINE_ENV, "1")
    fetcher = partial(price_sources.fetch_prices, endpoints=fake.endpoints)
    _, line = price_refresh.current_catalog(_job(tmp_path), now=NOW, fetcher=fetcher)
    assert fake.requests == [] and line.startswith("prices: shipped catalog of 2025-06, 554 days old")


def test_a_bad_max_age_is_a_config_error(tmp_path):
    from orchestrator.core.errors import ConfigError

    with pytest.raises(ConfigError, match="pricing.max_age"):
        price_refresh.current_catalog(_job(tmp_path, "pricing.max_age=soon"), now=NOW, refresh=False)


def test_cli_refresh_caches_prices_and_refuses_an_unknown_cloud(fake, tmp_path, monkeypatch, capsys):
    from orchestrator.cli.main import main

    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", fake.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", fake.url)
    monkeypatch.setattr(price_sources, "AZURE_RETAIL_URL", fake.endpoints["azure"])
    assert main(["prices", "refresh", "--storage-uri", str(tmp_path), "--clouds", "aws,azure", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cache"].endswith("_prices/catalog.json") and len(doc["prices"]) == 12
    assert len(prices.read_cache(LocalStore(tmp_path))) == 12
    assert main(["prices", "refresh", "--storage-uri", str(tmp_path), "--clouds", "aws,oracle"]) == 2
    assert "error: --clouds 'aws,oracle'" in capsys.readouterr().err


def test_a_price_is_the_catalog_regions_median_zone_when_that_region_was_fetched():
    def spot(region, zone, usd):
        return prices.FetchedPrice("l40s", "aws", "spot", region, zone, "g6e.xlarge", 1, usd, NOW, "aws test")

    east = [spot("us-east-1", "us-east-1a", 0.9), spot("us-east-1", "us-east-1b", 1.1), spot("us-east-1", "us-east-1c", 1.0)]
    west = [spot("us-west-2", "us-west-2a", 0.3)]
    catalog = load_catalog()
    quoted = prices.overlay(catalog, east + west, NOW)["l40s"]["clouds"]["aws"]["spot"]
    assert quoted["usd"] == pytest.approx(1.0) and quoted["region"] == "us-east-1"
    assert "median of 3 zones ($0.9-$1.1)" in quoted["source"]
    quoted = prices.overlay(catalog, west, NOW)["l40s"]["clouds"]["aws"]["spot"]
    assert quoted["usd"] == pytest.approx(0.3) and quoted["region"] == "us-west-2"
    assert catalog["l40s"]["clouds"]["aws"]["spot"]["usd"] == 0.8, "the shipped catalog is not changed"


def test_a_catalog_of_ones_own_is_named_and_an_undated_one_said_so(tmp_path, monkeypatch):
    own = tmp_path / "mine.yaml"
    own.write_text("x1:\n  memory_gb: 8\n  clouds:\n    aws:\n      on_demand: {usd: 2.0}\n      spot: {usd: 1.0}\n")
    cfg = _job(tmp_path)
    monkeypatch.setenv("ORCH_PRICING_FILE", str(own))
    _, line = price_refresh.current_catalog(cfg, now=NOW, refresh=False)
    assert line.startswith(f"prices: catalog {own} ($ORCH_PRICING_FILE) (undated)"), line


def test_an_attempt_is_billed_at_the_fresh_cached_price_and_at_the_shipped_one_without(tmp_path, monkeypatch):
    """The meter of an attempt (``attempt.build.attempt_price``, as the builder and the supervisor's start-up holds
    call it) prices with the cache's fresh prices, read, never fetched; with no fresh cache, the shipped catalog."""
    import time

    from omegaconf import OmegaConf

    from orchestrator.attempt.build import attempt_price
    from orchestrator.money.cost import load_catalog

    store = LocalStore(tmp_path)
    cfg = _job(tmp_path, "compute=l40s-spot", "compute.cloud=aws")
    shipped = price_for(OmegaConf.to_object(cfg.compute), load_catalog()).usd_per_hour_total
    current, _ = price_refresh.current_catalog(cfg, refresh=False, store=store)
    assert attempt_price(OmegaConf.to_object(cfg.compute), {}, current)[3].usd_per_hour_total == pytest.approx(shipped)
    fresh = prices.FetchedPrice("l40s", "aws", "spot", "us-east-1", "us-east-1a", "g6e.xlarge", 1, 0.77, time.time(), "t")
    prices.write_cache(store, [fresh])
    current, _ = price_refresh.current_catalog(cfg, refresh=False, store=store)
    assert attempt_price(OmegaConf.to_object(cfg.compute), {}, current)[3].usd_per_hour_total == pytest.approx(0.77)
