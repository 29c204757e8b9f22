"""Where a job was handed to its backend: ``<storage.uri>/<run.name>/submission.json``, written at submit.

The engines' own handles are known only to the launcher that submitted the job (``submitted ... job <id>``), so
the launcher stores them here, for ``orchestrator logs`` and ``orchestrator cancel`` (docs/cli.md). Shape::

    {"version": 1, "run_name": str, "backend": "local" | "slurm" | "skypilot" | "kubernetes",
     "job_id": str (Slurm's job id, SkyPilot's job name, Kubernetes' "<namespace>/<name>", the local
                    supervisor's pid),
     "kind": "Job" | "JobSet" (Kubernetes) or null, "host": the launcher's host, "pid": the launcher's pid
     (local: the supervisor itself), "pid_started": that process's start (Linux /proc ticks since boot) or null,
     "submitted_at": float, "log": the engine's log file (Slurm's --output, %j filled) or null,
     "job_log": the worker's own log file (<run.work_dir>/<run.name>/job.log as the launcher resolves it) or null}

Each launch of the job writes it again (the newest submission wins). It is read from storage, so it is decoded
with its checks (``SubmissionRecord.decode``): one that does not decode is a ``CorruptRecord`` naming it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Optional

from orchestrator.records.fields import CorruptRecord, Fields  # noqa: F401 - CorruptRecord: the readers'
from orchestrator.records.ledger_record import MAX_PID

SUBMISSION_FILENAME = "submission.json"
VERSION = 1
BACKENDS = ("local", "slurm", "skypilot", "kubernetes")
KINDS = ("Job", "JobSet")


def submission_key(run_name: str) -> str:
    return f"{run_name}/{SUBMISSION_FILENAME}"


@dataclass(frozen=True)
class SubmissionRecord:
    run_name: str
    backend: str
    job_id: str
    host: str
    pid: Optional[int]
    submitted_at: Optional[float]
    kind: Optional[str] = None
    pid_started: Optional[int] = None
    log: Optional[str] = None
    job_log: Optional[str] = None

    def encode(self) -> bytes:
        return json.dumps({"version": VERSION, **asdict(self)}, indent=2).encode()

    @classmethod
    def decode(cls, doc: Any, where: str) -> "SubmissionRecord":
        """``doc`` (the parsed submission.json) into types. Raises CorruptRecord naming ``where`` and the field."""
        f = Fields(doc, where)
        if f.whole("version", default=VERSION) != VERSION:
            raise f.fail("version", f"is not {VERSION}")
        return cls(
            run_name=f.text("run_name"),
            backend=f.choice("backend", BACKENDS),
            job_id=f.text("job_id"),
            host=f.text("host", "-"),
            pid=f.whole("pid", low=1, high=MAX_PID, default=None),
            submitted_at=f.time("submitted_at"),
            kind=f.choice("kind", KINDS, None),
            pid_started=f.whole("pid_started", high=2**62, default=None),
            log=f.text("log", None),
            job_log=f.text("job_log", None),
        )


def read_submission(store: Any, run_name: str) -> Optional[SubmissionRecord]:
    """The job's submission record; None when it has none. Raises CorruptRecord (bytes that do not decode)."""
    key = submission_key(run_name)
    try:
        raw = store.get_bytes(key)
    except FileNotFoundError:
        return None
    where = store.get_uri(key)
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptRecord(where, f"it is not JSON ({err})") from None
    return SubmissionRecord.decode(doc, where)


def write_submission(store: Any, record: SubmissionRecord) -> None:
    store.put_bytes(submission_key(record.run_name), record.encode())
