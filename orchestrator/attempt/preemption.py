"""Preemption flags: signals and the clouds' spot-termination notices.

A ``PreemptionHandler`` turns SIGTERM, SIGUSR1 and SIGINT into a flag that the
training loop polls; it never interrupts a step. A daemon thread may also poll
the cloud's instance metadata service for a spot notice, which raises the same
flag with the cloud's own deadline. Whoever sees ``requested`` saves an
emergency checkpoint, committed before ``deadline`` (a ``time.monotonic()``
value), and exits with ``exitcodes.PREEMPTED``.

Only the standard library is used for HTTP, so the watcher works in any image.
"""

from __future__ import annotations

import datetime as _dt
import email.utils
import json
import logging
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional, cast

from orchestrator.core.durations import parse_duration
from orchestrator.core.exitcodes import PREEMPTION_SIGNALS

log = logging.getLogger(__name__)

HANDLED_SIGNALS = PREEMPTION_SIGNALS

AWS_METADATA_URL = "http://169.254.169.254"
AZURE_METADATA_URL = "http://169.254.169.254"
GCP_METADATA_URL = "http://metadata.google.internal"

AWS_TOKEN_TTL_SECONDS = 21600  # the most IMDSv2 allows
AWS_TOKEN_REFRESH_MARGIN_SECONDS = 60.0
GCP_NOTICE_SECONDS = 30.0  # GCE gives a preempted VM 30 s between the notice and the stop
AZURE_DEFAULT_NOTICE_SECONDS = 30.0  # used when a Preempt event has no NotBefore
PROBE_TIMEOUT_SECONDS = 0.3  # "auto": each provider gets this long to answer, once
REQUEST_TIMEOUT_SECONDS = 2.0  # one poll of a known provider

PROVIDERS = ("auto", "aws", "gcp", "azure", "none")

# Metadata services are link-local: a proxy from the environment must never see these requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class SpotNotice:
    """A cloud's notice that this machine will be reclaimed.

    ``seconds_left`` is how long the cloud says remains, measured when the
    notice was read (None: the cloud gave no time).
    """

    reason: str
    seconds_left: Optional[float]


def _http(method: str, url: str, headers: dict[str, str], timeout_seconds: float) -> tuple[int, str]:
    """One request; returns (status, body). HTTP error statuses are returned, not raised."""
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with _OPENER.open(request, timeout=timeout_seconds) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")


def _get_ok(url: str, headers: dict[str, str], timeout_seconds: float, what: str) -> str:
    """The body of a GET that must answer 200 (RuntimeError naming ``what`` otherwise)."""
    status, body = _http("GET", url, headers, timeout_seconds)
    if status != 200:
        raise RuntimeError(f"{what} answered HTTP {status}")
    return body


def _seconds_until(when: _dt.datetime) -> float:
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return (when - _dt.datetime.now(_dt.timezone.utc)).total_seconds()


