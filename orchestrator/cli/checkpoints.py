"""``orchestrator checkpoints <storage-uri>/<run-name> [--verify] [--endpoint-url URL] [--json]``.

Lists a job's committed checkpoints (those with a manifest): step, when it was
written, its size and the attempt's fence that wrote it. ``--verify`` downloads
each into a clean temporary folder, checks every file's size and SHA-256
against the manifest, and only then deserialises the weights and training
state (safetensors files with ``safetensors.torch.load_file``; ``.pt``,
``.pth`` and ``.bin`` files with ``torch.load(weights_only=True)`` and the
restore's allow-list) to prove the checkpoint restores. A manifest listing an
unsafe path (absolute, ``..``, empty parts) fails before anything is downloaded. Exit code 1 when any checkpoint fails, 2 for a bad argument.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
import tempfile
from argparse import Namespace
from pathlib import Path
from typing import cast

from orchestrator.checkpoint import manifest as mf
from orchestrator.checkpoint.inspect import describe, verify_one
from orchestrator.checkpoint.store import CheckpointStore
from orchestrator.core.console import FAILED, Parser, fail, format_bytes


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def parse_args(argv: list[str]) -> Namespace:
    parser = Parser(prog="orchestrator checkpoints", description=__doc__.split("\n\n")[1])
    parser.add_argument("run_uri", help="<storage-uri>/<run-name>, e.g. s3://bucket/runs/exp1 or .cache/runs/exp1")
    parser.add_argument("--verify", action="store_true", help="download, hash-check and load each checkpoint")
    parser.add_argument("--endpoint-url", default=None, help="an S3-compatible endpoint (MinIO, R2, moto)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from orchestrator.core.errors import UserError
    from orchestrator.storage import open_store, split_run_uri

    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        storage_uri, run_name = split_run_uri(args.run_uri)
        store = open_store(storage_uri, endpoint_url=args.endpoint_url)
        with tempfile.TemporaryDirectory(prefix="orch-inspect-") as staging:
            checkpoints = CheckpointStore(store, run_name, staging_dir=Path(staging))
            committed = checkpoints.committed()
            rows = []
            for ckpt in committed:
                manifest, error = None, None
                try:
                    manifest = mf.loads(store.get_bytes(ckpt.manifest_key))
                except (mf.CorruptCheckpoint, ValueError, FileNotFoundError) as err:
                    error = f"unreadable manifest: {err}"
                row = describe(ckpt, manifest, error)
                if args.verify:
                    if not args.json:
                        print(f"verifying {ckpt.name} ...", flush=True)
                    reason = error or verify_one(checkpoints, ckpt, cast(dict, manifest))  # no error: read
                    row.update(ok=reason is None, reason=reason)
                rows.append(row)
    except (ValueError, UserError) as err:
        return fail(err)
    failed = [r for r in rows if args.verify and not r["ok"]]
    if args.json:
        print(
            json.dumps(
                {
                    "run": run_name,
                    "storage": storage_uri,
                    "checkpoints": rows,
                    "verified": args.verify,
                    "failed": len(failed),
                },
                indent=1,
            )
        )
    else:
        print_table(run_name, storage_uri, rows, verify=args.verify)
    return FAILED if failed else 0


def print_table(run_name: str, storage_uri: str, rows: list[dict], *, verify: bool) -> None:
    if not rows:
        print(f"no committed checkpoints for run {run_name!r} in {storage_uri}")
        return
    print(f"committed checkpoints of run {run_name!r} in {storage_uri}:")
    print(
        f"  {'name':<16}{'step':>10}{'fence':>7}  {'written':<24}{'size':>11}{'files':>7}"
        + ("  verify" if verify else "")
    )
    for r in rows:
        line = (
            f"  {r['name']:<16}{r['step']:>10}{r['fence']:>7}  {_when(r['created_at']):<24}"
            f"{format_bytes(r['bytes']):>11}{r['files'] if r['files'] is not None else '-':>7}"
        )
        if verify:
            line += "  OK" if r["ok"] else f"  FAILED: {r['reason']}"
        print(line)
    if verify:
        bad = sum(not r["ok"] for r in rows)
        print(f"{len(rows) - bad} of {len(rows)} checkpoints verified OK" + (f"; {bad} FAILED" if bad else ""))


if __name__ == "__main__":
    sys.exit(main())
