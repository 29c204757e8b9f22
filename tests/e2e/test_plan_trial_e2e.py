"""The planner against reality, and the reproducibility record of a resumed job.

(a) ``train.trial_steps=N`` prints the estimate beside what N steps measured;
(b) the planner's parameter, gradient and optimizer-state figures are within 20%
    of the tensors a real trainer allocates (LoRA and full fine-tune);
(c) every attempt of a resumed job leaves its reproducibility record in MLflow
    and in the ledger.
"""
from __future__ import annotations

import json
import random
import signal
import re
import uuid
from pathlib import Path

import pytest

from tests.helpers import jobs

TOLERANCE = 0.20


@pytest.mark.e2e
def test_trial_prints_estimate_beside_measurement(tmp_path):
    storage = jobs.Storage(str(tmp_path / "runs"))
    result = jobs.run_job(jobs.FAST + storage.overrides() + ["run.name=trial", "train.trial_steps=5"], tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    table = out[out.index("trial: "):]
    header = table.splitlines()[1]
    assert "estimate" in header and "measured" in header and "ratio" in header, table
    rows = {label: next((line for line in table.splitlines() if line.strip().startswith(label)), "")
            for label in ("parameters", "gradients", "optimizer states", "peak memory", "step time")}
    for label in ("parameters", "gradients", "optimizer states", "peak memory"):
        # both columns filled, so the ratio (measured / estimate) is printed at the end
        assert re.search(r"\d\.\d\d$", rows[label]), f"no estimate beside a measurement for {label!r}:\n{table}"
    # on CPU there is no peak-FLOPs figure, so the step time is measured only
    assert re.search(r"\d\.\d+ s", rows["step time"]), f"no measured step time:\n{table}"
    # a trial is its own job: the real job has no checkpoints and no ledger
    assert not storage.store().list("trial/")
    assert jobs.ledger(storage, "trial-trial")["status"] == "completed"


def _train_two_steps(overrides: list[str], tmp_path: Path, monkeypatch):
    from orchestrator.app.compose import compose_config
    from recipes import sft
    from recipes.data import load_datasets

    monkeypatch.setenv("ORCH_CACHE_DIR", str(jobs.REPO / ".cache" / "test-models"))
    cfg = compose_config(["train.max_steps=2", "data.num_examples=64", "tracking.enabled=false", *overrides])
    train_ds, eval_ds = load_datasets(cfg.data, "sft")
    trainer = sft.build_trainer(cfg, train_dataset=train_ds, eval_dataset=eval_ds, output_dir=str(tmp_path / "out"),
                                callbacks=[])
    trainer.train()
    return cfg, trainer


def _gradients_of_one_batch(trainer) -> None:
    """Forward and backward one batch without an optimizer step, so the gradients are still allocated."""
    model = trainer.model
    model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "labels") if k in batch}
    model(**inputs).loss.backward()


@pytest.mark.e2e
@pytest.mark.parametrize("peft", ["lora", "full"])
def test_estimated_state_is_within_20_percent_of_allocated_tensors(peft, tmp_path, monkeypatch):
    from orchestrator.planning import plan
    from orchestrator.planning import memory as plan_memory
    cfg, trainer = _train_two_steps([f"recipe.peft={peft}"], tmp_path, monkeypatch)
    _gradients_of_one_batch(trainer)
    measured = plan.count_allocated_state_bytes(trainer.model, trainer.optimizer)
    comp = plan_memory.estimate_memory(cfg).components
    estimated = {
        "params": comp.get("weights", 0) + comp.get("adapters", 0),
        "grads": comp["gradients"],
        "optimizer": comp["optimizer"] + comp.get("master_weights", 0),
    }
    for key, est in estimated.items():
        got = measured[key]
        assert got > 0, f"{peft}: nothing measured for {key}"
        assert abs(est - got) <= TOLERANCE * got, f"{peft} {key}: estimate {est:,} vs allocated {got:,} bytes"
    if peft == "lora":  # only the adapters (12% of this tiny model) get gradients, not the frozen base
        assert measured["grads"] < measured["params"] / 5


@pytest.mark.e2e
@pytest.mark.mlflow
def test_a_resumed_job_records_reproducibility_in_mlflow_and_the_ledger(mlflow_server, tmp_path):
    from mlflow import MlflowClient

    storage = jobs.Storage(str(tmp_path / "runs"))
    fast = [o for o in jobs.FAST if not o.startswith("tracking.")]
    overrides = fast + storage.overrides() + [
        "run.name=repro", "tracking.enabled=true", f"tracking.uri={mlflow_server.uri}",
        f"tracking.experiment=repro-{uuid.uuid4().hex[:8]}",
    ]
    rc, log, _ = jobs.interrupt_then_finish(overrides, tmp_path, storage, "repro", random.Random("repro"),
                                            [signal.SIGKILL])
    assert rc == 0, log[-4000:]
    assert "restoring checkpoint" in log

    ledger = jobs.ledger(storage, "repro")
    fences = [a["fence"] for a in ledger["attempts"]]
    assert len(fences) == 2, ledger["attempts"]
    keys = ("git_commit", "packages", "python", "torch", "hostname")
    for key in keys:
        assert key in ledger["repro"], ledger["repro"]
    for attempt in ledger["attempts"]:
        record = attempt["extra"]["repro"]
        assert all(key in record for key in keys), record
        assert record["packages"].get("torch") or record["torch"], record

    client = MlflowClient(mlflow_server.uri)
    run_id = ledger["mlflow_run_id"]
    listed = {Path(a.path).name for a in client.list_artifacts(run_id, "repro")}
    assert {f"attempt-{e}.json" for e in fences} <= listed, listed
    for fence in fences:
        local = client.download_artifacts(run_id, f"repro/attempt-{fence}.json", str(tmp_path / f"dl{fence}"))
        record = json.loads(Path(local).read_text())
        assert all(key in record for key in keys), record
        in_ledger = next(a for a in ledger["attempts"] if a["fence"] == fence)["extra"]["repro"]
        assert {k: record[k] for k in keys} == {k: in_ledger[k] for k in keys}
