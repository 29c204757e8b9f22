"""``orchestrator cancel <storage.uri>/<run.name>``: stop a job through its backend, so that it is not requeued.

The backend and the engine's handle come from the job's submission record (``<run.name>/submission.json``, written
by the launcher at submit: ``orchestrator.records.submission``):

- slurm: ``scancel <job id>``; skypilot: ``sky jobs cancel -y <name>``; kubernetes: ``kubectl delete job|jobset -n
  <namespace> <name>``: the tool must be on PATH here (else the command is printed, exit 2).
- local: SIGTERM to the supervisor (the launcher process), on the host it runs on only: it forwards the signal to
  the worker, which commits a checkpoint and exits as preempted, and starts no further attempt. The supervisor is
  the one the record names (its pid, checked against the process's start time so a reused pid is never signalled),
  or, for a job launched before the record existed, the one the ledger's running attempt names (``launched_by``).

Exit 0: cancelled, or nothing left to cancel; 1: the engine refused, or the supervisor runs on another host; 2: no
such job, an unreadable record or store, the engine's tool missing.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional

from orchestrator.core.console import Parser, fail
from orchestrator.core.errors import UserError
from orchestrator.core.exitcodes import FINAL_RUN_STATUSES
from orchestrator.records.fields import CorruptRecord
from orchestrator.records.ledger import Ledger
from orchestrator.records.ledger_record import LedgerRecord
from orchestrator.records.submission import SubmissionRecord, read_submission
from orchestrator.storage import TransientStorageError, open_store, split_run_uri

TOOL_TIMEOUT_SECONDS = 120


class Job:
    """A job as ``logs`` and ``cancel`` find it: its store, name, submission record and ledger (either may be None)."""

    def __init__(self, target: str, endpoint_url: Optional[str]):
        store_uri, self.run_name = split_run_uri(target)
        self.target = target
        self.store = open_store(store_uri, endpoint_url=endpoint_url or None)
        self.submission = read_submission(self.store, self.run_name)  # CorruptRecord: a UserError
        self.ledger_uri = Ledger(self.store, self.run_name).uri
        self.ledger_problem: Optional[str] = None  # a ledger that does not decode: said, and the job still found
        try:
            self.ledger = self.read_ledger()
        except CorruptRecord as err:
            self.ledger, self.ledger_problem = None, str(err)
            print(f"warning: {err}", file=sys.stderr)
        if self.submission is None and self.ledger is None and self.ledger_problem is None:
            raise UserError(
                f"no job named {self.run_name!r} under {self.store.uri}: no submission record and no "
                "ledger. Check the run name (run.name) and the storage URI (storage.uri), and "
                "--endpoint-url for S3-compatible stores."
            )

    def read_ledger(self) -> Optional[LedgerRecord]:
        """The ledger, decoded; None when there is none yet (a job still queued). Raises CorruptRecord."""
        raw = Ledger(self.store, self.run_name).load()
        return LedgerRecord.decode(raw, self.ledger_uri) if raw else None

    @property
    def ended(self) -> bool:
        return self.ledger is not None and self.ledger.status in FINAL_RUN_STATUSES


def supervisor_of(job: Job) -> Optional[tuple[str, int, Optional[int]]]:
    """(host, pid, start time or None) of the job's local supervisor, from its record or its ledger's running attempt."""
    record = job.submission
    if record is not None and record.backend == "local" and record.pid:
        return record.host, record.pid, record.pid_started
    running = [a for a in (job.ledger.with_lost_attempts().attempts if job.ledger else ()) if a.running]
    parts = (running[-1].launched_by or "").split(":") if running else []
    if len(parts) >= 3 and parts[-2].isdigit():  # "host:pid:attempt" (orchestrator.process.supervisor)
        return ":".join(parts[:-2]), int(parts[-2]), None
    return None


def alive(pid: int, started: Optional[int]) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``started`` (when known)."""
    from orchestrator.backends.handles import process_started

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it runs, as another user: its start time still tells whether it is the one recorded
    if started is not None:
        return process_started(pid) in (None, started)
    try:  # known by its pid alone (a ledger's launched_by): it must at least be an orchestrator process
        return b"orchestrator" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return not Path("/proc/self").exists()  # no /proc (macOS): the pid is all there is to go by


def cancel_local(job: Job) -> int:
    found = supervisor_of(job)
    if found is None:
        status = job.ledger.status if job.ledger else "no attempt yet"
        print(f"nothing to cancel: no local supervisor is recorded as running {job.run_name!r} (status: {status})")
        return 0
    host, pid, started = found
    if host != socket.gethostname():
        return fail(
            f"{job.run_name!r} runs under a local supervisor on {host} (pid {pid}), not on this host "
            f"({socket.gethostname()}): run `orchestrator cancel {job.target}` there, or `kill -TERM {pid}` "
            f"on {host}",
            1,
        )
    if not alive(pid, started):
        status = job.ledger.status if job.ledger else "no attempt yet"
        print(f"nothing to cancel: the local supervisor of {job.run_name!r} (pid {pid}) has ended (status: {status})")
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"nothing to cancel: the local supervisor of {job.run_name!r} (pid {pid}) has just ended")
        return 0
    except PermissionError:
        return fail(
            f"not permitted to signal the supervisor of {job.run_name!r} (pid {pid} on {host}): it runs as "
            f"another user; run `kill -TERM {pid}` as that user",
            1,
        )
    print(
        f"cancelled {job.run_name!r} (local): sent SIGTERM to its supervisor, pid {pid} on {host}. The worker "
        "commits a checkpoint and stops, and no further attempt starts; `orchestrator status` shows the attempt "
        "as preempted."
    )
    return 0


def cancel_remote(job: Job, record: SubmissionRecord) -> int:
    from orchestrator.backends.handles import cancel_argv

    argv = cancel_argv(record)
    command = shlex.join(argv)
    if shutil.which(argv[0]) is None:
        return fail(
            f"{argv[0]} is not on PATH here: to cancel {job.run_name!r} ({record.backend} job "
            f"{record.job_id}) run `{command}` where {argv[0]} reaches the cluster"
        )
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return fail(f"`{command}` did not answer within {TOOL_TIMEOUT_SECONDS} s", 1)
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        return fail(f"`{command}` failed (exit {done.returncode}): {output[-1000:] or 'no output'}", 1)
    if output:
        print(output)
    print(f"cancelled {job.run_name!r} ({record.backend} job {record.job_id}): {command}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="orchestrator cancel",
        description="Cancel a job through its backend (scancel, sky jobs "
        "cancel, kubectl delete; the local supervisor: SIGTERM), so that it is not requeued.",
    )
    parser.add_argument("target", metavar="STORAGE_URI/RUN_NAME", help="e.g. s3://bucket/runs/exp1 or .cache/runs/exp1")
    parser.add_argument(
        "--endpoint-url",
        default=None,
        help="S3-compatible endpoint (MinIO, R2...); defaults to the AWS_ENDPOINT_URL environment variable",
    )
    args = parser.parse_intermixed_args(argv)
    try:
        job = Job(args.target, args.endpoint_url)
    except (ValueError, UserError, TransientStorageError) as err:  # CorruptRecord is a UserError
        return fail(err)
    record = job.submission
    if record is None or record.backend == "local":
        return cancel_local(job)
    return cancel_remote(job, record)


if __name__ == "__main__":
    sys.exit(main())
