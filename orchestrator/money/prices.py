"""Current prices: fetched per zone, cached in storage, preferred over the shipped catalog while fresh.

``orchestrator prices refresh`` (``orchestrator.money.price_sources``) fetches what each machine of the shipped
catalog (``conf/pricing.yaml``: its ``machine``, ``gpus`` and ``region``) costs now, spot and on-demand, per
zone, and keeps the answer at ``<storage.uri>/_prices/catalog.json``: one entry per machine, capacity and zone,
each with its fetch time and source. Every price, shipped or fetched, is the whole machine's hourly price
(docs/pricing.md).

``orchestrator.money.price_refresh.current_catalog`` is what the plan (and the launch, and the meter) price
with: the shipped catalog with every machine whose fetched prices are younger than ``pricing.max_age`` priced at
those (``overlay``: the median of the region's zones), plus the line ``provenance`` writes on where the prices
came from and how old they are. The cache is untrusted input: ``decode_cache`` checks every field, and a bad
cache is ignored with a warning.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Optional

log = logging.getLogger(__name__)

CACHE_KEY = "_prices/catalog.json"
CACHE_VERSION = 1
CLOUDS = ("aws", "azure", "gcp")
CAPACITIES = ("spot", "on_demand")
OFFLINE_ENV = "ORCH_PRICES_OFFLINE"  # 1: never fetch (as HF_HUB_OFFLINE): the test suite's default
DEFAULT_MAX_AGE_SECONDS = 3600.0


@dataclass(frozen=True)
class FetchedPrice:
    """One machine's price now, in one zone (or region where the cloud prices by region)."""

    gpu_type: str
    cloud: str  # aws | azure | gcp
    capacity: str  # spot | on_demand
    region: str
    zone: Optional[str]  # None: the cloud prices the whole region (on-demand, Azure)
    machine: str
    gpus: int
    usd_per_hour: float  # the whole machine
    fetched_at: float  # epoch seconds
    source: str

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / max(1, self.gpus)


@dataclass(frozen=True)
class MachineTarget:
    """A machine of the shipped catalog to price: what ``price_sources`` asks each cloud about."""

    gpu_type: str
    cloud: str
    machine: str
    gpus: int
    region: str


def targets(
    catalog: Mapping[str, Any], clouds: Iterable[str] = CLOUDS, regions: Optional[Iterable[str]] = None
) -> list[MachineTarget]:
    """The machines the shipped catalog names for ``clouds``, in their catalog region or each of ``regions``."""
    wanted, out = set(clouds), []
    for gpu_type, entry in catalog.items():
        for cloud, figures in (entry.get("clouds") or {}).items():
            quoted = figures.get("on_demand") or {}
            if cloud not in wanted or not quoted.get("machine") or not int(quoted.get("gpus") or 0):
                continue
            for region in list(regions) if regions else [str(quoted.get("region"))]:
                out.append(MachineTarget(str(gpu_type), cloud, str(quoted["machine"]), int(quoted["gpus"]), region))
    return out


# ---------------------------------------------------------------- the cache: encoded, decoded, checked


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: Any) -> Optional[float]:
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def encode_cache(prices: Iterable[FetchedPrice]) -> bytes:
    entries = [{**asdict(p), "fetched_at": iso(p.fetched_at)} for p in prices]
    return json.dumps({"version": CACHE_VERSION, "entries": entries}, indent=1, sort_keys=True).encode()


def _entry_problem(raw: Any, now: float) -> Optional[str]:
    if not isinstance(raw, dict):
        return "an entry is not an object"
    for key in ("gpu_type", "cloud", "capacity", "region", "machine", "source"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            return f"an entry's {key} is not a non-empty string"
    if raw["cloud"] not in CLOUDS or raw["capacity"] not in CAPACITIES:
        return f"an entry's cloud/capacity {raw['cloud']!r}/{raw['capacity']!r} is unknown"
    if raw.get("zone") is not None and not isinstance(raw["zone"], str):
        return "an entry's zone is not a string"
    gpus, usd = raw.get("gpus"), raw.get("usd_per_hour")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        return f"an entry's gpus {gpus!r} is not a positive integer"
    if not isinstance(usd, (int, float)) or isinstance(usd, bool) or not math.isfinite(usd) or usd <= 0:
        return f"an entry's usd_per_hour {usd!r} is not a positive finite number"
    when = _epoch(raw.get("fetched_at"))
    if when is None or when > now + 300:
        return f"an entry's fetched_at {raw.get('fetched_at')!r} is not a past ISO-8601 time"
    return None


def decode_cache(raw: bytes, *, now: Optional[float] = None) -> list[FetchedPrice]:
    """The cache's entries as typed records; ValueError naming the first problem (types, finiteness, positive
    prices, dates) for anything else."""
    now = time.time() if now is None else now
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"it is not JSON ({str(err)[:120]})") from None
    if not isinstance(doc, dict) or doc.get("version") != CACHE_VERSION or not isinstance(doc.get("entries"), list):
        raise ValueError(f"it is not a version-{CACHE_VERSION} price cache ({{'version', 'entries'}})")
    out = []
    for raw_entry in doc["entries"]:
        problem = _entry_problem(raw_entry, now)
        if problem:
            raise ValueError(problem)
        fields: dict[str, Any] = {
            **raw_entry,
            "fetched_at": _epoch(raw_entry["fetched_at"]),
            "usd_per_hour": float(raw_entry["usd_per_hour"]),
        }
        known: dict[str, Any] = {k: fields.get(k) for k in FetchedPrice.__dataclass_fields__}
        out.append(FetchedPrice(**known))
    return out


