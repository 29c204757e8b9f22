"""Where this attempt landed, what it pays there, and why it is there (``compute.zones``).

Read at the attempt's start, from the environment only (no network call):

1. ``ORCH_ZONE``: set by the backend's script, the local supervisor's requeue loop (the first zone of
   ``planning.zone_order.ranked_zones``) or a bench;
2. else ``SKYPILOT_CLUSTER_INFO``: the JSON object SkyPilot gives each task, its ``zone`` (and ``region``);
3. else nothing: the attempt records no zone. The clouds' instance metadata (AWS IMDS, GCP's and Azure's metadata
   servers) would know, but is not asked here.

The price: on spot, the zone's fetched price (``ranked_zones``'s figure, else the price cache's newest for that
zone) for the whole allocation, else the catalog's; on-demand and ``compute.price_per_hour`` keep the attempt's own
price. The meter bills what is recorded. The reason: the placement's for that zone, or "the backend's choice" when
the zone was not ranked (``compute.zones`` unset, or the backend put the attempt elsewhere).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from orchestrator.config.zones import ZONE_NAME
from orchestrator.core.env import SKYPILOT_CLUSTER_INFO_ENV, ZONE_ENV
from orchestrator.money.cost import Price
from orchestrator.records.ledger_record import MAX_ZONE_REASON

log = logging.getLogger(__name__)

BACKENDS_CHOICE = "the backend's choice"


@dataclass(frozen=True)
class AttemptZone:
    zone: str
    region: Optional[str]
    usd_per_hour: float
    reason: str

    def fields(self) -> dict[str, Any]:
        """The ledger attempt's fields (``records.ledger.ZONE_FIELDS``)."""
        reason = self.reason if len(self.reason) <= MAX_ZONE_REASON else self.reason[: MAX_ZONE_REASON - 3] + "..."
        return {
            "zone": self.zone,
            "zone_region": self.region,
            "zone_usd_per_hour": self.usd_per_hour,
            "zone_reason": reason,
        }


def landed_zone(environ: Mapping[str, str]) -> tuple[Optional[str], Optional[str]]:
    """(zone, region) from ``ORCH_ZONE``, else SkyPilot's cluster info; (None, None) when neither names a zone. A
    value that is not a zone name is ignored with a warning (the environment is not the user's config)."""
    zone, region = environ.get(ZONE_ENV, "").strip(), None
    if not zone:
        try:
            info = json.loads(environ.get(SKYPILOT_CLUSTER_INFO_ENV) or "{}")
        except ValueError:
            info = {}
        info = info if isinstance(info, dict) else {}
        zone = str(info.get("zone") or "").strip().lower()
        region = str(info["region"]).strip() if isinstance(info.get("region"), str) else None
    if not zone:
        return None, None
    if not ZONE_NAME.match(zone):
        log.warning("zone %r (from the environment) is not a zone name; the attempt records none", zone[:80])
        return None, None
    return zone, region if region and ZONE_NAME.match(region) else None


def attempt_zone(
    cfg: Any,
    store: Any,
    run_name: str,
    price: Price,
    *,
    environ: Mapping[str, str],
    main: bool = True,
    now: Optional[float] = None,
) -> tuple[Optional[AttemptZone], Price]:
    """(where the attempt landed, the price its meter bills); (None, ``price``) when no zone is known, and on a
    rank other than the main one (which alone records and bills)."""
    from orchestrator.core.errors import UserError
    from orchestrator.planning.zone_order import ranked_zones, region_of, zone_prices

    zone, region = landed_zone(environ) if main else (None, None)
    if zone is None:
        return None, price
    now = time.time() if now is None else now
    try:
        ranked = ranked_zones(cfg, store, _ledger(store, run_name), now) if cfg.compute.zones is not None else []
    except UserError as err:  # auto with no prices: the attempt still runs where it landed
        log.warning("compute.zones: %s", err)
        ranked = []
    hit = next((r for r in ranked if r.zone == zone), None)
    prices = zone_prices(cfg, store, now)
    usd = price.usd_per_hour_total
    if price.spot and cfg.compute.price_per_hour is None:
        fetched = next((p for p in prices if p.zone == zone), None)
        if hit is not None and hit.capacity == "spot":
            usd = hit.usd_per_hour
        elif fetched is not None:
            usd = fetched.usd_per_gpu_hour * max(1, price.gpus)
    placed = AttemptZone(
        zone,
        (hit.region if hit else None) or region or region_of(zone, prices),
        usd,
        hit.reason if hit else BACKENDS_CHOICE,
    )
    if usd == price.usd_per_hour_total:
        return placed, price
    billed = dataclasses.replace(
        price, usd_per_hour_total=usd, usd_per_gpu_hour=usd / max(1, price.gpus), source=f"{zone}: fetched spot price"
    )
    return placed, billed


def _ledger(store: Any, run_name: str) -> Any:
    """The job's ledger decoded, None when it has none or it does not decode (the attempt's begin stops on that)."""
    from orchestrator.records.ledger import Ledger
    from orchestrator.records.ledger_record import LedgerRecord

    ledger = Ledger(store, run_name)
    try:
        raw = ledger.load()
        return LedgerRecord.decode(raw, ledger.uri) if raw else None
    except Exception as err:  # noqa: BLE001 - no history is a valid answer; the begin reports a bad ledger
        log.warning("compute.zones: the ledger could not be read (%s); ranking without the job's history", err)
        return None


def zone_tags(placed: Optional[AttemptZone], prior_attempts: Sequence[Any], fence: Optional[int]) -> dict[str, str]:
    """The MLflow run's zone tags: where this attempt runs (``zone``, its price and reason) and every attempt's
    zone so far (``zones``: ``fence:zone`` in order); none when no attempt names a zone."""
    where = [f"{a.fence}:{a.zone}" for a in prior_attempts if a.zone] + ([f"{fence}:{placed.zone}"] if placed else [])
    if not where:
        return {}
    tags = {"zones": " ".join(where)}
    if placed is not None:
        tags.update(zone=placed.zone, zone_usd_per_hour=f"{placed.usd_per_hour:.4f}", zone_reason=placed.reason[:500])
    return tags
