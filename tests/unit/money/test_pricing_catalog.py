"""The shipped catalog prices the whole machine a job rents, states that basis and its date in every entry, and the
README's plan ranks GPU types by those prices (issue 43: a T4 ranked first at GCP's accelerator-only $0.14/h)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.money.cost import load_catalog
from tests.helpers.paths import REPO

ROOT = REPO


def _entries():
    for gpu_type, entry in load_catalog().items():
        for cloud, figures in entry["clouds"].items():
            for mode in ("on_demand", "spot"):
                yield gpu_type, cloud, mode, figures[mode]


def test_every_entry_states_its_whole_machine_basis_date_and_region():
    for gpu_type, cloud, mode, quoted in _entries():
        where = (gpu_type, cloud, mode)
        assert str(quoted.get("basis", "")).startswith("whole machine"), where
        assert quoted.get("machine") and quoted.get("region"), where
        assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", str(quoted.get("as_of"))), where
        gpus = int(quoted["gpus"])
        assert gpus >= (0 if gpu_type == "cpu" else 1), where
        # usd is the machine's price shared over its GPUs: what the meter multiplies by the job's GPU count
        assert quoted["usd"] == pytest.approx(quoted["machine_usd"] / max(1, gpus), abs=0.005), where


def test_gcp_prices_its_gpus_with_the_machine_around_them():
    """GCP lists a T4 or an L4 alone; the machine that holds it adds vCPUs and memory: the catalog's price is the
    sum, more than the accelerator's list price, and its basis names each part."""
    catalog = load_catalog()
    accelerator_only = {("t4", "on_demand"): 0.35, ("t4", "spot"): 0.14, ("l4", "on_demand"): 0.56, ("l4", "spot"): 0.224}
    for (gpu_type, mode), gpu_alone in accelerator_only.items():
        quoted = catalog[gpu_type]["clouds"]["gcp"][mode]
        assert quoted["usd"] > gpu_alone + 0.02, (gpu_type, mode, quoted["usd"])
        assert "vCPU" in quoted["basis"] and "GB" in quoted["basis"], quoted["basis"]


def _readme_plan_overrides() -> list[str]:
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if "orchestrator plan " in line)
    return line.split("orchestrator plan ", 1)[1].split()


def test_the_readme_plan_ranks_gpus_by_whole_machine_prices(tmp_path, monkeypatch):
    from orchestrator.app.compose import compose_config
    from orchestrator.planning.plan import plan_text

    monkeypatch.setenv("ORCH_PRICES_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    overrides = _readme_plan_overrides()
    assert overrides == ["model=llama-3.1-8b", "recipe=qlora", "compute=l40s-spot"]
    text = plan_text(compose_config([*overrides, f"storage.uri={tmp_path}"]))
    rows = re.findall(r"^  (\S+) +\d+ GB +\$([\d.,]+)/h", text, re.M)
    assert rows, text
    catalog = load_catalog()
    for gpu_type, hourly in rows:  # each at its cheapest cloud's whole-machine spot price
        machines = [f["spot"] for f in catalog[gpu_type]["clouds"].values()]
        assert float(hourly) == pytest.approx(min(q["usd"] for q in machines), abs=0.005), (gpu_type, hourly)
    first, hourly = rows[0]
    assert float(hourly) > 0.14, f"{first} ranked first at ${hourly}/h: GCP's T4 alone"
    assert re.search(r"^prices: shipped catalog of \d{4}-\d{2}, \d+ days old", text, re.M), text
