"""The local backend's supervisor: one child process per attempt, and the requeue policy.

The supervisor runs ``python -m orchestrator.worker <overrides>`` as a child (forked from
itself once it has imported the training stack, where that is safe: ``orchestrator.process.warm_start``),
forwards SIGTERM, SIGINT and SIGUSR1 to it, classifies each exit, and asks the
requeue policy whether to start another attempt. Before each child it holds the start-up
to come in the spend index (``orchestrator.money.spend_holds``) for a job under a monthly or
experiment cap, and ends the job with exit 3, no child started, when the caps refuse it. Caps live in the ledger, so
they hold whoever restarts the job: this supervisor, an external engine, or a
person re-running the launch command after the machine vanished.

A child killed by a signal cannot record its own end; the supervisor records
it in the ledger (vanished, or out of memory) so ``orchestrator status`` never
shows a dead attempt as running. A SIGKILL is told apart from a vanished
machine by the kernel's own count of OOM kills in this process's memory cgroup
(cgroup v2 ``memory.events`` ``oom_kill``, which counts the subtree; cgroup v1
``memory.oom_control`` ``oom_kill``, summed over the subtree because v1 counts
each cgroup alone), read before and after the attempt: a child that died by
SIGKILL (or, for a multi-process launcher, exited non-zero) while the counter
went up was killed for memory. Nothing else is trusted: not the return code
alone (137 is any SIGKILL), not the kernel log (needs privileges, and names
pids that may be reused).
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

from orchestrator.core import exitcodes
from orchestrator.core.env import ZONE_ENV
from orchestrator.core.errors import out_of_memory_fix
from orchestrator.core.exitcodes import ExitClass, classify_exit
from orchestrator.money.cost import bigger_gpus
from orchestrator.money.spend_holds import HOLD_ENV
from orchestrator.policy.requeue import attempt_class
from orchestrator.process.distributed import worker_argv
from orchestrator.records.ledger import LAUNCHED_BY_ENV
from orchestrator.records.ledger_record import AttemptEntry, LedgerRecord

log = logging.getLogger(__name__)

FORWARDED_SIGNALS = exitcodes.PREEMPTION_SIGNALS
CGROUP_ROOT = "/sys/fs/cgroup"


def _counter(path: Path, name: str) -> Optional[int]:
    """The value of ``name`` in a flat-keyed cgroup file ("key value" lines), or None."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def oom_kill_count(
    cgroup_root: str | Path = CGROUP_ROOT, proc_cgroup: str | Path = "/proc/self/cgroup"
) -> Optional[int]:
    """The kernel's count of OOM kills in this process's memory cgroup and its descendants; None if unreadable.

    Reads ``proc_cgroup`` for the process's cgroup paths, then cgroup v2's
    ``<root>/<path>/memory.events`` (or ``<root>/unified/<path>/...`` on a
    hybrid mount; ``oom_kill`` there already counts the subtree), else cgroup
    v1's ``<root>/memory/<path>/memory.oom_control`` summed over the subtree.
    Inside a container whose cgroup namespace hides the path, the mount's own
    root folder is the process's cgroup; that is tried when the path is absent.
    """
    root = Path(cgroup_root)
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    v2_path, v1_path = None, None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    if v2_path is not None:
        for base in (root, root / "unified"):
            for folder in (base / v2_path.lstrip("/"), base):
                count = _counter(folder / "memory.events", "oom_kill")
                if count is not None:
                    return count
    if v1_path is not None:
        base = root / "memory"
        for folder in (base / v1_path.lstrip("/"), base):
            if (folder / "memory.oom_control").is_file():
                return _subtree_sum(folder)
    return None


def _subtree_sum(folder: Path) -> Optional[int]:
    total, found = 0, False
    for dirpath, _dirs, files in os.walk(folder):
        if "memory.oom_control" in files:
            count = _counter(Path(dirpath) / "memory.oom_control", "oom_kill")
            if count is not None:
                total, found = total + count, True
    return total if found else None


def refine_exit_class(exit_class: ExitClass, oom_before: Optional[int], oom_after: Optional[int]) -> ExitClass:
    """OUT_OF_MEMORY when the kernel's OOM killer ended the child, else ``exit_class``.

    Only for a child that died without a clean exit of its own (VANISHED:
    killed by a signal; CRASHED: e.g. torchrun exiting 1 after a rank was
    killed), and only when the cgroup's OOM-kill count rose during the
    attempt. The caller trusts an end the worker recorded itself over this.
    """
    rose = oom_before is not None and oom_after is not None and oom_after > oom_before
    if rose and exit_class in (ExitClass.VANISHED, ExitClass.CRASHED):
        return ExitClass.OUT_OF_MEMORY
    return exit_class