class AwsWatcher:
    """EC2 spot interruption notice through IMDSv2 (a session token is required)."""

    name = "aws"

    def __init__(self, base_url: Optional[str] = None, timeout_seconds: float = REQUEST_TIMEOUT_SECONDS):
        self.base_url = (base_url or AWS_METADATA_URL).rstrip("/")
        self.timeout_seconds = timeout_seconds
        self._token: Optional[str] = None
        self._token_expires_at = 0.0  # monotonic

    def _fresh_token(self) -> str:
        if self._token is None or time.monotonic() >= self._token_expires_at:
            status, body = _http(
                "PUT",
                f"{self.base_url}/latest/api/token",
                {"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_SECONDS)},
                self.timeout_seconds,
            )
            if status != 200:
                raise RuntimeError(f"IMDSv2 token request answered HTTP {status}")
            self._token = body.strip()
            self._token_expires_at = time.monotonic() + AWS_TOKEN_TTL_SECONDS - AWS_TOKEN_REFRESH_MARGIN_SECONDS
        return self._token

    def probe(self) -> bool:
        """True when an IMDSv2 service answers a token request."""
        self._fresh_token()
        return True

    def check(self) -> Optional[SpotNotice]:
        """Poll once. Returns the notice, or None while there is none (HTTP 404)."""
        url = f"{self.base_url}/latest/meta-data/spot/instance-action"
        status, body = _http("GET", url, {"X-aws-ec2-metadata-token": self._fresh_token()}, self.timeout_seconds)
        if status == 401:  # the token expired early (e.g. the service restarted): one retry with a new one
            self._token = None
            status, body = _http("GET", url, {"X-aws-ec2-metadata-token": self._fresh_token()}, self.timeout_seconds)
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"spot/instance-action answered HTTP {status}")
        notice = json.loads(body)
        action, when = notice.get("action", "terminate"), notice.get("time")
        seconds_left = _seconds_until(_dt.datetime.fromisoformat(when.replace("Z", "+00:00"))) if when else None
        return SpotNotice(f"aws spot notice: {action} at {when}", seconds_left)


class GcpWatcher:
    """GCE preemption flag (``instance/preempted`` turns "TRUE" about 30 s before the stop)."""

    name = "gcp"

    def __init__(self, base_url: Optional[str] = None, timeout_seconds: float = REQUEST_TIMEOUT_SECONDS):
        self.base_url = (base_url or GCP_METADATA_URL).rstrip("/")
        self.timeout_seconds = timeout_seconds

    def _get(self) -> str:
        return _get_ok(
            f"{self.base_url}/computeMetadata/v1/instance/preempted",
            {"Metadata-Flavor": "Google"},
            self.timeout_seconds,
            "instance/preempted",
        ).strip()

    def probe(self) -> bool:
        self._get()
        return True

    def check(self) -> Optional[SpotNotice]:
        if self._get().upper() != "TRUE":
            return None
        return SpotNotice("gcp preemption notice: instance/preempted is TRUE", GCP_NOTICE_SECONDS)


class AzureWatcher:
    """Azure Scheduled Events: an event with EventType "Preempt" is a spot eviction.

    Every Preempt event listed is taken as ours: the service lists events for
    this VM and its availability set, and an eviction of a neighbour is rare
    enough that an early save is the cheaper mistake.
    """

    name = "azure"
    API_VERSION = "2020-07-01"

    def __init__(self, base_url: Optional[str] = None, timeout_seconds: float = REQUEST_TIMEOUT_SECONDS):
        self.base_url = (base_url or AZURE_METADATA_URL).rstrip("/")
        self.timeout_seconds = timeout_seconds

    def _get(self) -> dict[str, Any]:
        return json.loads(
            _get_ok(
                f"{self.base_url}/metadata/scheduledevents?api-version={self.API_VERSION}",
                {"Metadata": "true"},
                self.timeout_seconds,
                "scheduledevents",
            )
        )

    def probe(self) -> bool:
        self._get()
        return True

    def check(self) -> Optional[SpotNotice]:
        for event in self._get().get("Events", []):
            if event.get("EventType") != "Preempt":
                continue
            not_before = event.get("NotBefore") or ""
            seconds_left = (
                _seconds_until(email.utils.parsedate_to_datetime(not_before))
                if not_before
                else AZURE_DEFAULT_NOTICE_SECONDS
            )
            event_id = event.get("EventId", "?")
            return SpotNotice(f"azure preempt event {event_id}: not before {not_before or 'unset'}", seconds_left)
        return None


WATCHERS: dict[str, Any] = {"aws": AwsWatcher, "gcp": GcpWatcher, "azure": AzureWatcher}


