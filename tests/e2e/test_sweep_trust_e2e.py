"""Issue 42's reproduction against a real S3 server (moto): whoever can write the bucket copies a sweep's record
under a new name and gives its trial ``compute.price_per_hour: 0.0``, ``model.trust_remote_code: true`` and a
``model.name_or_path`` whose config names a Python file; the sweep is relaunched under that name with
``sweep.allow_changes=true`` on a $0.01 budget. The file must never run, and nothing may be spent past the budget:
the trial is refused (its parameters are not the sweep's own) and, with ``ORCH_MANIFEST_HMAC_KEY`` set, the edited
record is one error naming it, exit 4."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import jobs

pytestmark = pytest.mark.e2e

EVIL = '''import pathlib
pathlib.Path({marker!r}).write_text("code from the bucket ran")
from transformers import LlamaConfig


class EvilConfig(LlamaConfig):
    pass
'''


def poisoned_model(tmp_path: Path) -> Path:
    """A copy of the tiny test model whose config.json names a Python file (run with trust_remote_code)."""
    models = Path(jobs.job_env(tmp_path)["ORCH_CACHE_DIR"]) / "models"
    source = next(models.glob("tiny-llama-*"))
    folder = tmp_path / "poisoned"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(EVIL.format(marker=str(tmp_path / "pwned")))
    return folder


def craft(tmp_path: Path, storage: jobs.Storage, base: list[str], s3_server) -> str:
    """The victim's sweep (one trial sampled), then the attacker's copy of it as sweep ``evil``."""
    from orchestrator import launch
    from orchestrator.sweep import decide
    from orchestrator.sweep.plan import plan_sweep

    plan = plan_sweep(base + ["sweep.name=victim"], launch.compose_for_launch)
    plan.state.new_trial(decide.sample(plan.space, plan.settings, [], 0))
    plan.state.release()  # the victim's driver ended
    bucket, _, prefix = storage.uri[len("s3://"):].partition("/")
    client = s3_server.client()
    doc = json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/victim/sweep.json")["Body"].read())
    doc["name"] = "evil"
    trial = doc["trials"][0]
    trial["run_name"] = "evil-t0"
    trial["params"].update({"compute.price_per_hour": 0.0, "model.trust_remote_code": True,
                            "model.name_or_path": str(poisoned_model(tmp_path))})
    client.put_object(Bucket=bucket, Key=f"{prefix}/evil/sweep.json", Body=json.dumps(doc).encode())
    return f"{storage.uri}/evil/sweep.json"


def spent(storage: jobs.Storage) -> float:
    from orchestrator.money.spend import job_total_usd
    from orchestrator.sweep.plan import spend_index

    return sum(job_total_usd(j) for j in spend_index(storage.store()).get("jobs", {}).values())


@pytest.mark.parametrize("signed", [False, True])
def test_a_crafted_sweep_record_runs_no_code_from_the_bucket_and_spends_within_the_budget(
        tmp_path, s3_server, s3_bucket, monkeypatch, signed):
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    base = ["-m", "train.learning_rate=1e-4,2e-4", "sweep.n_trials=1", "sweep.budget_usd=0.01", "train.max_steps=8",
            "data.num_examples=64", "tracking.enabled=false", "preemption.provider=none", *storage.overrides(),
            f"run.work_dir={tmp_path / 'work'}"]
    env = jobs.job_env(tmp_path)
    if signed:
        monkeypatch.setenv("ORCH_MANIFEST_HMAC_KEY", "k" * 32)
        env["ORCH_MANIFEST_HMAC_KEY"] = "k" * 32
    uri = craft(tmp_path, storage, base, s3_server)
    out = jobs.run_cmd(jobs.launch_cmd(base + ["sweep.name=evil", "sweep.allow_changes=true"]), tmp_path, env=env)
    text = out.stdout + out.stderr
    assert not (tmp_path / "pwned").exists(), text  # the bucket's Python file never ran
    assert spent(storage) <= 0.01 + 1e-9, text
    assert "Traceback" not in text, text
    if signed:
        err = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert out.returncode == 4 and len(err) == 1 and uri in err[0] and "signature does not match" in err[0], text
        return
    from orchestrator.sweep.state import SweepState

    trial = SweepState(storage.store(), "evil").load().trials[0]
    assert trial.status == "failed" and trial.launches == 0, trial
    assert "compute.price_per_hour, model.name_or_path, model.trust_remote_code" in trial.refused
    assert "trial 0 (evil-t0) is refused" in text and out.returncode == 0, text
    assert not storage.store().exists("evil-t0/ledger.json")  # never launched
