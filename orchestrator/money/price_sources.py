"""Where current prices come from: each cloud's price API, asked about the shipped catalog's machines.

- AWS (boto3, the standard credential chain): spot from ``ec2.describe_spot_price_history`` in the machine's
  region (``ProductDescriptions=['Linux/UNIX']``, ``StartTime`` now: the price in effect in each zone; the newest
  entry per zone wins); on-demand from the Price List API (``pricing.get_products`` in us-east-1: instanceType,
  location, operatingSystem Linux, tenancy Shared, preInstalledSw NA, capacitystatus Used).
- Azure: the public Retail Prices API (no credentials): ``type`` Consumption, ``unitOfMeasure`` 1 Hour, Linux
  (a ``productName`` without Windows); a ``skuName`` with Spot is the spot price, Low Priority (Batch's older
  offer, not a VM's) is skipped. Azure prices a region, not a zone.
- GCP (``orchestrator.money.price_gcp``): the Cloud Billing Catalog, with Application Default Credentials
  only (else skipped with a note): an N1 or G2 machine as the sum of its GPU, vCPU and memory SKUs.

Each fetcher returns (prices, notes): a note is a one-line reason some prices are missing; nothing here raises
for a cloud that does not answer.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Optional, cast

from orchestrator.money.price_gcp import fetch_gcp
from orchestrator.money.prices import FetchedPrice, MachineTarget

AZURE_RETAIL_URL = "https://prices.azure.com/api/retail/prices"
AWS_PRICING_REGION = "us-east-1"  # the Price List API's endpoint (it lists every region's prices)
TIMEOUT_SECONDS = 10.0
MAX_PAGES = 20
AWS_SPOT_SOURCE = "aws ec2.describe_spot_price_history (Linux/UNIX)"
AWS_ON_DEMAND_SOURCE = "aws pricing.get_products (Linux, Shared, on-demand)"
AZURE_SOURCE = "azure Retail Prices API"


def fetch_prices(
    machines: Iterable[MachineTarget],
    *,
    now: Optional[float] = None,
    endpoints: Optional[Mapping[str, str]] = None,
    timeout: float = TIMEOUT_SECONDS,
) -> tuple[list[FetchedPrice], list[str]]:
    """Current spot and on-demand prices of ``machines`` from each cloud's API. ``endpoints``: {"ec2",
    "pricing", "azure"} URLs in place of the clouds' own (a test's fake server)."""
    now = time.time() if now is None else now
    endpoints = dict(endpoints or {})
    by_cloud: dict[str, list[MachineTarget]] = {}
    for machine in machines:
        by_cloud.setdefault(machine.cloud, []).append(machine)
    prices, notes = [], []
    for cloud, fetch in (("aws", fetch_aws), ("azure", fetch_azure), ("gcp", fetch_gcp)):
        if cloud in by_cloud:
            got, said = fetch(by_cloud[cloud], now=now, endpoints=endpoints, timeout=timeout)
            prices += got
            notes += said + (unanswered(by_cloud[cloud], got) if got and cloud != "gcp" else [])  # gcp: its own
    return prices, notes


def unanswered(machines: Iterable[MachineTarget], got: Iterable[FetchedPrice]) -> list[str]:
    """A note for each machine a cloud that did answer gave no price for (not offered there, or not matched)."""
    priced = {(p.machine, p.region, p.capacity) for p in got}
    return [
        f"{m.cloud} {capacity} {m.machine} in {m.region}: no price in the answer; the catalog's stands"
        for m in machines
        for capacity in ("spot", "on_demand")
        if (m.machine, m.region, capacity) not in priced
    ]


# ---------------------------------------------------------------- AWS


def _aws_client(service: str, region: str, endpoint: Optional[str], timeout: float) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 2, "mode": "standard"})
    return boto3.session.Session().client(service, region_name=region, endpoint_url=endpoint, config=config)


def _no_credentials(err: Exception) -> bool:
    from botocore.exceptions import NoCredentialsError

    return isinstance(err, NoCredentialsError)


def _aws_error(err: Exception) -> str:
    if _no_credentials(err):
        return "no AWS credentials (the standard chain: environment, profile, instance role)"
    return f"{type(err).__name__}: {str(err)[:200]}"


def by_region(machines: list[MachineTarget]) -> dict[str, list[MachineTarget]]:
    """The machines grouped by their catalog region, in the catalog's order: one request (or page set) each."""
    groups: dict[str, list[MachineTarget]] = {}
    for machine in machines:
        groups.setdefault(machine.region, []).append(machine)
    return groups


