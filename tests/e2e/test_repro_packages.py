"""An attempt that runs on other package versions than the job's first one says which, and the ledger keeps both.

Each attempt records ``packages_sha256`` (sha256 over every installed ``name==version``); the job's first record
also lists the versions, so a later attempt's warning names what changed (not just "the digest changed").
The versions differ here by a distribution that only ``importlib.metadata`` sees (a ``.dist-info`` folder on
``PYTHONPATH``), 1.0 for the first attempt and 2.0 for the one that resumes.
"""
from __future__ import annotations

import pytest

from tests.helpers import jobs

PACKAGE = "lockcheck-pkg"


def _site(tmp_path, version: str) -> str:
    info = tmp_path / f"site-{version}" / f"lockcheck_pkg-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n\n")
    return str(info.parent)


def _worker(overrides, tmp_path, version: str, **extra):
    env = jobs.job_env(tmp_path, {"PYTHONPATH": f"{_site(tmp_path, version)}:{jobs.REPO}", **extra})
    return jobs.run_cmd([jobs.PYTHON, "-m", "orchestrator.worker", *overrides], tmp_path, env=env, timeout=300,
                        fresh=True)


@pytest.mark.e2e
def test_a_resume_on_other_package_versions_names_them_and_each_attempt_records_its_digest(tmp_path):
    storage = jobs.Storage(str(tmp_path / "runs"))
    overrides = [*jobs.FAST, *storage.overrides(), "run.name=pkgs", "train.max_steps=12"]
    first = _worker(overrides, tmp_path, "1.0", ORCH_FAULT_AFTER_STEPS="6")  # crashes after six steps
    assert first.returncode not in (0, 4), first.stderr[-3000:]
    assert "differs from the first one" not in first.stderr
    second = _worker(overrides, tmp_path, "2.0")
    assert second.returncode == 0, second.stderr[-3000:]
    warnings = [line for line in second.stderr.splitlines() if "this attempt differs from the first one" in line]
    assert any("installed packages (1 changed" in line and f"{PACKAGE} 1.0 -> 2.0" in line for line in warnings), (
        warnings)

    ledger = jobs.ledger(storage, "pkgs")
    assert ledger["repro"]["installed"][PACKAGE] == "1.0"  # the job's first record lists what it ran on
    records = [a["extra"]["repro"] for a in ledger["attempts"]]
    assert len(records) == 2 and records[0]["packages_sha256"] != records[1]["packages_sha256"]
    assert all(len(r["packages_sha256"]) == 64 and "installed" not in r for r in records)  # the digest per attempt
