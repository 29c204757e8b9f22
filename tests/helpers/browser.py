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
