"""The shell commands a documentation page shows: what tests/unit/test_docs.py checks and tests/e2e/test_first_real_job.py runs."""
from __future__ import annotations

import re
from pathlib import Path

SHELL_FENCES = {"bash", "sh", "shell", "console"}


def shell_commands(page: Path) -> list[str]:
    """The commands of the page's shell fences (continuation lines joined, comments and prompts dropped)."""
    commands, fence, pending = [], None, ""
    for line in page.read_text().splitlines():
        marker = re.match(r"^```(\w*)\s*$", line)
        if marker:
            fence = None if fence is not None else marker.group(1)
            continue
        if fence is None or fence not in SHELL_FENCES:
            continue
        line = re.sub(r"(^|\s)#\s.*$", "", line).strip()
        if not line or line.startswith("#"):
            continue
        pending += " " + line.removeprefix("$ ")
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        commands.append(pending.strip())
        pending = ""
    return commands