def fetch_aws(
    machines: list[MachineTarget], *, now: float, endpoints: Mapping[str, str], timeout: float
) -> tuple[list[FetchedPrice], list[str]]:
    prices, notes = [], []
    for region, group in by_region(machines).items():
        try:
            prices += aws_spot(group, region, now=now, endpoint=endpoints.get("ec2"), timeout=timeout)
        except Exception as err:  # noqa: BLE001 - one line per cloud and region, the rest goes on
            notes.append(f"aws spot in {region}: {_aws_error(err)}")
            if _no_credentials(err):
                return prices, notes  # the on-demand call would say the same
        try:
            prices += aws_on_demand(group, region, now=now, endpoint=endpoints.get("pricing"), timeout=timeout)
        except Exception as err:  # noqa: BLE001
            notes.append(f"aws on-demand in {region}: {_aws_error(err)}")
    return prices, notes


def aws_spot(
    machines: list[MachineTarget],
    region: str,
    *,
    now: float,
    endpoint: Optional[str] = None,
    timeout: float = TIMEOUT_SECONDS,
) -> list[FetchedPrice]:
    """The spot price in effect in each zone of ``region`` for each machine: the newest entry per zone."""
    client = _aws_client("ec2", region, endpoint, timeout)
    by_type = {m.machine: m for m in machines}
    newest: dict[tuple[str, str], dict] = {}
    pages = client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=sorted(by_type),
        ProductDescriptions=["Linux/UNIX"],
        StartTime=datetime.fromtimestamp(now, timezone.utc),
        PaginationConfig={"MaxItems": 5000},
    )
    for page in pages:
        for row in page.get("SpotPriceHistory", []):
            key = (row["InstanceType"], row["AvailabilityZone"])
            if key not in newest or row["Timestamp"] > newest[key]["Timestamp"]:
                newest[key] = row
    out = []
    for (instance_type, zone), row in sorted(newest.items()):
        machine, usd = by_type.get(instance_type), float(row["SpotPrice"])
        if machine is None or not usd > 0:
            continue
        out.append(
            FetchedPrice(
                machine.gpu_type,
                "aws",
                "spot",
                region,
                zone,
                instance_type,
                machine.gpus,
                usd,
                now,
                f"{AWS_SPOT_SOURCE} of {row['Timestamp'].strftime('%Y-%m-%d %H:%M')}Z",
            )
        )
    return out


def aws_location(region: str) -> str:
    """The Price List API's ``location`` of a region (``US East (N. Virginia)``), from botocore's endpoint data."""
    from botocore.loaders import Loader

    for partition in Loader().load_data("endpoints")["partitions"]:
        if region in partition["regions"]:
            return partition["regions"][region]["description"]
    raise ValueError(f"unknown AWS region {region!r}")


def aws_on_demand(
    machines: list[MachineTarget],
    region: str,
    *,
    now: float,
    endpoint: Optional[str] = None,
    timeout: float = TIMEOUT_SECONDS,
) -> list[FetchedPrice]:
    client = _aws_client("pricing", AWS_PRICING_REGION, endpoint, timeout)
    location, out = aws_location(region), []
    for machine in machines:
        filters = [
            {"Type": "TERM_MATCH", "Field": field, "Value": value}
            for field, value in (
                ("instanceType", machine.machine),
                ("location", location),
                ("operatingSystem", "Linux"),
                ("tenancy", "Shared"),
                ("preInstalledSw", "NA"),
                ("capacitystatus", "Used"),
            )
        ]
        usd = []
        for page in client.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters):
            for product in page.get("PriceList", []):
                usd += on_demand_usd(json.loads(product) if isinstance(product, str) else product)
        if usd:  # several SKUs (license models) may match: the plain Linux one is the cheapest
            out.append(
                FetchedPrice(
                    machine.gpu_type,
                    "aws",
                    "on_demand",
                    region,
                    None,
                    machine.machine,
                    machine.gpus,
                    min(usd),
                    now,
                    AWS_ON_DEMAND_SOURCE,
                )
            )
    return out


