"""A launch in-process: ``python -m orchestrator.launch``'s own ``main`` with the user's arguments, in the launch
folder, its exit code and output as a ``subprocess.CompletedProcess``; a job it would start fails the test (a
``backend.dry_run=true`` launch prints what it would submit, as the command does).

A config check is tested this way (compose and validate in this interpreter, no new Python per case); one
end-to-end test runs the real command and proves its exit status (``tests/unit/config/test_config.py``).
"""
from __future__ import annotations

import subprocess
from pathlib import Path


def launch(argv: list[str], cwd: Path, monkeypatch, capsys) -> subprocess.CompletedProcess:
    """``orchestrator.launch.main(argv)`` run from ``cwd``; the returned object reads as ``subprocess.run``'s."""
    import orchestrator.backends
    from orchestrator import launch as launcher

    real = orchestrator.backends.run_backend

    def dry_run_only(cfg, overrides):
        if not cfg.backend.dry_run:
            raise AssertionError("the launch passed its checks and started a job")
        return real(cfg, overrides)  # prints what would be submitted; nothing runs

    monkeypatch.setattr(orchestrator.backends, "run_backend", dry_run_only)
    monkeypatch.chdir(cwd)
    capsys.readouterr()  # what the test printed before is not the launch's
    try:
        code = launcher.main(list(argv))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["python", "-m", "orchestrator.launch", *argv], code, out.out, out.err)
