"""The zones a job's next attempt is placed in, best first (``compute.zones``).

A stand-in with the interface the placement's ranking keeps: the configured zones in the user's order, each
priced at the catalog's price for the job (``orchestrator.money.cost``); ``auto`` and unset give none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from orchestrator.config.zones import AUTO, configured_zones
from orchestrator.money.cost import load_catalog, price_for


@dataclass(frozen=True)
class RankedZone:
    zone: str
    region: Optional[str]
    usd_per_hour: float
    usd_per_useful_hour: float
    reason: str


def ranked_zones(cfg: Any, store: Any, ledger_record: Any = None, now: Optional[float] = None) -> list[RankedZone]:
    """``compute.zones`` best first ([] when unset or ``auto``); ``store``, ``ledger_record`` and ``now`` unused."""
    zones = configured_zones(cfg.compute.zones)
    if zones is None or zones == AUTO:
        return []
    usd = price_for(cfg.compute, load_catalog()).usd_per_hour_total
    return [RankedZone(zone, None, usd, usd, "listed in compute.zones") for zone in zones]
