"""``orchestrator logs <storage.uri>/<run.name> [-f] [-n LINES]``: where a job's log is, and the log itself.

Where the log is comes from the job's submission record (``<run.name>/submission.json``, written by the launcher:
``orchestrator.records.submission``):

- local: the worker's log file, ``<run.work_dir>/<run.name>/job.log`` (every record; the supervisor's own lines go
  to the terminal that launched it). Printed (its last LINES lines) when the file is on this machine.
- slurm: the batch output, sbatch's ``--output`` with ``%j`` filled (``backend.extra.output``; default
  ``<run.work_dir>/slurm/<run.name>-<job id>.out``), then the worker's ``job.log``: printed when on this machine
  (a login node on the cluster's shared filesystem), else the path is named.
- skypilot: ``sky jobs logs [--no-follow] <name>``; kubernetes: ``kubectl logs -n <namespace> job/<name>`` (a
  JobSet: its pods by label, each line prefixed). Run when the tool is on PATH here, else printed.

``-f`` follows a file until the job ends (its ledger's status is final, or the local supervisor is gone), or
Ctrl-C. Exit 0: the log was printed; 1: it is not on this machine and its command is printed instead; 2: no such
job, an unreadable record or store; else the engine tool's own exit code. A log file not there yet (its folder here,
or a local job of this host) is said so, exit 1.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from orchestrator.cli.cancel import Job, alive
from orchestrator.core.console import Parser, fail
from orchestrator.core.errors import UserError
from orchestrator.records.submission import SubmissionRecord
from orchestrator.storage import TransientStorageError

TAIL_WINDOW_BYTES = 4 * 1024 * 1024  # the tail is read from the last 4 MB
POLL_SECONDS = 0.5
LEDGER_EVERY_SECONDS = 2.0


def tail(path: Path, lines: int) -> int:
    """Write the last ``lines`` lines of ``path`` to stdout; returns the offset it read to."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - TAIL_WINDOW_BYTES))
        last = deque(f.read(size - f.tell()).splitlines(keepends=True), maxlen=max(lines, 0) or None)
    if lines > 0:
        sys.stdout.buffer.write(b"".join(last))
        sys.stdout.flush()
    return size


def _running(job: Job) -> bool:
    """Whether the job may still write to its log: its ledger not final, and (local) its supervisor alive."""
    record = job.submission
    if record is not None and record.backend == "local" and record.pid:
        import socket

        if record.host == socket.gethostname() and not alive(record.pid, record.pid_started):
            return False
    try:
        job.ledger = job.read_ledger()
    except (UserError, TransientStorageError):
        return True  # unreadable for now: keep following
    return not job.ended


def follow(job: Job, path: Path, offset: int) -> int:
    checked = time.monotonic()
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            while True:
                chunk = f.read()
                if chunk:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
                    continue
                if time.monotonic() - checked >= LEDGER_EVERY_SECONDS:
                    checked = time.monotonic()
                    if not _running(job):
                        sys.stdout.buffer.write(f.read())
                        sys.stdout.flush()
                        return 0
                time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        return 0


def logs_file(job: Job, record: SubmissionRecord, *, lines: int, follow_it: bool) -> int:
    where = {"slurm": "Slurm's batch output", "local": "the worker's log"}
    files = [
        (p, where.get(record.backend, "the log") if p == record.log else "the worker's log")
        for p in (record.log, record.job_log)
        if p
    ]
    for path, which in files:
        if Path(path).is_file():
            others = [p for p, _ in files if p != path]
            also = f"; also {others[0]}" if others and Path(others[0]).is_file() else ""
            print(f"==> {path} ({which}, {record.backend} job {record.job_id}{also}) <==", file=sys.stderr)
            offset = tail(Path(path), lines)
            return follow(job, Path(path), offset) if follow_it else 0
    named = " or ".join(p for p, _ in files) or "-"
    command = shlex.join(["tail", "-n", str(lines), *(["-f"] if follow_it else []), files[0][0]]) if files else ""
    status = job.ledger.status if job.ledger else "no attempt yet"
    if any(Path(p).parent.is_dir() for p, _ in files) or (record.backend == "local" and record.host == _host()):
        print(
            f"{record.backend} job {record.job_id} of {job.run_name!r}: no log at {named} yet (status: {status}); "
            "the worker writes it once it starts (a local supervisor's own lines go to the terminal that "
            "launched it)"
        )
        return 1
    host = record.host if record.backend == "local" else "the Slurm cluster (a login node)"
    print(
        f"{record.backend} job {record.job_id} of {job.run_name!r}: its log is {named} on {host}, not on this "
        f"machine (status: {status}; there: {command})"
    )
    return 1


def _host() -> str:
    import socket

    return socket.gethostname()


def logs_tool(job: Job, record: SubmissionRecord, *, lines: int, follow_it: bool) -> int:
    from orchestrator.backends.handles import logs_argv

    argv = logs_argv(record, follow=follow_it, lines=lines) or []
    if not argv:
        return fail(f"{record.backend} job {record.job_id} of {job.run_name!r}: no engine command prints its log")
    command = shlex.join(argv)
    if shutil.which(argv[0]) is None:
        print(
            f"{record.backend} job {record.job_id} of {job.run_name!r}: its log is the engine's; {argv[0]} is not "
            f"on PATH here, run: {command}"
        )
        return 1
    print(f"==> {command} ({record.backend} job {record.job_id}) <==", file=sys.stderr, flush=True)
    try:
        return subprocess.call(argv)
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="orchestrator logs",
        description="Print a job's log (its tail; -f follows it) when it is on "
        "this machine, else run or print the backend's command for it (sky jobs logs, kubectl logs).",
    )
    parser.add_argument("target", metavar="STORAGE_URI/RUN_NAME", help="e.g. s3://bucket/runs/exp1 or .cache/runs/exp1")
    parser.add_argument("-f", "--follow", action="store_true", help="follow the log until the job ends (or Ctrl-C)")
    parser.add_argument("-n", "--lines", type=int, default=40, help="how many of the last lines to print (default 40)")
    parser.add_argument(
        "--endpoint-url",
        default=None,
        help="S3-compatible endpoint (MinIO, R2...); defaults to the AWS_ENDPOINT_URL environment variable",
    )
    args = parser.parse_intermixed_args(argv)
    if args.lines < 0:
        parser.error(f"--lines must be 0 or more, not {args.lines}")
    try:
        job = Job(args.target, args.endpoint_url)
    except (ValueError, UserError, TransientStorageError) as err:  # CorruptRecord is a UserError
        return fail(err)
    if job.submission is None:
        host = next((a.host for a in reversed(job.ledger.attempts)), "-") if job.ledger else "-"
        return fail(
            f"{job.run_name!r} has no submission record ({job.store.get_uri(job.run_name + '/submission.json')}): "
            "it was launched before `orchestrator logs` knew where logs go. Its worker's log is "
            f"<run.work_dir>/{job.run_name}/job.log on the machine that ran it (its newest attempt: {host})"
        )
    if job.submission.backend in ("local", "slurm"):
        return logs_file(job, job.submission, lines=args.lines, follow_it=args.follow)
    return logs_tool(job, job.submission, lines=args.lines, follow_it=args.follow)


if __name__ == "__main__":
    sys.exit(main())
