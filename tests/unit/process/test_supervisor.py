"""The supervisor's reading of the kernel's OOM-kill count, and how it classes a killed child."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.exitcodes import ExitClass
from orchestrator.process.supervisor import oom_kill_count, refine_exit_class


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp_path: Path, text: str) -> Path:
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(text)
    return proc


def test_cgroup_v2_reads_memory_events_of_the_process_cgroup(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "system.slice/job.service/memory.events",
           "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")
    _write(root / "memory.events", "oom_kill 99\n")  # another cgroup's count must not be read
    assert oom_kill_count(root, _proc(tmp_path, "0::/system.slice/job.service\n")) == 2


def test_cgroup_v2_in_a_namespace_reads_the_mount_root(tmp_path):
    # inside a container with its own cgroup namespace the path is "/" and the mount is the container's cgroup
    root = tmp_path / "cgroup"
    _write(root / "memory.events", "oom 1\noom_kill 1\n")
    assert oom_kill_count(root, _proc(tmp_path, "0::/\n")) == 1


def test_hybrid_mount_reads_the_unified_tree(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "unified/user.slice/memory.events", "oom_kill 4\n")
    assert oom_kill_count(root, _proc(tmp_path, "1:name=systemd:/user.slice\n0::/user.slice\n")) == 4


def test_cgroup_v1_sums_oom_control_over_the_subtree(tmp_path):
    # v1 counts each cgroup alone, so a kill in a child cgroup (where a launcher put the worker) must be summed in
    root = tmp_path / "cgroup"
    own = root / "memory/process_api/abc"
    _write(own / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    _write(own / "worker/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    _write(root / "memory/process_api/other/memory.oom_control", "oom_kill 50\n")
    proc = _proc(tmp_path, "9:name=systemd:/\n4:memory:/process_api/abc\n2:cpuacct:/\n0::/\n")
    assert oom_kill_count(root, proc) == 3


def test_an_unreadable_counter_is_none(tmp_path):
    root = tmp_path / "cgroup"
    root.mkdir()
    assert oom_kill_count(root, _proc(tmp_path, "0::/x\n")) is None
    assert oom_kill_count(root, tmp_path / "missing") is None
    _write(root / "memory.events", "oom_kill many\n")
    assert oom_kill_count(root, _proc(tmp_path, "0::/\n")) is None


def _kernel_exposes_an_oom_counter() -> bool:
    """Whether this process's memory cgroup has the kernel's counter file (v2 memory.events, v1 memory.oom_control),
    looked up by its own paths in /proc/self/cgroup, apart from the supervisor's reading of it."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return False
    root = Path("/sys/fs/cgroup")
    candidates = [root / "memory.events", root / "unified" / "memory.events"]  # a namespace's own root
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidates += [root / path.lstrip("/") / "memory.events",
                           root / "unified" / path.lstrip("/") / "memory.events"]
        elif "memory" in controllers.split(","):
            candidates += [root / "memory" / path.lstrip("/") / "memory.oom_control", root / "memory" / "memory.oom_control"]
    return any(c.is_file() for c in candidates)


def test_on_this_machine_a_killed_child_is_a_lost_machine_and_an_oom_kill_would_be_seen():
    """What the supervisor does around each attempt (``Supervisor.run``): the real counter before, a child SIGKILLed by
    someone other than the OOM killer (a preemption's or a lost machine's kill), the real counter after. It must stay
    VANISHED, requeued as a preemption, not be stopped as an out-of-memory with its fix; and where the kernel keeps
    a counter, it is read as one (None would take every real OOM kill for a lost machine, requeued forever)."""
    import signal
    import subprocess
    import sys

    from orchestrator.core.exitcodes import classify_exit

    before = oom_kill_count()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.send_signal(signal.SIGKILL)
    code = child.wait(30)
    after = oom_kill_count()
    assert refine_exit_class(classify_exit(code), before, after) is ExitClass.VANISHED, (code, before, after)
    if _kernel_exposes_an_oom_counter():
        assert isinstance(before, int) and before >= 0 and after == before, (before, after)
        # a kill by the OOM killer (the count one higher after) is named so, on this machine's own count
        assert refine_exit_class(classify_exit(code), before, before + 1) is ExitClass.OUT_OF_MEMORY
    else:
        assert before is None and after is None, "no counter file, yet a count was read"


