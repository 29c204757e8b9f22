"""A real HTTP server on 127.0.0.1 standing in for a Slack-compatible webhook."""
from __future__ import annotations

import collections
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class WebhookReceiver:
    """Records every POSTed JSON body, its Authorization header and path; answers ``status``."""

    def __init__(self, status: int = 200, path: str = "/hook"):
        self.bodies: list[dict] = []
        self.auth_headers: list[str] = []
        self.paths: list[str] = []
        self.status = status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                receiver.bodies.append(json.loads(self.rfile.read(length)))
                receiver.auth_headers.append(self.headers.get("Authorization") or "")
                receiver.paths.append(self.path)
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}{path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alert_names(self) -> collections.Counter:
        """How many alerts of each name arrived (the ``[name]`` prefix of the message text)."""
        return collections.Counter(re.match(r"\[(\w+)\]", b["text"]).group(1) for b in self.bodies)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