def on_demand_usd(product: Mapping[str, Any]) -> list[float]:
    """The positive hourly USD prices of one Price List product's on-demand terms."""
    out = []
    for term in ((product.get("terms") or {}).get("OnDemand") or {}).values():
        for dimension in (term.get("priceDimensions") or {}).values():
            if dimension.get("unit") not in ("Hrs", "Hours"):
                continue
            try:
                usd = float(cast(Any, (dimension.get("pricePerUnit") or {}).get("USD")))  # None: TypeError
            except (TypeError, ValueError):
                continue
            if usd > 0:
                out.append(usd)
    return out


# ---------------------------------------------------------------- Azure


def fetch_azure(
    machines: list[MachineTarget], *, now: float, endpoints: Mapping[str, str], timeout: float
) -> tuple[list[FetchedPrice], list[str]]:
    prices, notes = [], []
    for region, group in by_region(machines).items():
        try:
            prices += azure_prices(
                group, region, now=now, url=endpoints.get("azure") or AZURE_RETAIL_URL, timeout=timeout
            )
        except Exception as err:  # noqa: BLE001 - the network, a proxy, a changed API: one line
            notes.append(f"azure in {region}: {type(err).__name__}: {str(err)[:200]}")
    return prices, notes


def azure_query(skus: Iterable[str], region: str) -> str:
    names = " or ".join(f"armSkuName eq '{sku}'" for sku in sorted(skus))
    return (
        f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and priceType eq 'Consumption' "
        f"and ({names})"
    )


def azure_items(url: str, *, timeout: float) -> Iterable[Mapping[str, Any]]:
    """Every item of a Retail Prices query, following ``NextPageLink`` (at most MAX_PAGES pages)."""
    for _ in range(MAX_PAGES):
        with urllib.request.urlopen(
            urllib.request.Request(url, headers={"Accept": "application/json"}), timeout=timeout
        ) as answer:
            page = json.loads(answer.read())
        if not isinstance(page, dict) or not isinstance(page.get("Items"), list):
            raise ValueError("the answer has no Items list")
        yield from (item for item in page["Items"] if isinstance(item, dict))
        url = cast(str, page.get("NextPageLink"))
        if not url:
            return
    raise ValueError(f"more than {MAX_PAGES} pages")


def azure_capacity(item: Mapping[str, Any]) -> Optional[str]:
    """spot | on_demand for a Linux pay-as-you-go hourly VM price; None for anything else."""
    sku, product = str(item.get("skuName", "")), str(item.get("productName", ""))
    if item.get("type") != "Consumption" or item.get("unitOfMeasure") != "1 Hour" or "Windows" in product:
        return None
    if "Low Priority" in sku:
        return None
    return "spot" if "Spot" in sku else "on_demand"


def azure_prices(
    machines: list[MachineTarget],
    region: str,
    *,
    now: float,
    url: str = AZURE_RETAIL_URL,
    timeout: float = TIMEOUT_SECONDS,
) -> list[FetchedPrice]:
    by_sku = {m.machine: m for m in machines}
    # "$filter" as the API documents it (a literal $), its OData expression percent-encoded
    query = url + ("&" if "?" in url else "?") + "$filter=" + urllib.parse.quote(azure_query(by_sku, region))
    best: dict[tuple[str, str], tuple[str, float]] = {}
    for item in azure_items(query, timeout=timeout):
        capacity, sku = azure_capacity(item), item.get("armSkuName")
        usd = item.get("retailPrice")
        if capacity is None or sku not in by_sku or item.get("armRegionName") != region:
            continue
        if not isinstance(usd, (int, float)) or isinstance(usd, bool) or not usd > 0:
            continue
        start = str(item.get("effectiveStartDate", ""))
        if (sku, capacity) not in best or start > best[(sku, capacity)][0]:  # the newest price in effect
            best[(sku, capacity)] = (start, float(usd))
    out = []
    for (sku, capacity), (start, usd) in sorted(best.items()):
        machine = by_sku[sku]
        out.append(
            FetchedPrice(
                machine.gpu_type,
                "azure",
                capacity,
                region,
                None,
                sku,
                machine.gpus,
                usd,
                now,
                f"{AZURE_SOURCE} (effective {start[:10] or '?'})",
            )
        )
    return out
