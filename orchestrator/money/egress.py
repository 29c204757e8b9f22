"""What moving a job's bytes out of its bucket's region costs: the clouds' inter-region transfer list prices.

A zone in another region than the bucket (``storage.region``) downloads the checkpoint (and base weights kept in
the bucket) across regions at each start there, and the bucket's cloud bills that transfer per GB. The placement
(``orchestrator.planning.zone_order``) adds it to that zone's start.

DATED, INDICATIVE LIST PRICES, NOT QUOTES (as ``conf/pricing.yaml``): the per-GB rate for data moved between two
regions of the same cloud on one continent, read from each ``source`` page on ``as_of``. Other continents cost more
(up to $0.14/GB).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

BYTES_PER_GB = 1e9


@dataclass(frozen=True)
class EgressPrice:
    usd_per_gb: float
    source: str


EGRESS = {
    "aws": EgressPrice(
        0.02, "AWS data transfer between regions (aws.amazon.com/ec2/pricing/on-demand, Data Transfer, as of 2025-06)"
    ),
    "gcp": EgressPrice(
        0.02,
        "Cloud Storage data moved between regions on one continent "
        "(cloud.google.com/storage/pricing, Network, as of 2025-06)",
    ),
    "azure": EgressPrice(
        0.02,
        "Azure data transfer between regions within North America "
        "(azure.microsoft.com/pricing/details/bandwidth, as of 2025-06)",
    ),
}


def egress_price(cloud: str) -> EgressPrice:
    """The inter-region price for ``cloud`` (aws | gcp | azure; any other: the highest listed)."""
    known = EGRESS.get(cloud.lower())
    return known or max(EGRESS.values(), key=lambda p: p.usd_per_gb)


def egress_usd(nbytes: float, cloud: str, bucket_region: Optional[str], region: Optional[str]) -> float:
    """Dollars to move ``nbytes`` from the bucket's region to ``region``: 0 in the same region, or when either
    region is unknown."""
    if not bucket_region or not region or bucket_region == region:
        return 0.0
    return max(0.0, nbytes) / BYTES_PER_GB * egress_price(cloud).usd_per_gb
