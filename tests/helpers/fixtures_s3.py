"""A real S3 server for tests: moto's server mode as a subprocess on 127.0.0.1.

Fixtures:
    s3_server (session): an object with ``.endpoint_url``, ``.region`` and ``.client()``.
        Set ORCH_TEST_S3_ENDPOINT to use a running S3-compatible server (MinIO...)
        instead; credentials then come from the environment if set.
    s3_bucket: a fresh bucket; returns ``s3://<bucket>/runs``.
    s3_store: an S3Store on ``s3_bucket``.

A server that cannot start fails the session loudly; tests never skip for it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.net import free_port

SERVER_START_TIMEOUT_SECONDS = 30.0
TEST_REGION = "us-east-1"
TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": TEST_REGION}
# A developer's own AWS settings must not leak into tests (or tests into a real account).
CLEARED_VARIABLES = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


@dataclass
class S3Server:
    endpoint_url: str
    region: str = TEST_REGION
    process: subprocess.Popen | None = field(default=None, repr=False)
    _client: object = field(default=None, repr=False)

    def client(self):
        """A boto3 S3 client on this server (shared: boto3 clients are thread-safe)."""
        if self._client is None:
            import boto3

            self._client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region)
        return self._client


def _server_command(port: int) -> list[str]:
    script = Path(sys.executable).parent / "moto_server"
    if script.exists():
        return [str(script), "-H", "127.0.0.1", "-p", str(port)]
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


def _wait_until_up(proc: subprocess.Popen, endpoint_url: str, log_path: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"moto S3 server exited with code {proc.returncode} before answering; its log:\n{log_path.read_text()}",
                pytrace=False,
            )
        try:
            urllib.request.urlopen(f"{endpoint_url}/moto-api/", timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # any HTTP answer means it is serving
        except OSError:
            time.sleep(0.1)
    proc.kill()
    pytest.fail(
        f"moto S3 server did not answer at {endpoint_url} within {SERVER_START_TIMEOUT_SECONDS:.0f}s; "
        f"its log:\n{log_path.read_text()}",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    saved = {name: os.environ.get(name) for name in (*TEST_CREDENTIALS, *CLEARED_VARIABLES)}
    external = os.environ.get("ORCH_TEST_S3_ENDPOINT")
    proc = None
    try:
        for name in CLEARED_VARIABLES:
            os.environ.pop(name, None)
        if external:
            for name, value in TEST_CREDENTIALS.items():
                os.environ.setdefault(name, value)
            yield S3Server(endpoint_url=external.rstrip("/"), region=os.environ["AWS_DEFAULT_REGION"])
            return
        os.environ.update(TEST_CREDENTIALS)
        port = free_port()
        endpoint_url = f"http://127.0.0.1:{port}"
        log_path = tmp_path_factory.mktemp("moto") / "moto_server.log"
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.Popen(_server_command(port), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as err:
                pytest.fail(f"could not start the moto S3 server ({err}); install the test extra: pip install 'moto[server]'", pytrace=False)
        _wait_until_up(proc, endpoint_url, log_path)
        yield S3Server(endpoint_url=endpoint_url, process=proc)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def empty_bucket(client, bucket: str) -> None:
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        for upload in page.get("Uploads", []):
            client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if objects:
            client.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True})


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh, empty bucket; returns the store URI ``s3://<bucket>/runs``."""
    client = s3_server.client()
    bucket = f"orch-test-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/runs"
    try:
        empty_bucket(client, bucket)
        client.delete_bucket(Bucket=bucket)
    except Exception as err:  # cleanup must not hide the test's own result
        print(f"warning: could not remove test bucket {bucket}: {err}", file=sys.stderr)


@pytest.fixture
def s3_store(s3_server, s3_bucket):
    """An S3Store on a fresh bucket, prefix ``runs``."""
    from orchestrator.storage.s3 import S3Store

    return S3Store(s3_bucket, endpoint_url=s3_server.endpoint_url, region=s3_server.region)


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    """The same tests on a local folder and on moto's S3 server."""
    if request.param == "local":
        from orchestrator.storage.local import LocalStore

        return LocalStore(tmp_path / "store")
    return request.getfixturevalue("s3_store")