@pytest.mark.parametrize("killed,before,after,expected", [
    (ExitClass.VANISHED, 0, 1, ExitClass.OUT_OF_MEMORY),  # SIGKILLed while the OOM count rose: the OOM killer
    (ExitClass.CRASHED, 3, 4, ExitClass.OUT_OF_MEMORY),  # a launcher whose rank the OOM killer took (torchrun exits 1)
    (ExitClass.VANISHED, 1, 1, ExitClass.VANISHED),  # SIGKILL with no OOM kill: a lost machine, a preemption
    (ExitClass.VANISHED, None, None, ExitClass.VANISHED),  # no counter: nothing is guessed
    (ExitClass.VANISHED, None, 1, ExitClass.VANISHED),
    (ExitClass.PREEMPTED, 0, 1, ExitClass.PREEMPTED),  # a clean exit of its own is trusted
    (ExitClass.COMPLETED, 0, 1, ExitClass.COMPLETED),
    (ExitClass.OUT_OF_MEMORY, 0, 0, ExitClass.OUT_OF_MEMORY),
])
def test_refine_exit_class(killed, before, after, expected):
    assert refine_exit_class(killed, before, after) is expected


def test_a_child_killed_after_it_recorded_completion_ends_the_job_completed(tmp_path):
    """A SIGKILL that lands after the worker committed its final weights and closed the ledger (a late
    preemption): the job did complete, so the launcher must exit 0, not 128+9."""
    import sys

    from orchestrator.app.compose import compose_config
    from orchestrator.records.ledger import Ledger
    from orchestrator.storage import LocalStore
    from orchestrator.process.supervisor import Supervisor

    runs = tmp_path / "runs"
    cfg = compose_config([f"storage.uri={runs}", "run.name=late", "requeue.backoff_base_seconds=0"])
    child = (
        "import os, signal\n"
        "from orchestrator.core.exitcodes import ExitClass\n"
        "from orchestrator.records.ledger import Ledger\n"
        "from orchestrator.storage import LocalStore\n"
        f"ledger = Ledger(LocalStore({str(runs)!r}), 'late')\n"
        "ledger.begin_attempt(host='h', pid=os.getpid(), instance_type='cpu', gpu_type='none', gpus=0, spot=False,"
        " checkpoint_step=0)\n"
        "ledger.end_attempt(ExitClass.COMPLETED, 10, 0.01)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    supervisor = Supervisor(cfg, [])
    supervisor.command = [sys.executable, "-c", child]
    assert supervisor.run() == 0
    ledger = Ledger(LocalStore(runs), "late").load()
    assert [a["exit_class"] for a in ledger["attempts"]] == ["completed"] and ledger["status"] == "completed"


CAPPED = ["compute.price_per_hour=360", "budget.monthly_max_usd=1", "compute.restart_seconds=15",
          "requeue.backoff_base_seconds=0"]  # $0.10/s: a 15 s start-up holds $1.50, more than the $1 cap


def test_a_start_up_hold_the_caps_refuse_exits_3_before_any_worker_starts(tmp_path):
    """The supervisor holds the start-up in the spend index before it starts the worker: a cap that leaves less
    than that start-up refuses the attempt with the cap's message and exit 3, and no worker process ever runs."""
    from tests.helpers import jobs

    runs = tmp_path / "runs"
    done = jobs.run_job([*CAPPED, f"storage.uri={runs}", "run.name=short", f"run.work_dir={tmp_path / 'work'}"],
                        tmp_path, timeout=300)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert "less than the start-up" in done.stderr and "$1.500000: 15.0 s" in done.stderr, done.stderr[-2000:]
    assert not (runs / "short" / "ledger.json").exists()  # no worker began an attempt
    assert not (tmp_path / "work" / "short").exists()


def test_the_hold_is_handed_to_the_worker_and_released_at_the_childs_cost_when_it_never_reserved(tmp_path):
    import json
    import sys

    from orchestrator.app.compose import compose_config
    from orchestrator.money.spend import INDEX_KEY
    from orchestrator.storage import LocalStore
    from orchestrator.process.supervisor import Supervisor

    runs = tmp_path / "runs"
    cfg = compose_config([*CAPPED[:1], "budget.monthly_max_usd=100", *CAPPED[2:], f"storage.uri={runs}",
                          "run.name=early"])
    seen = tmp_path / "seen.json"
    child = ("import json, os\n"  # a worker that dies during its imports, before it could reserve
             f"from orchestrator.storage import LocalStore\n"
             f"index = json.loads(LocalStore({str(runs)!r}).get_bytes('{INDEX_KEY}'))\n"
             f"open({str(seen)!r}, 'w').write(json.dumps([os.environ['ORCH_START_HOLD'], index]))\n"
             "raise SystemExit(4)\n")
    supervisor = Supervisor(cfg, [])
    supervisor.command = [sys.executable, "-c", child]
    assert supervisor.run() == 4
    key, index = json.loads(seen.read_text())
    assert key.startswith("hold:") and index["jobs"]["early"]["open"][key]["through"] == 1.5  # held before it ran
    job = json.loads(LocalStore(runs).get_bytes(INDEX_KEY))["jobs"]["early"]
    assert job["open"] == {} and 0 < sum(job["months"].values()) < 1.5  # settled at the child's run, not the hold
