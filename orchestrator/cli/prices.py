"""``orchestrator prices refresh [--storage-uri URI] [--clouds aws,azure,gcp] [--region R] [--json]``: current spot
and on-demand prices per zone of the shipped catalog's machines, cached at ``<storage.uri>/_prices/catalog.json``
for the plan, the launch and the meter (``orchestrator.money.prices``; docs/pricing.md).

Exit 0 when some prices were fetched and cached; 1 when none could be (the notes say why; the cache is kept);
2 on a bad argument or a store that cannot be opened.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from typing import Optional

from orchestrator.config.schema import StorageConfig
from orchestrator.core.console import FAILED, Parser, fail
from orchestrator.core.errors import UserError
from orchestrator.money import prices as price_cache


def _clouds(text: str) -> list[str]:
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in price_cache.CLOUDS]
    if unknown or not names:
        raise ValueError(f"--clouds {text!r}: name some of {', '.join(price_cache.CLOUDS)}, comma-separated")
    return names


def _table(prices: list[price_cache.FetchedPrice]) -> str:
    lines = [f"  {'gpu':<11}{'cloud':<7}{'capacity':<11}{'machine':<26}{'zone':<16}{'$/machine-h':>12}{'$/GPU-h':>10}"]
    for p in sorted(prices, key=lambda p: (p.gpu_type, p.cloud, p.capacity, p.zone or "")):
        lines.append(
            f"  {p.gpu_type:<11}{p.cloud:<7}{p.capacity:<11}{p.machine:<26}{p.zone or p.region:<16}"
            f"{p.usd_per_hour:>12.4f}{p.usd_per_gpu_hour:>10.4f}"
        )
    return "\n".join(lines)


def refresh_main(args) -> int:
    from orchestrator.money.cost import load_catalog
    from orchestrator.money.price_sources import fetch_prices
    from orchestrator.storage import open_store

    try:
        clouds = _clouds(args.clouds)
        store = open_store(args.storage_uri, endpoint_url=args.endpoint_url or None)
        shipped = load_catalog()
    except (ValueError, FileNotFoundError, UserError) as err:
        return fail(err)
    now = time.time()
    regions = [r.strip() for r in args.region.split(",") if r.strip()] if args.region else None
    machines = price_cache.targets(shipped, clouds, regions)
    got, notes = fetch_prices(machines, now=now)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not got:
        return fail("no current prices fetched (see the notes above); the cached and shipped prices are kept", FAILED)
    cached = price_cache.read_cache(store, now=now)
    try:
        where = price_cache.write_cache(store, price_cache.merge(cached, got))
    except Exception as err:  # noqa: BLE001 - a store that refuses the write: say which, exit 2
        return fail(f"could not write the price cache under {args.storage_uri}: {err}")
    if args.json:
        print(
            json.dumps(
                {
                    "cache": where,
                    "fetched_at": price_cache.iso(now),
                    "notes": notes,
                    "prices": [{**asdict(p), "fetched_at": price_cache.iso(p.fetched_at)} for p in got],
                }
            )
        )
    else:
        print(
            f"fetched {len(got)} prices from {', '.join(sorted({p.cloud for p in got}))} at "
            f"{price_cache.iso(now)}; cached at {where}\n{_table(got)}"
        )
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = Parser(
        prog="orchestrator prices",
        description="Current cloud prices for the plan, the launch and the "
        "meter (whole-machine prices per zone, cached in storage).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    refresh = sub.add_parser(
        "refresh",
        help="fetch current spot and on-demand prices and cache them in storage",
        description="Fetch the current spot (per zone) and on-demand prices of the machines "
        "conf/pricing.yaml names, from AWS (boto3's credentials), Azure (public) and GCP (with "
        "credentials), and cache them at <storage-uri>/_prices/catalog.json.",
    )
    refresh.add_argument(
        "--storage-uri",
        default=StorageConfig.uri,
        help=f"the jobs' storage.uri (a folder or s3://bucket/prefix; default {StorageConfig.uri})",
    )
    refresh.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint of the store")
    refresh.add_argument("--clouds", default=",".join(price_cache.CLOUDS), help="comma-separated (default: all)")
    refresh.add_argument(
        "--region",
        default=None,
        help="comma-separated regions to price in, as the clouds spell them (default: each machine's catalog region)",
    )
    refresh.add_argument("--json", action="store_true", help="print the fetched prices as JSON")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return refresh_main(args)


if __name__ == "__main__":
    sys.exit(main())
