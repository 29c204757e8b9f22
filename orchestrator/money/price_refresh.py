"""The catalog to price a job with now: the shipped one, with the fresh fetched prices over it, refreshed when stale.

``current_catalog`` is what the plan calls (and the launch, and the meter, at merge): it reads the cache
(``orchestrator.money.prices``), fetches when nothing cached is younger than ``pricing.max_age``
(``orchestrator.money.price_sources``), and says where the prices came from in one line.
"""

from __future__ import annotations

import logging
import os
import time
from functools import partial
from typing import Any, Callable, Mapping, Optional

from orchestrator.money.price_sources import fetch_prices
from orchestrator.money.prices import (
    CACHE_KEY,
    CLOUDS,
    DEFAULT_MAX_AGE_SECONDS,
    OFFLINE_ENV,
    FetchedPrice,
    fresh,
    merge,
    overlay,
    provenance,
    read_cache,
    targets,
    write_cache,
)

log = logging.getLogger("orchestrator.money.prices")
PLAN_TIMEOUT_SECONDS = 5.0  # each connection and read of a refresh the plan makes


Fetcher = Callable[..., tuple[list[FetchedPrice], list[str]]]


def current_catalog(
    cfg: Any,
    *,
    now: Optional[float] = None,
    refresh: Optional[bool] = None,
    fetcher: Optional[Fetcher] = None,
    store: Any = None,
) -> tuple[dict[str, Any], str]:
    """(catalog, provenance line) to price ``cfg``'s job with: the shipped catalog, with the machines the cache in
    ``cfg.storage`` priced within ``pricing.max_age`` at those prices. When nothing cached is fresh and
    ``pricing.refresh`` (default; ``refresh`` overrides it; ``$ORCH_PRICES_OFFLINE=1`` forbids it), the prices are
    fetched first (``fetcher``: ``price_sources.fetch_prices``) and cached; a failure is a warning.
    Raises ConfigError for a bad ``pricing.max_age``, never for the prices themselves: the plan and the launch go
    on with the shipped catalog."""
    from orchestrator.money.cost import PRICING_FILE_ENV, load_catalog

    now = time.time() if now is None else now
    shipped = load_catalog()
    own = os.environ.get(PRICING_FILE_ENV)
    name = f"catalog {own} (${PRICING_FILE_ENV})" if own else "shipped catalog"
    pricing = getattr(cfg, "pricing", None)
    max_age = _max_age_seconds(pricing)
    allowed = bool(getattr(pricing, "refresh", True)) if refresh is None else refresh
    if os.environ.get(OFFLINE_ENV, "") not in ("", "0"):
        allowed = False
    try:
        if store is None:
            from orchestrator.storage import store_from_config

            store = store_from_config(cfg.storage, retry=False)
        cached = read_cache(store, now=now)
    except Exception as err:  # noqa: BLE001 - a store that cannot be opened: the shipped catalog
        log.warning("prices: storage %s unavailable (%s); using the shipped catalog", cfg.storage.uri, err)
        return shipped, provenance(shipped, [], now, name=name)
    if not fresh(cached, now, max_age) and allowed:
        fetcher = fetcher or partial(fetch_prices, timeout=PLAN_TIMEOUT_SECONDS)  # the plan waits seconds, not minutes
        cached = refresh_cache(store, shipped, cached, fetcher=fetcher, now=now)
    used = fresh(cached, now, max_age)
    return overlay(shipped, used, now), provenance(shipped, used, now, name=name)


def _max_age_seconds(pricing: Any) -> float:
    from orchestrator.core.durations import parse_duration
    from orchestrator.core.errors import ConfigError

    text = getattr(pricing, "max_age", None)
    try:
        return DEFAULT_MAX_AGE_SECONDS if text is None else parse_duration(str(text), key="pricing.max_age")
    except ValueError as err:
        raise ConfigError(str(err)) from None


def refresh_cache(
    store: Any,
    shipped: Mapping[str, Any],
    cached: list[FetchedPrice],
    *,
    fetcher: Optional[Fetcher] = None,
    now: Optional[float] = None,
    **options: Any,
) -> list[FetchedPrice]:
    """Fetch current prices for the shipped catalog's machines and cache them beside the old ones; what was
    cached stays (with a warning) when nothing answers or the store refuses the write."""
    if fetcher is None:
        fetcher = fetch_prices
    try:
        got, notes = fetcher(
            targets(shipped, options.pop("clouds", CLOUDS), options.pop("regions", None)), now=now, **options
        )
    except Exception as err:  # noqa: BLE001 - a fetcher's own bug or an SDK's surprise: prices are advice
        got, notes = [], [f"price fetch failed: {err}"]
    if not got:
        log.warning(
            "prices: no current prices fetched (%s); keeping %s",
            "; ".join(notes) or "nothing to price",
            "the cached ones" if cached else "the shipped catalog",
        )
        return cached
    for note in notes[:3]:  # the plan's output stays readable; `orchestrator prices refresh` prints them all
        log.warning("prices: %s", note)
    if len(notes) > 3:
        log.warning("prices: %d more notes (`orchestrator prices refresh` prints them all)", len(notes) - 3)
    merged = merge(cached, got)
    try:
        write_cache(store, merged)
    except Exception as err:  # noqa: BLE001 - used now, cached next time
        log.warning("prices: could not cache the fetched prices at %s: %s", CACHE_KEY, err)
    return merged
