"""A real MLflow tracking server for tests: ``mlflow server`` as a subprocess on 127.0.0.1.

Fixture:
    mlflow_server (session): an object with ``.uri``, ``.stop()`` and ``.start()``.
        SQLite backend in a temp dir; artifacts proxied by the server
        (``--artifacts-destination``) into a bucket on the moto S3 server from
        ``tests/fixtures_s3.py``, so artifact logging crosses the same path as in
        production. ``stop()``/``start()`` restart it on the same port and
        database, for "server down mid-run" tests.

A server that cannot start fails the session loudly; tests never skip for it.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.net import free_port

# A cold start creates the schema (about 25 s on 2 slow cores); a restart is quicker.
SERVER_START_TIMEOUT_SECONDS = 120.0
SERVER_STOP_TIMEOUT_SECONDS = 15.0
ARTIFACT_BUCKET = "mlflow-artifacts"
# No GenAI job runner (eight huey worker processes, ~35 CPU-seconds to start on 2 cores) and
# no usage telemetry: the tests need the tracking API only.
MLFLOW_SERVER_QUIET_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}


class MlflowServer:
    def __init__(self, workdir: Path, artifacts_destination: str, env: dict[str, str]):
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.backend_uri = f"sqlite:///{workdir / 'mlflow.db'}"
        self.artifacts_destination = artifacts_destination
        self.log_path = workdir / "mlflow_server.log"
        self.env = env
        self.workdir = workdir
        self.process: subprocess.Popen | None = None

    def _command(self) -> list[str]:
        script = Path(sys.executable).parent / "mlflow"
        head = [str(script)] if script.exists() else [sys.executable, "-m", "mlflow"]
        return head + [
            "server",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--backend-store-uri", self.backend_uri,
            "--artifacts-destination", self.artifacts_destination,
            # One worker: the machine has few cores and tests are sequential.
            "--workers", "1",
        ]

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        with open(self.log_path, "ab") as log:
            try:
                # A session of its own so stop() can end the server and its uvicorn workers together.
                self.process = subprocess.Popen(
                    self._command(), stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir, start_new_session=True
                )
            except OSError as err:
                pytest.fail(f"could not start `mlflow server` ({err}); is mlflow installed in this environment?", pytrace=False)
        deadline = time.monotonic() + SERVER_START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(
                    f"`mlflow server` exited with code {self.process.returncode} before answering; "
                    f"its log:\n{self.log_path.read_text()[-4000:]}",
                    pytrace=False,
                )
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        pytest.fail(
            f"`mlflow server` did not answer {self.uri}/health within {SERVER_START_TIMEOUT_SECONDS:.0f}s; "
            f"its log:\n{self.log_path.read_text()[-4000:]}",
            pytrace=False,
        )

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=SERVER_STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # Wait until the port refuses connections, so "down" really means down.
        deadline = time.monotonic() + SERVER_STOP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.2)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory, s3_server):
    workdir = tmp_path_factory.mktemp("mlflow_server")
    s3_server.client().create_bucket(Bucket=ARTIFACT_BUCKET)
    env = dict(os.environ)
    # The server, not the client, writes artifacts to S3 (proxied artifacts), so the
    # endpoint and the moto credentials (set by s3_server) go to its environment.
    env["MLFLOW_S3_ENDPOINT_URL"] = s3_server.endpoint_url
    env.pop("MLFLOW_TRACKING_URI", None)
    env.update(MLFLOW_SERVER_QUIET_ENV)
    server = MlflowServer(workdir, f"s3://{ARTIFACT_BUCKET}/mlflow", env)
    server.start()
    try:
        yield server
    finally:
        server.stop()
