"""A stand-in for the Hugging Face hub on 127.0.0.1 (``HF_ENDPOINT``), answering as the hub does.

Repositories: ``public`` ones serve their files to anyone; ``gated`` ones to ``Bearer <GOOD_TOKEN>`` only:
401 with ``X-Error-Code: GatedRepo`` without a token, 403 with that code for another token (an account that has
not accepted the licence), as huggingface.co answers; any other id is 404 ``X-Error-Code: RepoNotFound``. The
model API (``/api/models/<id>[/revision/<rev>]``, what ``HfApi.model_info`` asks, used to pin revisions) answers
for public and gated repositories alike (a gated repository's card is public). A revision other than ``main``
or ``COMMIT`` is 404 ``RevisionNotFound``; a ``no_config`` repository has no config.json (404 ``EntryNotFound``). ``requests`` lists each request's
path and whether it carried a token.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GOOD_TOKEN = "hf_sekrit"
COMMIT = "c" * 40
REVISIONS = ("main", COMMIT)  # the revisions every repository has; another is 404 RevisionNotFound
CONFIG = json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256}).encode()


class FakeHub:
    def __init__(self, public=(), gated=(), no_config=()):
        self.public, self.gated, self.no_config = set(public) | set(no_config), set(gated), set(no_config)
        self.requests: list[tuple[str, str, bool]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub.answer(self, body=False)

            def do_GET(self):
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _repo(self, parts: list[str]) -> str:
        return "/".join(parts[:2])

    def answer(self, handler: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = handler.path.split("?")[0]
        auth = handler.headers.get("Authorization", "")
        self.requests.append((handler.command, path, bool(auth)))
        parts = [p for p in path.split("/") if p]
        api = parts[:2] == ["api", "models"]
        repo = self._repo(parts[2:] if api else parts)
        if repo not in self.public | self.gated:
            return self._send(handler, 404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
                              b'{"error":"Repository not found"}', body)
        if api:
            info = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "gated": repo in self.gated and "manual",
                               "private": False, "siblings": [{"rfilename": "config.json"}]}).encode()
            return self._send(handler, 200, {"Content-Type": "application/json"}, info, body)
        if repo in self.gated and auth != f"Bearer {GOOD_TOKEN}":
            code = 403 if auth else 401
            message = (f"Access to model {repo} is restricted and you are not in the authorized list." if auth else
                       f"Access to model {repo} is restricted. You must have access to it and be authenticated.")
            return self._send(handler, code, {"X-Error-Code": "GatedRepo", "X-Error-Message": message},
                              message.encode(), body)
        if len(parts) >= 5 and parts[2] == "resolve" and parts[3] not in REVISIONS:
            return self._send(handler, 404, {"X-Error-Code": "RevisionNotFound",
                                             "X-Error-Message": "Invalid rev id"}, b"Invalid rev id", body)
        if len(parts) >= 5 and parts[2] == "resolve" and parts[-1] == "config.json" and repo not in self.no_config:
            return self._send(handler, 200, {"X-Repo-Commit": COMMIT, "ETag": f'"{COMMIT[:20]}"',
                                             "Content-Type": "application/json"}, CONFIG, body)
        return self._send(handler, 404, {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"},
                          b"Entry not found", body)

    @staticmethod
    def _send(handler, code: int, headers: dict, payload: bytes, body: bool) -> None:
        handler.send_response(code)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        if body:
            handler.wfile.write(payload)