def probe_provider(metadata_url: Optional[str] = None, timeout_seconds: float = PROBE_TIMEOUT_SECONDS):
    """Return a watcher for the first provider whose metadata service answers, else None.

    Tries aws, gcp, azure in turn, each once with a short timeout. Never raises.
    """
    for name, watcher_cls in WATCHERS.items():
        watcher = watcher_cls(metadata_url, timeout_seconds=timeout_seconds)
        try:
            watcher.probe()
        except Exception as err:  # noqa: BLE001 - any failure means "not this provider"
            log.debug("preemption: %s metadata service did not answer: %s", name, err)
            continue
        watcher.timeout_seconds = REQUEST_TIMEOUT_SECONDS
        return watcher
    return None


class PreemptionHandler:
    """The preemption flag of one training process.

    Args:
        grace_seconds: time from a signal's arrival to the emergency save's
            commit deadline.
        provider: "auto" | "aws" | "gcp" | "azure" | "none": which spot-notice
            watcher runs after ``install()``. "auto" probes each once.
        metadata_url: base URL replacing the provider's default (tests,
            proxies); used by every provider, including the "auto" probes.
        poll_seconds: interval between two polls of the metadata service.

    Raises:
        ValueError: an unknown provider or a negative interval.

    Use ``install()`` once in the main thread (or as a context manager), poll
    ``requested`` from the training loop, and ``uninstall()`` when done.
    """

    def __init__(
        self,
        grace_seconds: float = 30.0,
        *,
        provider: str = "none",
        metadata_url: Optional[str] = None,
        poll_seconds: float = 5.0,
    ):
        if provider not in PROVIDERS:
            raise ValueError(f"preemption.provider={provider!r} is not one of {', '.join(PROVIDERS)}.")
        if grace_seconds < 0 or poll_seconds <= 0:
            raise ValueError(
                f"preemption.grace must be >= 0 and preemption.poll_seconds > 0 "
                f"(got {grace_seconds} s and {poll_seconds} s)."
            )
        self.grace_seconds = float(grace_seconds)
        self.provider = provider
        self.metadata_url = metadata_url
        self.poll_seconds = float(poll_seconds)
        self._lock = threading.RLock()  # reentrant: a signal may land while the main thread holds it
        self._requested = False
        self._reason: Optional[str] = None
        self._deadline: Optional[float] = None
        self._previous_handlers: dict[int, Any] = {}
        self._stop_watcher = False
        self._watcher_thread: Optional[threading.Thread] = None
        self.watcher_name: Optional[str] = None  # the provider the watcher settled on, once known

    @classmethod
    def from_config(
        cls, preemption_cfg: Any, *, watch_cloud: bool = True, grace_seconds: Optional[float] = None
    ) -> "PreemptionHandler":
        """Build from the ``preemption`` config group (a DictConfig or PreemptionConfig); ``grace_seconds``: its grace
        as the typed view parsed it, else parsed here. ``watch_cloud=False`` (every rank but the main one): signals
        only, no spot-notice watcher."""
        grace = parse_duration(preemption_cfg.grace, key="preemption.grace") if grace_seconds is None else grace_seconds
        return cls(
            grace,
            provider=preemption_cfg.provider if watch_cloud else "none",
            metadata_url=preemption_cfg.metadata_url,
            poll_seconds=float(preemption_cfg.poll_seconds),
        )

    # -- the flag ---------------------------------------------------------

    @property
    def requested(self) -> bool:
        """True once a signal or a cloud notice asked this process to stop."""
        return self._requested

    @property
    def reason(self) -> Optional[str]:
        """What raised the flag: "SIGTERM", "SIGUSR1", "SIGINT" or the notice's text."""
        return self._reason

    @property
    def deadline(self) -> Optional[float]:
        """``time.monotonic()`` value by which the emergency save must be committed."""
        return self._deadline

    def seconds_left(self) -> Optional[float]:
        """Seconds until ``deadline`` (may be negative), or None when not requested."""
        deadline = self._deadline
        return None if deadline is None else deadline - time.monotonic()

    def request(self, reason: str, seconds_left: Optional[float] = None) -> bool:
        """Raise the flag, as a signal or notice does; thread-safe.

        The deadline is now + grace, or now + ``seconds_left`` when that is
        sooner. A later request keeps the first reason but may bring the
        deadline forward. Returns True when this call raised the flag.
        """
        now = time.monotonic()
        deadline = now + self.grace_seconds
        if seconds_left is not None:
            deadline = min(deadline, now + max(0.0, seconds_left))
        with self._lock:
            if self._requested:
                if deadline < cast(float, self._deadline):  # set with the flag
                    self._deadline = deadline
                    log.warning(
                        "preemption: %s brings the save deadline forward to %.0f s from now", reason, deadline - now
                    )
                else:
                    log.info("preemption: %s while already saving; ignored", reason)
                return False
            self._reason, self._deadline = reason, deadline
            self._requested = True
        log.warning("preemption: %s; emergency save must commit within %.0f s", reason, deadline - now)
        return True

    def wait(self, timeout_seconds: float) -> bool:
        """Block until ``requested`` or the timeout; returns ``requested``. For supervisors and tests."""
        until = time.monotonic() + timeout_seconds
        while not self._requested and time.monotonic() < until:
            time.sleep(0.02)
        return self._requested

    # -- signals ----------------------------------------------------------

    def _on_signal(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if self._requested:
            log.info("preemption: %s received, already saving", name)
            return
        self.request(name)

    def install(self) -> "PreemptionHandler":
        """Route SIGTERM, SIGUSR1 and SIGINT to the flag and start the watcher.

        Must be called from the main thread (Python only lets it set handlers).
        Returns self.
        """
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionHandler.install() must run in the main thread")
        for signum in HANDLED_SIGNALS:
            if signum not in self._previous_handlers:
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        if self.provider != "none" and self._watcher_thread is None:
            self._stop_watcher = False
            self._watcher_thread = threading.Thread(target=self._watch, name="preemption-watcher", daemon=True)
            self._watcher_thread.start()
        return self

    def uninstall(self) -> None:
        """Restore the previous signal handlers and stop the watcher (waits up to one request)."""
        for signum, previous in self._previous_handlers.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous_handlers.clear()
        self._stop_watcher = True
        thread, self._watcher_thread = self._watcher_thread, None
        if thread is not None:
            thread.join(timeout=REQUEST_TIMEOUT_SECONDS + 1.0)

    def __enter__(self) -> "PreemptionHandler":
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    # -- the cloud watcher ------------------------------------------------

    def _make_watcher(self):
        if self.provider == "auto":
            watcher = probe_provider(self.metadata_url)
            if watcher is None:
                log.info("preemption: no cloud metadata service answered; relying on signals only")
            return watcher
        return WATCHERS[self.provider](self.metadata_url)

    def _sleep(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while not self._stop_watcher and time.monotonic() < until:
            time.sleep(min(0.05, seconds))

    def _watch(self) -> None:
        # 1. choose the watcher (probing happens here, off the training thread)
        # 2. poll until a notice, the flag, or uninstall(); any error is logged and polling goes on
        try:
            watcher = self._make_watcher()
        except Exception:  # noqa: BLE001 - a watcher must never take training down
            log.exception("preemption: could not start the %s watcher", self.provider)
            return
        if watcher is None:
            return
        self.watcher_name = watcher.name
        log.info("preemption: watching %s spot notices every %.1f s", watcher.name, self.poll_seconds)
        last_error: Optional[str] = None
        # polling goes on after a signal: a notice may bring the deadline forward
        while not self._stop_watcher:
            try:
                notice = watcher.check()
                last_error = None
            except Exception as err:  # noqa: BLE001
                if str(err) != last_error:  # one line per distinct failure, not one per poll
                    log.warning("preemption: %s metadata poll failed (will retry): %s", watcher.name, err)
                last_error = str(err)
                notice = None
            if notice is not None:
                self.request(notice.reason, notice.seconds_left)
                return
            self._sleep(self.poll_seconds)
