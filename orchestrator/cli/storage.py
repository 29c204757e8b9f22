"""``orchestrator storage init <s3-uri>``: bucket lifecycle rules for a job store (``orchestrator.storage.lifecycle``);
``orchestrator storage repair-spend <storage.uri>``: the spend index rebuilt (``orchestrator.money.spend_repair``).
"""

from __future__ import annotations

import sys
import time

from orchestrator.core.console import Parser, fail
from orchestrator.core.errors import UserError
from orchestrator.money.spend_repair import repair_spend_index, summary
from orchestrator.storage import open_store
from orchestrator.storage.base import PreconditionFailed, TransientStorageError
from orchestrator.storage.lifecycle import DEFAULT_ABORT_INCOMPLETE_DAYS, apply_lifecycle


def repair_spend_main(uri: str, *, endpoint_url: str | None) -> int:
    try:
        store = open_store(uri, endpoint_url=endpoint_url or None)
        print(summary(repair_spend_index(store), store, now=time.time()))
    except (ValueError, UserError, TransientStorageError, PreconditionFailed) as err:
        return fail(err)
    return 0


def _subcommand(sub, name: str, help: str, description: str, *, uri: str):
    """A ``storage`` subcommand taking a URI and the S3-compatible endpoint."""
    command = sub.add_parser(name, help=help, description=description)
    command.add_argument("uri", help=uri)
    command.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint; defaults to AWS_ENDPOINT_URL")
    return command


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="orchestrator storage", description="Manage the object store of jobs.")
    sub = parser.add_subparsers(dest="command", required=True)
    init = _subcommand(
        sub,
        "init",
        "apply lifecycle rules to an S3 bucket",
        "Apply lifecycle rules for s3://bucket/prefix: abort multipart uploads left by killed workers, "
        "and optionally expire old objects. Other rules on the bucket are kept.",
        uri="s3://bucket/prefix (the jobs' storage.uri)",
    )
    init.add_argument(
        "--abort-incomplete-days",
        type=int,
        default=DEFAULT_ABORT_INCOMPLETE_DAYS,
        help=f"abort unfinished multipart uploads this many days after they began (default {DEFAULT_ABORT_INCOMPLETE_DAYS})",
    )
    init.add_argument(
        "--expire-days",
        type=int,
        default=None,
        help="delete EVERY object under the prefix this many days after it was written, "
        "including finished jobs' final weights (default: never)",
    )
    init.add_argument("--region", default=None)
    init.add_argument("--profile", default=None, help="AWS profile (credentials come from the AWS chain)")
    _subcommand(
        sub,
        "repair-spend",
        "rebuild the spend index (<uri>/_spend/index.json) from the jobs' ledgers",
        "Rebuild the spend index of the jobs under a storage.uri from their ledgers (each attempt's cost): "
        "the fix for an index a capped job refuses as unreadable.",
        uri="the jobs' storage.uri (s3://bucket/prefix or a folder)",
    )
    args = parser.parse_args(argv)
    if args.command == "repair-spend":
        return repair_spend_main(args.uri, endpoint_url=args.endpoint_url)
    try:
        result = apply_lifecycle(
            args.uri,
            abort_incomplete_days=args.abort_incomplete_days,
            expire_days=args.expire_days,
            endpoint_url=args.endpoint_url,
            region=args.region,
            profile=args.profile,
        )
    except (ValueError, UserError, TransientStorageError) as err:
        return fail(err)
    print(f"lifecycle rules applied to {args.uri}:")
    for rule in result["applied"]:
        prefix = rule["Filter"]["Prefix"] or "(whole bucket)"
        if "AbortIncompleteMultipartUpload" in rule:
            days = rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"]
            print(f"  {rule['ID']}: abort incomplete multipart uploads under {prefix} after {days} days")
        else:
            print(f"  {rule['ID']}: expire objects under {prefix} after {rule['Expiration']['Days']} days")
    for rule_id in result["removed"]:
        print(f"  removed {rule_id} (no --expire-days given)")
    if result["kept"]:
        print(f"  kept other rules: {', '.join(result['kept'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
