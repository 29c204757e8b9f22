"""The buffered background delivery of one MLflow run's metric points and operations (``MetricsDelivery``).

A thread sends batches in order, coalesced to one request per interval; while the server is down they wait in
memory and are retried with backoff, so training never waits on MLflow. ``orchestrator.tracking.run`` (the job's
run) feeds it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

log = logging.getLogger(__name__)

MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit
MAX_BUFFERED_POINTS = 1_000_000  # ~100 MB; beyond this new points are dropped with a warning
SEND_INTERVAL_SECONDS = 5.0
RETRY_INITIAL_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0


def is_permanent(err: Exception) -> bool:
    """A 4xx from the server (bad value, deleted run) will fail the same way forever."""
    from mlflow.exceptions import MlflowException

    if isinstance(err, MlflowException):
        status = err.get_http_status_code()
        return 400 <= status < 500 and status != 429
    return False


class MetricsDelivery:
    """The background thread that sends a run's metric points and operations to MLflow, in order.

    Never blocks the caller and never raises: while the server is down, points
    wait in memory (up to MAX_BUFFERED_POINTS) and are retried with backoff; one
    request per SEND_INTERVAL_SECONDS carries everything queued meanwhile.

    Args:
        send: ``send(batch, op)`` delivers a list of metric points, or one operation when the batch
            is empty; raises on failure (permanent errors, see ``is_permanent``, drop the item).
    """

    def __init__(self, send):
        self._send = send
        self._metrics: deque = deque()
        self._ops: deque = (
            deque()
        )  # ("tags", [RunTag]) | ("text"|"dict"|"file"|"table", data, file) | ("inputs", [...])
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._in_flight = False
        self._stop = False
        self._flushing = 0  # callers waiting in flush(): send what is queued back to back, no coalescing wait
        self._dropped_overflow = 0
        self._thread = threading.Thread(target=self._deliver_forever, name="mlflow-delivery", daemon=True)
        self._thread.start()

    def add_points(self, points: list) -> None:
        with self._cond:
            for point in points:
                if len(self._metrics) >= MAX_BUFFERED_POINTS:
                    self._dropped_overflow += 1
                    if self._dropped_overflow == 1:
                        log.warning(
                            "MLflow buffer full (%d points, server down?); new points are being dropped",
                            MAX_BUFFERED_POINTS,
                        )
                    continue
                self._metrics.append(point)
            self._cond.notify_all()

    def add_op(self, op: tuple) -> None:
        with self._cond:
            self._ops.append(op)
            self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Retry now and wait up to ``timeout_s`` until everything queued is delivered."""
        with self._cond:
            self._flushing += 1
        self._wake.set()
        try:
            with self._cond:
                return self._cond.wait_for(
                    lambda: not self._metrics and not self._ops and not self._in_flight, timeout_s
                )
        finally:
            with self._cond:
                self._flushing -= 1

    def stop(self) -> int:
        """End the thread; returns how many points and operations were left undelivered."""
        with self._cond:
            self._stop = True
            left = len(self._metrics) + len(self._ops)
            self._cond.notify_all()
        self._wake.set()
        self._thread.join(timeout=5.0)
        return left

    def _deliver_forever(self) -> None:
        delay = RETRY_INITIAL_SECONDS
        failures = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or self._metrics or self._ops)
                if self._stop:
                    return
                batch = [self._metrics[i] for i in range(min(len(self._metrics), MAX_METRICS_PER_BATCH))]
                op = None if batch else self._ops[0]
                self._in_flight = True
            try:
                self._send(batch, op)
                outcome = "sent"
            except Exception as err:
                outcome = "dropped" if is_permanent(err) else "retry"
                failures += 1
                if outcome == "dropped":
                    log.error(
                        "MLflow refused %s and it was dropped: %s", "metrics" if batch or op is None else op[0], err
                    )
                elif failures == 1 or failures % 20 == 0:
                    log.warning(
                        "MLflow unreachable (%d tries, %d queued); retrying in the background: %s",
                        failures,
                        len(self._metrics) + len(self._ops),
                        str(err)[:200],
                    )
            with self._cond:
                self._in_flight = False
                if outcome != "retry":
                    for _ in batch:
                        self._metrics.popleft()  # only this thread removes, so the front is still the batch
                    if op is not None:
                        self._ops.popleft()
                self._cond.notify_all()
            if outcome == "retry":
                self._wake.wait(delay)  # flush() cuts the wait short
                self._wake.clear()
                delay = min(delay * 2, RETRY_MAX_SECONDS)
            elif outcome == "sent":
                if failures:
                    log.info("MLflow reachable again after %d failed tries; delivering the buffer", failures)
                delay, failures = RETRY_INITIAL_SECONDS, 0
                # coalesce: one request per interval carries everything logged meanwhile, so a
                # fast job costs the server (often on the same machine) a few requests a minute; not
                # while a flush() waits (close() does): each queued operation would wait an interval
                if not self._flushing:
                    self._wake.wait(SEND_INTERVAL_SECONDS)
                self._wake.clear()
