"""A page of the MLflow UI as a person sees it: headless Chromium (Debian's ``chromium``) renders it, runs its
JavaScript for a stretch of virtual time, and hands back the DOM (and a screenshot).

MLflow's UI is a React app: the HTML the server sends holds no data, so a check on the page's text is a check
that the app fetched the run and rendered it. ``scripts/test.sh`` installs ``chromium`` where it is missing; a
machine without it fails the test, it does not skip it.
"""
from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path

import pytest

# the app's fetches and renders finish well inside this much virtual time (about 3 s of real time here)
VIRTUAL_TIME_BUDGET_MS = 15000
WINDOW = "1600,1800"  # tall enough that the run page's metrics table is in the screenshot
TIMEOUT_SECONDS = 120


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail("headless Chromium is needed to check the MLflow UI and is not installed: run "
                    "`bash scripts/test.sh` (it installs Debian's chromium) or `apt-get install -y chromium`.",
                    pytrace=False)
    return found


def render(url: str, screenshot: Path) -> str:
    """The page's DOM after its scripts ran, as text (tags, scripts and styles removed, spaces collapsed);
    a screenshot of the same render goes to ``screenshot``."""
    return page_text(render_dom(url, screenshot))


def render_dom(url: str, screenshot: Path) -> str:
    """The page's DOM after its scripts ran, as HTML (what ``render`` reads its text from)."""
    done = subprocess.run(
        [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={WINDOW}",
         f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}", f"--screenshot={screenshot}", "--dump-dom", url],
        capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
    assert done.returncode == 0, f"chromium failed ({done.returncode}): {done.stderr[-3000:]}"
    return done.stdout


def page_text(dom: str) -> str:
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", text))).strip()


class Page:
    """A page in a headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
    requests on fd 3, replies on fd 4, each message JSON ended by a NUL byte), so a test can wait for what the
    app renders by polling an expression in the page: no fixed sleep, no virtual-time guess, robust under load.
    """

    def __init__(self, url: str):
        import os

        import tempfile

        self._log = tempfile.TemporaryFile()  # chromium's stderr: a pipe nobody reads would fill and stall it
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the child's fds 3 and 4 must be these pipe ends: dup them there in the child only
        fds = (to_browser_r, from_browser_w)

        def _wire() -> None:
            high = [os.dup(fd) for fd in fds]  # first out of the way: a pipe end may itself be fd 3 or 4
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={WINDOW}",
             "--remote-debugging-pipe", "--no-first-run", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log, preexec_fn=_wire,
            close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id, self._buffer = 0, b""
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        self.call("Page.navigate", session=True, url=url)

    def call(self, method: str, *, session: bool = False, **params):
        import json
        import os

        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._from_browser, 1 << 16)
                assert chunk, f"chromium closed its DevTools pipe: {self._stderr()}"
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next_id:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply["result"]

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (JSON-serialisable)."""
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = TIMEOUT_SECONDS, what: str = "the page"):
        """Poll ``expression`` until it is truthy (its value is returned); fail with the page's text after
        ``timeout_s``."""
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.5)
        text = self.evaluate("document.body ? document.body.innerText : ''") or ""
        raise AssertionError(f"{what} did not render within {timeout_s:.0f}s; the page shows: {text[:3000]}")

    def screenshot(self, path: Path) -> None:
        import base64

        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", session=True, format="png")["data"]))

    def close(self) -> None:
        import os

        try:
            self.call("Browser.close")
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        for fd in (self._to_browser, self._from_browser):
            os.close(fd)
        self._log.close()

    def _stderr(self) -> str:
        self._log.seek(0)
        return self._log.read()[-3000:].decode(errors="replace")

    def __enter__(self) -> "Page":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
