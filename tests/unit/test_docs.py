"""Every shell command in README.md and docs/ names things that exist: scripts and test files, `orchestrator`
subcommands, and config keys and options (the overrides a job command carries compose against the schemas).

A renamed key, a removed script or a dropped subcommand fails here until the page that shows it is mended.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from orchestrator.cli.main import COMMANDS
from tests.helpers.pages import shell_commands
from tests.helpers.paths import REPO

ROOT = REPO
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# commands whose arguments are Hydra overrides of a job's config
JOB_COMMANDS = ("python -m orchestrator.launch", "bash scripts/run.sh", ".venv/bin/python -m orchestrator.launch",
                "orchestrator launch")


def _words(command: str) -> list[str]:
    return shlex.split(command.replace("|", " "))


def problems(command: str) -> list[str]:
    """What a command names that does not exist (empty: all of it does)."""
    words, found = _words(command), []
    for word in words:
        path = word.split("::")[0]
        if re.match(r"^(scripts|tests|conf|data|containers|docs)/[\w./-]+$", path) and "*" not in path:
            if not (ROOT / path).exists():
                found.append(f"{path} does not exist")
    for i, word in enumerate(words):
        if word.endswith("orchestrator") and (i == 0 or words[i - 1] == "-m"):
            sub = words[i + 1] if i + 1 < len(words) else "--help"
            if not sub.startswith("-") and sub not in COMMANDS:
                found.append(f"`orchestrator {sub}` is not a command ({', '.join(COMMANDS)})")
    if command.startswith(JOB_COMMANDS) or re.search(r"orchestrator plan\b", command):
        found += _override_problems([w for w in words if re.match(r"^\+?[\w.]+=", w)])
    return found


def _override_problems(overrides: list[str]) -> list[str]:
    from orchestrator.app.compose import compose_config
    from orchestrator.config.compose import split_sweep_overrides
    from orchestrator.core.errors import ConfigError
    from orchestrator.sweep.space import SearchSpace

    try:  # a sweep's search space (docs/sweeps.md) composes as its first point
        fixed, space = split_sweep_overrides(overrides)
        compose_config(fixed + SearchSpace.from_specs(space).representative(), launch_checks=False)
    except ConfigError as err:
        return [str(err)]
    return []


CASES = [(page.relative_to(ROOT).as_posix(), command) for page in PAGES for command in shell_commands(page)]


def test_the_pages_have_commands_to_check():
    pages = {page for page, _ in CASES}
    assert "README.md" in pages and len(CASES) >= 10, CASES


@pytest.mark.parametrize(("page", "command"), CASES, ids=[f"{p}:{i}" for i, (p, _) in enumerate(CASES)])
def test_every_shell_command_names_what_exists(page, command):
    assert problems(command) == [], f"{page}: {command}"


def test_a_wrong_key_a_missing_script_and_an_unknown_command_are_caught():
    assert problems("bash scripts/run.sh train.no_such_key=1")
    assert problems("python scripts/no_such_script.py")
    assert problems(".venv/bin/orchestrator no-such-command x")
    assert problems("bash scripts/run.sh recipe=dpo train.max_steps=5") == []
    assert problems("python -m orchestrator.launch -m train.learning_rat=1e-4,2e-4")
    assert problems("python -m orchestrator.launch sweep=asha 'train.learning_rate=interval(1e-5,1e-3)'") == []