def read_cache(store: Any, *, now: Optional[float] = None) -> list[FetchedPrice]:
    """The cached prices in ``store``; none (with a warning) when the cache is missing, unreadable or bad."""
    try:
        if not store.exists(CACHE_KEY):
            return []
        raw = store.get_bytes(CACHE_KEY)
    except Exception as err:  # noqa: BLE001 - prices are advice: the shipped catalog stands
        log.warning("prices: could not read %s (%s); using the shipped catalog", CACHE_KEY, err)
        return []
    try:
        return decode_cache(raw, now=now)
    except ValueError as err:
        log.warning(
            "prices: ignoring the cached prices at %s: %s; `orchestrator prices refresh` rewrites it",
            store.get_uri(CACHE_KEY),
            err,
        )
        return []


def merge(old: Iterable[FetchedPrice], new: Iterable[FetchedPrice]) -> list[FetchedPrice]:
    """The cache after a refresh: every (cloud, region, machine, capacity) fetched now replaces its old entries;
    the rest (a cloud that did not answer this time) are kept with their own fetch times."""
    new = list(new)
    fetched = {(p.cloud, p.region, p.machine, p.capacity) for p in new}
    return [p for p in old if (p.cloud, p.region, p.machine, p.capacity) not in fetched] + new


def write_cache(store: Any, prices: Iterable[FetchedPrice]) -> str:
    store.put_bytes(CACHE_KEY, encode_cache(prices))
    return store.get_uri(CACHE_KEY)


# ---------------------------------------------------------------- the catalog the plan and the meter price with


def fresh(prices: Iterable[FetchedPrice], now: float, max_age: float) -> list[FetchedPrice]:
    return [p for p in prices if now - p.fetched_at <= max_age]


def overlay(catalog: Mapping[str, Any], prices: Iterable[FetchedPrice], now: float) -> dict[str, Any]:
    """A copy of ``catalog`` with each (GPU type, cloud, capacity) that ``prices`` has priced at the median of its
    zones' whole-machine prices / GPUs (the catalog entry's region's zones when they were fetched), its source
    saying so (zones, range, fetch time)."""
    out = copy.deepcopy(dict(catalog))
    groups: dict[tuple[str, str, str], list[FetchedPrice]] = {}
    for p in prices:
        groups.setdefault((p.gpu_type, p.cloud, p.capacity), []).append(p)
    for (gpu_type, cloud, capacity), found in groups.items():
        figures = (out.get(gpu_type) or {}).get("clouds", {}).get(cloud)
        if figures is None:
            continue
        home = [p for p in found if p.region == (figures.get(capacity) or {}).get("region")]
        found = home or found  # the catalog's region when it was fetched, else the regions that were
        machine_usd = statistics.median(p.usd_per_hour for p in found)
        low, high = min(p.usd_per_hour for p in found), max(p.usd_per_hour for p in found)
        first, newest = found[0], max(p.fetched_at for p in found)
        where = (
            f"median of {len(found)} zones (${low:.4g}-${high:.4g})" if len(found) > 1 else (first.zone or first.region)
        )
        figures[capacity] = {
            **figures.get(capacity, {}),
            "usd": machine_usd / first.gpus,
            "machine_usd": machine_usd,
            "machine": first.machine,
            "gpus": first.gpus,
            "region": first.region,
            "as_of": iso(newest),
            "basis": "whole machine: fetched instance price",
            "source": f"{first.source}, {first.machine} {first.region}: {where}, fetched {ago(now - newest)}",
        }
    return out


def ago(seconds: float) -> str:
    """How long ago, in words: "just now", "12 min ago", "3.5 h ago", "4 days ago"."""
    if not math.isfinite(seconds):
        return "at an unknown time"
    if seconds < 90:
        return "just now"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def shipped_as_of(catalog: Mapping[str, Any]) -> Optional[str]:
    """The oldest ``as_of`` of the shipped catalog's prices (YYYY-MM or a date), None when it states none."""
    dates = [
        str(q["as_of"])
        for e in catalog.values()
        for f in (e.get("clouds") or {}).values()
        for q in f.values()
        if isinstance(q, dict) and q.get("as_of")
    ]
    return min(dates) if dates else None


def shipped_age_days(as_of: str, now: float) -> Optional[int]:
    text = as_of if len(as_of) > 7 else f"{as_of}-01"  # YYYY-MM: its first day
    when = _epoch(text)
    return None if when is None else max(0, int((now - when) // 86400))


def provenance(
    shipped: Mapping[str, Any], used: Iterable[FetchedPrice], now: float, *, name: str = "shipped catalog"
) -> str:
    """The plan's line on where its prices come from: ``prices: fetched 12 min ago from aws`` or ``prices:
    shipped catalog of 2025-06, 550 days old`` (``name``: a catalog of one's own, ``$ORCH_PRICING_FILE``)."""
    used = list(used)
    as_of = shipped_as_of(shipped)
    days = shipped_age_days(as_of, now) if as_of else None
    old = f"{name} of {as_of}" + (f", {days} days old" if days is not None else "") if as_of else f"{name} (undated)"
    if not used:
        return f"prices: {old} (whole-machine list prices; `orchestrator prices refresh` fetches current ones)"
    clouds = ", ".join(sorted({p.cloud for p in used}))
    newest = max(p.fetched_at for p in used)
    return f"prices: fetched {ago(now - newest)} from {clouds} (the rest: {old})"
