"""Preemption: signal flags, and spot notices read from real HTTP metadata servers on 127.0.0.1.

Each fake server speaks one cloud's protocol (AWS IMDSv2 refuses requests
without a session token, as EC2 does when IMDSv2 is required); a notice is
posted while the watcher is already polling.
"""
from __future__ import annotations

import datetime as dt
import email.utils
import logging
import os
import signal
import socket
import time

import pytest

from orchestrator.config.schema import PreemptionConfig
from orchestrator.attempt.preemption import GCP_NOTICE_SECONDS, PreemptionHandler
from tests.helpers.fake_metadata import FakeMetadata

POLL_SECONDS = 0.05
DETECT_TIMEOUT_SECONDS = 2.0


@pytest.fixture
def handlers():
    """Handlers made in a test, uninstalled afterwards whatever happens."""
    made: list[PreemptionHandler] = []
    yield made
    for handler in made:
        handler.uninstall()


def _watch(handlers, provider: str, url: str, grace_seconds: float = 120.0) -> PreemptionHandler:
    handler = PreemptionHandler(grace_seconds, provider=provider, metadata_url=url, poll_seconds=POLL_SECONDS)
    handlers.append(handler)
    return handler.install()


def _utc_in(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)


def test_aws_notice_posted_mid_run_raises_the_flag_with_the_notices_deadline(handlers):
    with FakeMetadata("aws") as fake:
        handler = _watch(handlers, "aws", fake.url, grace_seconds=120)
        time.sleep(5 * POLL_SECONDS)
        assert not handler.requested  # 404: no notice yet

        when = _utc_in(20).replace(microsecond=0)
        fake.notice = {"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
        assert handler.wait(DETECT_TIMEOUT_SECONDS)

        assert handler.reason.startswith("aws spot notice: terminate at ")
        assert 17 < handler.seconds_left() <= 20.5  # the notice's time, not the 120 s grace
        polls = [r for r in fake.requests if r[0] == "GET"]
        assert polls and all(had_token for _, _, had_token in polls)
        assert len(fake.tokens) == 1  # one token, reused across polls


def test_aws_notice_later_than_grace_keeps_the_grace_deadline(handlers):
    with FakeMetadata("aws") as fake:
        fake.notice = {"action": "stop", "time": _utc_in(600).strftime("%Y-%m-%dT%H:%M:%SZ")}
        handler = _watch(handlers, "aws", fake.url, grace_seconds=30)
        assert handler.wait(DETECT_TIMEOUT_SECONDS)
        assert "stop" in handler.reason
        assert 28 < handler.seconds_left() <= 30


def test_notice_after_a_signal_brings_the_deadline_forward(handlers):
    with FakeMetadata("aws") as fake:
        handler = _watch(handlers, "aws", fake.url, grace_seconds=120)
        os.kill(os.getpid(), signal.SIGTERM)
        assert handler.wait(DETECT_TIMEOUT_SECONDS) and handler.seconds_left() > 110
        fake.notice = {"action": "terminate", "time": _utc_in(10).strftime("%Y-%m-%dT%H:%M:%SZ")}
        until = time.monotonic() + DETECT_TIMEOUT_SECONDS
        while handler.seconds_left() > 11 and time.monotonic() < until:
            time.sleep(0.02)
        assert handler.seconds_left() <= 11
        assert handler.reason == "SIGTERM"  # the first cause is kept


def test_gcp_preempted_flag_gives_a_30_second_deadline(handlers):
    with FakeMetadata("gcp") as fake:
        handler = _watch(handlers, "gcp", fake.url, grace_seconds=120)
        time.sleep(5 * POLL_SECONDS)
        assert not handler.requested  # "FALSE"
        fake.notice = True
        assert handler.wait(DETECT_TIMEOUT_SECONDS)
        assert handler.reason.startswith("gcp preemption notice")
        assert GCP_NOTICE_SECONDS - 3 < handler.seconds_left() <= GCP_NOTICE_SECONDS


def test_azure_preempt_event_deadline_is_its_not_before(handlers):
    with FakeMetadata("azure") as fake:
        handler = _watch(handlers, "azure", fake.url, grace_seconds=120)
        soon = email.utils.format_datetime(_utc_in(15), usegmt=True)
        fake.notice = [{"EventId": "reboot-1", "EventType": "Reboot", "NotBefore": soon}]
        time.sleep(5 * POLL_SECONDS)
        assert not handler.requested  # a reboot is not an eviction

        not_before = email.utils.format_datetime(_utc_in(15).replace(microsecond=0), usegmt=True)
        fake.notice = [{"EventId": "evict-1", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                        "Resources": ["vm0"], "EventStatus": "Scheduled", "NotBefore": not_before}]
        assert handler.wait(DETECT_TIMEOUT_SECONDS)
        assert "evict-1" in handler.reason
        assert 12 < handler.seconds_left() <= 15.5


def test_watcher_survives_metadata_errors(handlers, caplog):
    with FakeMetadata("gcp") as fake:
        fake.fail_next = 4
        with caplog.at_level(logging.WARNING, logger="orchestrator.attempt.preemption"):
            handler = _watch(handlers, "gcp", fake.url)
            time.sleep(8 * POLL_SECONDS)
            fake.notice = True
            assert handler.wait(DETECT_TIMEOUT_SECONDS)
        failures = [r for r in caplog.records if "poll failed" in r.getMessage()]
        assert len(failures) == 1  # one line for a repeated failure, not one per poll


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_auto_picks_the_provider_that_answers(handlers, provider):
    with FakeMetadata(provider) as fake:
        handler = _watch(handlers, "auto", fake.url)
        until = time.monotonic() + DETECT_TIMEOUT_SECONDS
        while handler.watcher_name is None and time.monotonic() < until:
            time.sleep(0.02)
        assert handler.watcher_name == provider


def test_auto_with_no_metadata_service_relies_on_signals(handlers):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    handler = _watch(handlers, "auto", url)
    time.sleep(0.5)
    assert handler.watcher_name is None and not handler.requested
    os.kill(os.getpid(), signal.SIGUSR1)
    assert handler.wait(DETECT_TIMEOUT_SECONDS) and handler.reason == "SIGUSR1"


def test_first_signal_sets_the_flag_and_a_second_only_logs(handlers, caplog):
    previous = signal.getsignal(signal.SIGTERM)
    handler = PreemptionHandler(30, provider="none")
    handlers.append(handler)
    handler.install()
    assert not handler.requested and handler.deadline is None and handler.seconds_left() is None

    before = time.monotonic()
    os.kill(os.getpid(), signal.SIGTERM)
    assert handler.wait(DETECT_TIMEOUT_SECONDS)
    assert handler.reason == "SIGTERM"
    assert before + 30 <= handler.deadline <= time.monotonic() + 30
    first_deadline = handler.deadline

    with caplog.at_level(logging.INFO, logger="orchestrator.attempt.preemption"):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)  # let the interpreter run the handler
    assert handler.reason == "SIGTERM" and handler.deadline == first_deadline
    assert any("already saving" in r.getMessage() for r in caplog.records)

    handler.uninstall()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_from_config_reads_grace_and_validates_provider():
    handler = PreemptionHandler.from_config(PreemptionConfig(provider="none", grace="2m", poll_seconds=1))
    assert handler.grace_seconds == 120
    with pytest.raises(ValueError, match="preemption.provider='ibm'"):
        PreemptionHandler.from_config(PreemptionConfig(provider="ibm"))
