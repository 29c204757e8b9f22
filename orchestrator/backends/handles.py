"""A submitted job's handle, and the engines' commands that read its log and cancel it.

``run_backend`` stores a ``SubmissionRecord`` (``orchestrator.records.submission``) under the run's folder when it
hands a job over: the backend, the engine's job id, and where the logs are. ``orchestrator logs`` and
``orchestrator cancel`` read it back and build the engine's own command here:

============  ==========================================  ===============================================
backend       log                                         cancel
============  ==========================================  ===============================================
local         ``<run.work_dir>/<run.name>/job.log``       SIGTERM to the supervisor (same host only)
slurm         ``--output`` (``%j`` filled), ``job.log``   ``scancel <job id>``
skypilot      ``sky jobs logs [--no-follow] <name>``      ``sky jobs cancel -y <name>``
kubernetes    ``kubectl logs [-f] -n NS job/<name>``      ``kubectl delete job|jobset -n NS <name>``
============  ==========================================  ===============================================
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Optional

from orchestrator.records.submission import SubmissionRecord

JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"  # the JobSet controller labels every pod of a JobSet with it


def process_started(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22); None where there is no
    /proc or no such process. With the pid it tells one process from a later one given the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def _slurm_output(cfg: Any, job_id: str) -> str:
    from orchestrator.backends.slurm import _output_path

    text = _output_path(cfg)
    for pattern, value in (
        ("%%", "\0"),
        ("%j", job_id),
        ("%x", str(cfg.run.name)),
        ("%u", os.environ.get("USER", "%u")),
    ):
        text = text.replace(pattern, value)
    return text.replace("\0", "%")


def submission_record(cfg: Any, backend: str, job_id: Optional[str]) -> SubmissionRecord:
    """What ``run_backend`` stores for ``cfg``'s job handed to ``backend`` (``job_id``: the engine's; None for local,
    whose supervisor is this process)."""
    pid = os.getpid()
    job_log: Optional[str] = str(Path(cfg.run.work_dir).expanduser().resolve() / str(cfg.run.name) / "job.log")
    kind: Optional[str] = None
    log: Optional[str] = None
    if backend == "kubernetes":
        from orchestrator.process.multinode.checks import node_count

        kind = "JobSet" if node_count(cfg) > 1 else "Job"
        job_log = None  # in the pod: kubectl logs
    elif backend == "skypilot":
        job_log = None  # on the VM: sky jobs logs
    elif backend == "slurm":
        log = _slurm_output(cfg, str(job_id))
    return SubmissionRecord(
        run_name=str(cfg.run.name),
        backend=backend,
        job_id=str(job_id or pid),
        host=socket.gethostname(),
        pid=pid,
        submitted_at=time.time(),
        kind=kind,
        pid_started=process_started(pid),
        log=log,
        job_log=job_log,
    )


def _k8s(record: SubmissionRecord) -> tuple[str, str]:
    namespace, _, name = record.job_id.rpartition("/")
    return namespace or "default", name


def cancel_argv(record: SubmissionRecord) -> list[str]:
    """The engine's command that cancels the job (a remote backend's; the local one is a signal)."""
    if record.backend == "slurm":
        return ["scancel", record.job_id]
    if record.backend == "skypilot":
        return ["sky", "jobs", "cancel", "-y", record.job_id]
    if record.backend == "kubernetes":
        namespace, name = _k8s(record)
        return ["kubectl", "delete", (record.kind or "Job").lower(), name, "-n", namespace, "--wait=false"]
    raise ValueError(f"backend {record.backend!r} is cancelled with a signal, not a command")


def logs_argv(record: SubmissionRecord, *, follow: bool, lines: int) -> Optional[list[str]]:
    """The engine's command that prints the job's log (SkyPilot, Kubernetes); None where the log is a file."""
    if record.backend == "skypilot":
        return ["sky", "jobs", "logs", *([] if follow else ["--no-follow"]), record.job_id]
    if record.backend == "kubernetes":
        namespace, name = _k8s(record)
        follow_flag = ["-f"] if follow else []
        if record.kind == "JobSet":
            return [
                "kubectl",
                "logs",
                "-n",
                namespace,
                "-l",
                f"{JOBSET_LABEL}={name}",
                "--prefix",
                f"--tail={lines}",
                *follow_flag,
            ]
        return ["kubectl", "logs", "-n", namespace, f"job/{name}", f"--tail={lines}", *follow_flag]
    return None
