"""GCP's current prices from the Cloud Billing Catalog, where credentials exist: a machine priced by its parts.

GCP prices an N1 or G2 machine with a GPU as parts: the GPU, each vCPU and each GiB of memory, one SKU each
(``services/6F81-5844-456A/skus``, Compute Engine). A machine's price is their sum over its shape
(``SHAPES``: n1-standard-4 = 4 vCPUs + 15 GiB, g2-standard-8 = 8 vCPUs + 32 GiB), on-demand from the SKUs whose
``category.usageType`` is OnDemand, spot from Preemptible (the Spot VM prices), each in the machine's region
(``serviceRegions``). Machine types GCP sells whole (A2, A3) are not summed: the shipped price stands.
Without Application Default Credentials nothing is asked: one note.
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, cast

from orchestrator.money.prices import FetchedPrice, MachineTarget

SKUS_URL = "https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus"
SCOPE = "https://www.googleapis.com/auth/cloud-billing.readonly"
SOURCE = "gcp Cloud Billing Catalog (GPU + vCPUs + memory)"
MAX_PAGES = 40
# machine shape: (the SKU family of its vCPUs and memory, vCPUs, GiB)
SHAPES = {"n1-standard-4": ("N1 Predefined Instance", 4, 15.0), "g2-standard-8": ("G2 Instance", 8, 32.0)}
GPU_SKU_NAMES = {"t4": "Nvidia Tesla T4", "l4": "Nvidia L4"}
USAGE = {"on_demand": "OnDemand", "spot": "Preemptible"}


def credentials_file() -> Optional[str]:
    """Where Application Default Credentials would come from, or None when there are none."""
    named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if named:
        return named
    folder = Path(os.environ.get("CLOUDSDK_CONFIG", Path.home() / ".config" / "gcloud"))
    default = folder / "application_default_credentials.json"
    return str(default) if default.is_file() else None


def access_token() -> str:
    import google.auth
    import google.auth.transport.requests

    credentials, _ = google.auth.default(scopes=[SCOPE])
    credentials.refresh(google.auth.transport.requests.Request())
    return credentials.token


def skus(url: str, token: str, *, timeout: float) -> Iterable[Mapping[str, Any]]:
    """Every SKU of the Compute Engine service, following ``nextPageToken``."""
    page_token = ""
    for _ in range(MAX_PAGES):
        query = urllib.parse.urlencode({"pageSize": 5000, **({"pageToken": page_token} if page_token else {})})
        request = urllib.request.Request(f"{url}?{query}", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            page = json.loads(answer.read())
        if not isinstance(page, dict) or not isinstance(page.get("skus", []), list):
            raise ValueError("the answer has no skus list")
        yield from (sku for sku in page.get("skus", []) if isinstance(sku, dict))
        page_token = page.get("nextPageToken") or ""
        if not page_token:
            return
    raise ValueError(f"more than {MAX_PAGES} pages")


def unit_usd(sku: Mapping[str, Any]) -> Optional[float]:
    """A SKU's current USD per unit (its last tier: the one past any free tier), None when it has none."""
    try:
        rates = sku["pricingInfo"][0]["pricingExpression"]["tieredRates"]
        price = rates[-1]["unitPrice"]
        usd = int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return usd if usd > 0 else None


def part_price(catalog: list[Mapping[str, Any]], region: str, capacity: str, family: str, part: str) -> Optional[float]:
    """USD per hour of one unit of a part ("Core", "Ram" or a GPU's name) in ``region`` on ``capacity``."""
    found = []
    for sku in catalog:
        category, text = sku.get("category") or {}, str(sku.get("description", ""))
        if category.get("usageType") != USAGE[capacity] or region not in (sku.get("serviceRegions") or []):
            continue
        if any(
            word in text for word in ("Commit", "Reserved", "Sole Tenancy", "Custom", "Premium", "DWS", "Workstation")
        ):
            continue
        if family and not (family in text and part.lower() in text.lower()):
            continue
        if not family and part not in text:
            continue
        usd = unit_usd(sku)
        if usd is not None:
            found.append(usd)
    return min(found) if found else None


def machine_price(catalog: list[Mapping[str, Any]], machine: MachineTarget, capacity: str) -> Optional[float]:
    shape = machine.machine.split(" + ")[0].strip()
    family, vcpus, gib = SHAPES[shape]
    gpu = GPU_SKU_NAMES.get(machine.gpu_type)
    parts = [
        part_price(catalog, machine.region, capacity, family, "Core"),
        part_price(catalog, machine.region, capacity, family, "Ram"),
        part_price(catalog, machine.region, capacity, "", gpu) if gpu else None,
    ]
    if any(p is None for p in parts):
        return None
    core, ram, gpu_usd = cast("list[float]", parts)
    return gpu_usd * machine.gpus + core * vcpus + ram * gib


def fetch_gcp(
    machines: list[MachineTarget], *, now: float, endpoints: Mapping[str, str], timeout: float
) -> tuple[list[FetchedPrice], list[str]]:
    if credentials_file() is None:
        return [], [
            "gcp: skipped (no Google credentials for the Cloud Billing Catalog); the shipped catalog's "
            "GCP machine prices stand"
        ]
    summed = [m for m in machines if m.machine.split(" + ")[0].strip() in SHAPES and m.gpu_type in GPU_SKU_NAMES]
    notes = (
        []
        if len(summed) == len(machines)
        else [
            "gcp: machine types sold whole (A2, A3) are not read from the Cloud Billing Catalog; their shipped prices stand"
        ]
    )
    try:
        catalog = list(skus(endpoints.get("gcp") or SKUS_URL, access_token(), timeout=timeout))
    except Exception as err:  # noqa: BLE001 - credentials refused, the network, a changed API: one line
        return [], notes + [f"gcp: {type(err).__name__}: {str(err)[:200]}"]
    out = []
    for machine in summed:
        for capacity in ("on_demand", "spot"):
            usd = machine_price(catalog, machine, capacity)
            if usd is None:
                notes.append(
                    f"gcp {capacity} {machine.machine} in {machine.region}: a part has no price in the catalog"
                )
                continue
            out.append(
                FetchedPrice(
                    machine.gpu_type,
                    "gcp",
                    capacity,
                    machine.region,
                    None,
                    machine.machine,
                    machine.gpus,
                    usd,
                    now,
                    SOURCE,
                )
            )
    return out, notes