class Supervisor:
    def __init__(self, cfg, overrides: Sequence[str], *, python: str = sys.executable):
        from orchestrator.policy.requeue import RequeuePolicy
        from orchestrator.records.ledger import Ledger
        from orchestrator.storage import store_from_config

        self.cfg = cfg
        self.command = worker_argv(overrides, python=python)
        self.ledger = Ledger(store_from_config(cfg.storage), cfg.run.name)
        self.holds = start_holds(cfg, self.ledger.store)
        self.policy = RequeuePolicy(cfg.requeue)
        self.child: Any = None  # the attempt running: a subprocess.Popen, or a warm_start.ForkedAttempt
        self._forks: Any = None  # orchestrator.process.warm_start.Forks, made before the first attempt
        self.signalled: int | None = None
        self._unrecorded: list[AttemptEntry] = []  # attempts whose worker died before it opened the ledger

    def _forward(self, signum, _frame) -> None:
        # The machine (or a person) is stopping us: pass it on, then stop requeueing.
        first = self.signalled is None
        self.signalled = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)
        if first:
            log.warning(
                "received %s: forwarded to the worker; no further attempts will start", signal.Signals(signum).name
            )

    def run(self) -> int:
        previous = {s: signal.signal(s, self._forward) for s in FORWARDED_SIGNALS}
        try:
            return self._loop()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _loop(self) -> int:
        for number in itertools.count(1):
            token = f"{socket.gethostname()}:{os.getpid()}:{number}"
            hold, refusal = self.holds.take(number)
            if refusal:  # a cap is spent or leaves less than the start-up: no child starts (exit 3)
                log.error("%s", refusal)
                return exitcodes.BUDGET_EXHAUSTED
            oom_before, started = oom_kill_count(), time.monotonic()
            self.child = self._start(token, hold)
            returncode = self._wait(self.child)
            self.holds.release(hold, time.monotonic() - started)
            self._record_nodes()
            exit_class = refine_exit_class(classify_exit(returncode), oom_before, oom_kill_count())
            attempts, exit_class = self._attempts_with(exit_class, token)
            log.info("attempt exited with code %s (%s)", returncode, exit_class.value)
            if exit_class == ExitClass.OUT_OF_MEMORY and returncode != exitcodes.OUT_OF_MEMORY:
                log.error(
                    "the kernel's OOM killer ended the attempt (this cgroup's oom_kill count rose): host memory "
                    "ran out. Fix: %s",
                    out_of_memory_fix(self.cfg, bigger_gpus(self.cfg)),
                )
            if self.signalled is not None:
                log.warning("not requeued: this supervisor received %s", signal.Signals(self.signalled).name)
                return (
                    exitcodes.PREEMPTED if exit_class in exitcodes.PREEMPTION_CLASSES else _code(exit_class, returncode)
                )
            if exit_class in exitcodes.FINAL_CLASSES:
                # the class the attempt recorded wins over how its process ended: a worker killed after
                # it committed its final weights and closed the ledger as completed did complete
                return _code(exit_class, returncode)
            decision = self.policy.decide(attempts)
            log.warning(decision.log_line)
            if not decision.requeue:
                return (
                    exitcodes.CAPS_REACHED
                    if exit_class in exitcodes.PREEMPTION_CLASSES
                    else _code(exit_class, returncode)
                )
            if decision.delay_seconds > 0:
                time.sleep(decision.delay_seconds)
            if self.signalled is not None:
                return exitcodes.PREEMPTED
        raise AssertionError("unreachable")

    def _start(self, token: str, hold: Optional[str] = None):
        """The attempt's child: the worker, or a multi-node world (the store and one worker per node); ``hold``:
        its start-up hold in the spend index, which the worker's first reservation takes over."""
        env = dict(os.environ, **{LAUNCHED_BY_ENV: token})
        env.pop(HOLD_ENV, None)
        if hold:
            env[HOLD_ENV] = hold
        zone = self._zone()
        if zone:
            env[ZONE_ENV] = zone
        nodes = int(self.cfg.distributed.nodes) if self.cfg.distributed.name != "none" else 1
        if nodes <= 1:
            if self._can_fork():
                from orchestrator.process import warm_start

                # the import is the first attempt's start-up
                return warm_start.start(self.command, env, self._forks.take_inherited())
            return subprocess.Popen(self.command, env=env)
        from orchestrator.process.multinode.timeouts import heartbeat_timeout_s
        from orchestrator.process.multinode.world import STOP_MARGIN_S, LocalWorld

        timeout = heartbeat_timeout_s(self.cfg.distributed.heartbeat_timeout, self._ledger_attempts())
        start = None
        if self._can_fork():  # the store and every node forked from here, each in a session of its own
            from orchestrator.process import warm_start

            inherited = self._forks.take_inherited()

            def start(command, child_env):
                return warm_start.start(command, child_env, inherited, new_session=True)

        return LocalWorld(self.command, env, nodes, stop_after_s=timeout + STOP_MARGIN_S, start=start)

    def _zone(self) -> Optional[str]:
        """``compute.zones``: the zone the placement ranks first now (``planning.zone_order``), which this attempt is
        told it runs in (``ORCH_ZONE``). A machine here has no zones; this is what lets a replay or a bench drive
        the placement through real attempts. None when compute.zones is unset or nothing can be ranked."""
        if self.cfg.compute.zones is None:
            return None
        from orchestrator.core.errors import UserError
        from orchestrator.planning.zone_order import ranked_zones

        try:
            raw = self.ledger.load()
            record = LedgerRecord.decode(raw, self.ledger.uri) if raw else None
        except Exception as err:  # noqa: BLE001 - storage down or a bad ledger: rank without the history
            log.warning("compute.zones: ranking without the job's history (%s)", err)
            record = None
        try:
            ranked = ranked_zones(self.cfg, self.ledger.store, record)
        except UserError as err:
            log.warning("compute.zones: %s", err)
            return None
        if not ranked:
            return None
        log.info("zone %s (%s)", ranked[0].zone, ranked[0].reason)
        return ranked[0].zone

    def _can_fork(self) -> bool:
        """Whether this attempt is forked from this supervisor (``orchestrator.process.warm_start``): the stack is imported
        before the first; safety is checked again before every one."""
        from orchestrator.process import warm_start

        if not warm_start.is_worker_command(self.command):
            return False
        self._forks = self._forks or warm_start.Forks(self.cfg, overrides=self.command[3:])
        return self._forks.ready()

    def _record_nodes(self) -> None:
        """A multi-node world's nodes as this host saw them, where a node's own launcher could not record itself
        (it was killed): its end and exit code."""
        records = getattr(self.child, "node_records", None)
        if records is not None:
            from orchestrator.process.multinode.records import record_nodes

            record_nodes(self.ledger, self.child.rdzv_id, records(), fill_only=True)

    def _wait(self, child) -> int:
        while True:
            try:
                return child.wait()
            except InterruptedError:  # a forwarded signal interrupted the wait
                continue

    def _ledger_attempts(self) -> list[AttemptEntry]:
        """The ledger's attempts, decoded; none when it cannot be read (storage down) or does not decode (its
        worker stops on that at its start, exit 4: ``LedgerRecord``)."""
        try:
            return list(LedgerRecord.decode(self.ledger.load(), self.ledger.uri).attempts)
        except Exception as err:  # noqa: BLE001 - storage down: decide on what we saw
            log.warning("could not read the ledger (%s)", err)
            return []

    def _attempts_with(self, exit_class: ExitClass, token: str) -> tuple[list[AttemptEntry], ExitClass]:
        """The ledger's attempts with what this supervisor saw of its child's; and the child's class.

        The child's attempt is the one whose ``launched_by`` is ``token``. If
        it recorded its own end, that class is trusted (a child that exited
        FENCED is fenced, whatever the attempt that took over wrote of it). If it was killed and
        could not, its end is recorded in the ledger now (fenced:
        nothing is written when another attempt took over). A worker that died
        before it opened the ledger left no attempt at all; those are kept here
        so the failure cap still counts them.
        """
        attempts = self._ledger_attempts()
        mine = next((i for i in range(len(attempts) - 1, -1, -1) if attempts[i].launched_by == token), None)
        if mine is not None:
            attempt = attempts[mine]
            if attempt.running:
                self._close(attempt.fence, exit_class)
                attempts[mine] = replace(attempt, exit_class=exit_class.value, ended_at=attempt.last_seen)
            elif exit_class != ExitClass.FENCED:
                # a fenced child stepped aside on its own; the newer attempt had already marked it
                # vanished in the ledger, which must not make this supervisor requeue it
                exit_class = attempt_class(attempt) or exit_class
        else:
            step = attempts[-1].step_end if attempts else 0
            self._unrecorded.append(AttemptEntry.unrecorded(exit_class.value, step))
        return attempts + self._unrecorded, exit_class

    def _close(self, fence: int, exit_class: ExitClass) -> None:
        from orchestrator.records.ledger import Ledger

        try:
            if Ledger(self.ledger.store, self.ledger.run_name, fence=fence).close_lost_attempt(exit_class):
                log.info("recorded attempt %d as %s in the ledger", fence, exit_class.value)
        except Exception as err:  # noqa: BLE001 - storage down: the next attempt marks it vanished
            log.warning("could not record attempt %d's end in the ledger (%s)", fence, err)


def start_holds(cfg, store):
    """The supervisor's start-up holds (``orchestrator.money.spend_holds``), at the attempt's price."""
    from omegaconf import OmegaConf

    from orchestrator.attempt.build import attempt_price, cached_catalog, job_name
    from orchestrator.money.spend_holds import StartHolds

    _capacity, compute, _catalog, price = attempt_price(
        OmegaConf.to_object(cfg.compute), os.environ, cached_catalog(cfg, store)
    )  # as the attempt's meter
    return StartHolds(
        cfg, store, job_name(cfg), usd_per_second=price.usd_per_second, restart_seconds=compute.restart_seconds
    )


def _code(exit_class: ExitClass, returncode: int) -> int:
    """The supervisor's own exit code for a child that ended the job with ``exit_class``."""
    code = exitcodes.outcome(exit_class).exit_code
    if exit_class == ExitClass.CRASHED:
        return returncode if returncode > 0 else exitcodes.CRASHED
    return code if code is not None else exitcodes.CRASHED


def run(cfg, overrides: Sequence[str]) -> int:
    return Supervisor(cfg, overrides).run()
