"""The local backend's supervisor: one child process per attempt, and the requeue policy.

The supervisor runs ``python -m orchestrator.worker <overrides>`` as a child,
forwards SIGTERM, SIGINT and SIGUSR1 to it, classifies each exit, and asks the
requeue policy whether to start another attempt. Caps live in the ledger, so
they hold whoever restarts the job: this supervisor, an external engine, or a
person re-running the launch command after the machine vanished.
"""
from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from typing import Sequence

from orchestrator import exitcodes
from orchestrator.exitcodes import ExitClass, classify_exit

log = logging.getLogger("orchestrator.supervisor")

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class Supervisor:
    def __init__(self, cfg, overrides: Sequence[str], *, python: str = sys.executable):
        from orchestrator.ledger import Ledger
        from orchestrator.requeue import RequeuePolicy
        from orchestrator.storage import store_from_config

        self.cfg = cfg
        self.command = [python, "-m", "orchestrator.worker", *overrides]
        self.ledger = Ledger(store_from_config(cfg.storage), cfg.run.name)
        self.policy = RequeuePolicy(cfg.requeue)
        self.child: subprocess.Popen | None = None
        self.signalled: int | None = None
        self._unrecorded: list[dict] = []

    def _forward(self, signum, _frame) -> None:
        # The machine (or a person) is stopping us: pass it on, then stop requeueing.
        first = self.signalled is None
        self.signalled = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)
        if first:
            log.warning("received %s: forwarded to the worker; no further attempts will start",
                        signal.Signals(signum).name)

    def run(self) -> int:
        previous = {s: signal.signal(s, self._forward) for s in FORWARDED_SIGNALS}
        try:
            return self._loop()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _loop(self) -> int:
        while True:
            recorded_before = len(self._ledger_attempts())
            self.child = subprocess.Popen(self.command)
            returncode = self._wait(self.child)
            exit_class = classify_exit(returncode)
            log.info("attempt exited with code %s (%s)", returncode, exit_class.value)
            if self.signalled is not None:
                log.warning("not requeued: this supervisor received %s", signal.Signals(self.signalled).name)
                return exitcodes.PREEMPTED if exit_class in exitcodes.INTERRUPTED else returncode
            if exit_class in exitcodes.FINAL_CLASSES:
                return returncode
            attempts = self._attempts_with(exit_class, recorded_before)
            decision = self.policy.decide(attempts)
            log.warning(decision.log_line)
            if not decision.requeue:
                return exitcodes.CAPS_REACHED if returncode in (exitcodes.PREEMPTED, 0) else (returncode or 1)
            if decision.delay_seconds > 0:
                time.sleep(decision.delay_seconds)
            if self.signalled is not None:
                return exitcodes.PREEMPTED

    def _wait(self, child: subprocess.Popen) -> int:
        while True:
            try:
                return child.wait()
            except InterruptedError:  # a forwarded signal interrupted the wait
                continue

    def _ledger_attempts(self) -> list[dict]:
        try:
            return list(self.ledger.load().get("attempts", []))
        except Exception as err:  # noqa: BLE001 - storage down: decide on what we saw
            log.warning("could not read the ledger (%s)", err)
            return []

    def _attempts_with(self, exit_class: ExitClass, recorded_before: int) -> list[dict]:
        """The ledger's attempts plus what this supervisor saw of the last one.

        A worker killed by a signal could not record its own end (the next
        attempt marks it vanished in the ledger; here we already know). A worker
        that died before it opened the ledger left no attempt at all; those are
        kept here so the failure cap still counts them.
        """
        attempts = self._ledger_attempts()
        if len(attempts) > recorded_before:
            if attempts[-1].get("exit_class") == "running":
                attempts[-1] = dict(attempts[-1], exit_class=exit_class.value)
        else:
            step = int(attempts[-1].get("step_end", 0)) if attempts else 0
            self._unrecorded.append({"exit_class": exit_class.value, "step_start": step, "step_end": step,
                                     "checkpoint_step_at_start": step})
        return attempts + self._unrecorded


def run(cfg, overrides: Sequence[str]) -> int:
    return Supervisor(cfg, overrides).run()
