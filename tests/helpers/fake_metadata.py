"""A cloud's instance-metadata service on 127.0.0.1 (AWS IMDSv2, GCP, Azure), for the spot-notice watchers."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeMetadata:
    """A metadata service for one provider ("aws", "gcp" or "azure") on 127.0.0.1.

    Set ``notice`` to the provider's notice while it runs: aws: the
    instance-action dict; gcp: True; azure: the list of events. ``fail_next``
    makes that many polls answer HTTP 500.
    """

    def __init__(self, provider: str):
        self.provider = provider
        self.notice = None
        self.fail_next = 0
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str, bool]] = []  # (method, path, had a valid token)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def _send(self, status: int, body: str = "", content_type: str = "text/plain"):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):
                fake.requests.append(("PUT", self.path, False))
                if fake.provider == "aws" and self.path == "/latest/api/token":
                    if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                        return self._send(400, "missing TTL header")
                    token = f"token-{len(fake.tokens)}"
                    fake.tokens.add(token)
                    return self._send(200, token)
                self._send(404, "not found")

            def do_GET(self):
                token_ok = self.headers.get("X-aws-ec2-metadata-token") in fake.tokens
                fake.requests.append(("GET", self.path, token_ok))
                if fake.fail_next > 0:
                    fake.fail_next -= 1
                    return self._send(500, "internal error")
                if fake.provider == "aws" and self.path.startswith("/latest/"):
                    if not token_ok:
                        return self._send(401, "Unauthorized")
                    if self.path == "/latest/meta-data/spot/instance-action" and fake.notice:
                        return self._send(200, json.dumps(fake.notice), "application/json")
                    return self._send(404, "Not Found")
                if fake.provider == "gcp" and self.path == "/computeMetadata/v1/instance/preempted":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403, "Missing Metadata-Flavor:Google header")
                    return self._send(200, "TRUE" if fake.notice else "FALSE")
                if fake.provider == "azure" and self.path == "/metadata/scheduledevents?api-version=2020-07-01":
                    if self.headers.get("Metadata") != "true":
                        return self._send(400, "Bad request: Metadata header required")
                    body = {"DocumentIncarnation": 1 if fake.notice else 0, "Events": fake.notice or []}
                    return self._send(200, json.dumps(body), "application/json")
                self._send(404, "Not Found")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeMetadata":
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
