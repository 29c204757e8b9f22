"""``orchestrator eval <uri>/<run>``: the store of the composed ``storage`` group, the job's own model, recipe and
experiment by default, an outage ended like a preemption (75) with its bill settled, overrides anywhere on the
command line (issue 42.5, issue 44.11). The evaluation itself is replaced where only its inputs matter."""
from __future__ import annotations

import json

import pytest

from orchestrator.cli import evaluate as eval_command
from orchestrator.records.ledger import Ledger

TASKS = "eval.tasks=[tiny_arith_mc]"


def _ledger(store, run, experiment="exp-a"):
    ledger = Ledger(store, run)
    ledger.begin_attempt(host="h", pid=1, instance_type=None, gpu_type="cpu", gpus=1, spot=True, checkpoint_step=0,
                         extra={"experiment": experiment})
    ledger.end_attempt("completed", 5, 0.25)


def _checkpoint(store, tmp_path, run, overrides, step=5):
    """A committed checkpoint of a job composed with ``overrides``, its manifest as a training attempt writes it."""
    from orchestrator.app.compose import compose_config
    from orchestrator.checkpoint.fingerprint import trajectory_config
    from orchestrator.checkpoint.store import CheckpointStore, checkpoint_name

    cfg = compose_config(overrides)
    folder = tmp_path / f"ckpt-{step}"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    checkpoints = CheckpointStore(store, run, staging_dir=tmp_path / "staging")
    checkpoints.commit_folder(folder, f"{run}/checkpoints/{checkpoint_name(step, 1)}/", step=step, fence=1,
                              meta={"trajectory": trajectory_config(cfg)})


@pytest.fixture
def captured(monkeypatch):
    """What ``orchestrator eval`` would evaluate: the composed config and the store it opened."""
    seen = {}

    def evaluation(cfg, store, run_name):
        seen.update(cfg=cfg, store=store, run=run_name, ledger=store.exists(f"{run_name}/ledger.json"))
        return {"evaluated": 0, "skipped": 0, "unusable": 0, "left": 0}, 0.0

    monkeypatch.setattr(eval_command, "billed_evaluation", evaluation)
    return seen


def test_the_store_is_the_composed_storage_groups_and_overrides_go_anywhere(s3_server, s3_store, captured):
    """Issue 42.5: the store was opened from --endpoint-url only, so ``storage.endpoint_url=`` (a MinIO job)
    read and billed a same-named AWS bucket; and an option after the run URI made the overrides "unrecognized"."""
    _ledger(s3_store, "job1")
    assert eval_command.main([f"{s3_store.uri}/job1", TASKS, f"storage.endpoint_url={s3_server.endpoint_url}",
                              "storage.retry_for=5s"]) == 0
    assert captured["ledger"] and captured["cfg"].storage.retry_for == "5s"
    assert type(captured["store"]).__name__ == "RetryingStore"  # storage.retry_for holds
    captured.clear()
    assert eval_command.main([f"{s3_store.uri}/job1", "--endpoint-url", s3_server.endpoint_url, TASKS]) == 0
    assert captured["ledger"] and captured["cfg"].eval.tasks == ["tiny_arith_mc"]


def test_the_jobs_own_model_and_recipe_are_the_default(tmp_path, captured):
    """Issue 44.11: without the job's overrides the default tiny model was loaded under the job's adapter (a PEFT
    size-mismatch traceback). The job's checkpoint manifest gives the model and recipe; an override changes only
    what it names."""
    from orchestrator.storage import open_store

    store = open_store(str(tmp_path / "runs"))
    _checkpoint(store, tmp_path, "job1", ["model.hidden_size=32", "model.num_layers=1", "model.dtype=bfloat16",
                                           "recipe=grpo", "recipe.peft=full"])
    assert eval_command.main([str(tmp_path / "runs" / "job1"), TASKS]) == 0
    model, recipe = captured["cfg"].model, captured["cfg"].recipe
    assert (model.hidden_size, model.num_layers, str(model.dtype)) == (32, 1, "bfloat16")
    assert (str(recipe.name), str(recipe.peft)) == ("grpo", "full")
    assert eval_command.main([str(tmp_path / "runs" / "job1"), TASKS, "model.dtype=float32"]) == 0
    assert str(captured["cfg"].model.dtype) == "float32" and captured["cfg"].model.hidden_size == 32


@pytest.mark.parametrize("override", ["model.hidden_size=64", "model=qwen2.5-0.5b"])
def test_a_model_that_is_not_the_checkpoints_is_refused_with_one_message(tmp_path, captured, capsys, override):
    from orchestrator.storage import open_store

    store = open_store(str(tmp_path / "runs"))
    _checkpoint(store, tmp_path, "job1", ["model.hidden_size=32"])
    assert eval_command.main([str(tmp_path / "runs" / "job1"), TASKS, override]) == 4
    err = capsys.readouterr().err
    assert "job 'job1' was trained on model." in err and "Drop the override" in err and "Traceback" not in err
    assert "cfg" not in captured  # nothing evaluated


def test_a_tampered_job_config_is_not_used(tmp_path, captured, caplog):
    from orchestrator.storage import open_store

    store = open_store(str(tmp_path / "runs"))
    _checkpoint(store, tmp_path, "job1", ["model.hidden_size=32"], step=5)
    _checkpoint(store, tmp_path, "job1", ["model.hidden_size=32"], step=9)
    key = tmp_path / "runs/job1/checkpoints/000000009-0001/manifest.json"
    manifest = json.loads(key.read_text())
    manifest["meta"]["trajectory"]["model.name_or_path"] = "${oc.env:AWS_SECRET_ACCESS_KEY}"
    key.write_text(json.dumps(manifest))
    assert eval_command.main([str(tmp_path / "runs" / "job1"), TASKS]) == 0
    assert captured["cfg"].model.hidden_size == 32  # from the older, sound checkpoint
    assert "000000009-0001/manifest.json gives no config" in caplog.text


def test_the_bill_goes_to_the_jobs_experiment(tmp_path):
    """Issue 42.5: the evaluation billed the default experiment, so the job's experiment cap never counted it."""
    from orchestrator.app.compose import compose_config
    from orchestrator.evaluation.billing import EvalBill
    from orchestrator.money.spend import INDEX_KEY
    from orchestrator.storage import open_store

    store = open_store(str(tmp_path / "runs"))
    _ledger(store, "job1", experiment="exp-a")
    bill = EvalBill(compose_config([TASKS]), store, "job1")
    bill.open()
    bill.close(0)
    assert json.loads(store.get_bytes(INDEX_KEY))["jobs"]["job1:eval"]["experiment"] == "exp-a"


def test_a_storage_outage_ends_the_evaluation_like_a_preemption_with_its_bill_settled(tmp_path, monkeypatch, capsys):
    """Issue 42.5: an outage of about 150 s ended it with a traceback, its ledger entry left running and its
    index entry open."""
    from orchestrator.evaluation import job
    from orchestrator.money.spend import INDEX_KEY
    from orchestrator.storage import open_store
    from orchestrator.storage.base import TransientStorageError

    store = open_store(str(tmp_path / "runs"))
    _ledger(store, "job1")

    def outage(*_args, **_kwargs):
        raise TransientStorageError("s3 unreachable for 150 s")

    monkeypatch.setattr(job, "evaluate_run", outage)
    assert eval_command.main([str(tmp_path / "runs" / "job1"), TASKS]) == 75
    out = capsys.readouterr()
    assert "storage" in out.out and "s3 unreachable" in out.out and "Traceback" not in out.err
    (bill,) = json.loads(store.get_bytes("job1/ledger.json"))["evaluations"]
    assert bill["status"] == "storage_outage"
    assert json.loads(store.get_bytes(INDEX_KEY))["jobs"]["job1:eval"]["open"] == {}


def test_a_local_copy_of_the_jobs_model_is_taken_with_a_warning(tmp_path, captured, caplog):
    from orchestrator.storage import open_store

    store = open_store(str(tmp_path / "runs"))
    _checkpoint(store, tmp_path, "job1", ["model.hidden_size=32"])
    copy = tmp_path / "tiny-copy"
    copy.mkdir()
    assert eval_command.main([str(tmp_path / "runs" / "job1"), TASKS, f"model.name_or_path={copy}"]) == 0
    assert captured["cfg"].model.name_or_path == str(copy) and "taken as a copy" in caplog.text


def test_another_seeds_evaluation_logs_no_items_over_the_runs(tmp_path, monkeypatch):
    """Issue 42.5: a rerun with another ``eval.seed`` overwrote the job's per-item files: the run's points stayed
    those of the first seed, its items became another seed's. Items are logged only with the scores they belong to."""
    from types import SimpleNamespace

    import mlflow

    from orchestrator.app.compose import compose_config
    from orchestrator.evaluation.job import log_to_run
    from tests.helpers.bench import result
    from orchestrator.storage import open_store

    store = open_store(str(tmp_path / "runs"))
    _ledger(store, "job1")
    ledger = json.loads(store.get_bytes("job1/ledger.json"))
    store.put_bytes("job1/ledger.json", json.dumps(dict(ledger, mlflow_run_id="r1")).encode())
    logged, artifacts = {}, {}

    class Client:
        def __init__(self, **_kwargs):
            pass

        def get_metric_history(self, run_id, key):
            return [SimpleNamespace(step=s) for s in logged.get(key, [])]

        def log_batch(self, run_id, metrics):
            for m in metrics:
                logged.setdefault(m.key, []).append(m.step)

        def log_dict(self, run_id, payload, path):
            artifacts[path] = payload

    monkeypatch.setattr(mlflow, "MlflowClient", Client)
    cfg = compose_config([TASKS, "tracking.enabled=true", f"tracking.uri={tmp_path}/mlruns"])
    for seed, items in ((1234, [1.0, 0.0]), (7, [1.0, 1.0])):
        record = result(5, scores={"tiny_arith_mc": {"acc": {"value": sum(items) / 2}}},
                        samples={"tiny_arith_mc": {"acc": items}}, seed=seed)  # the result store's
        log_to_run(cfg, store, "job1", record, 5, None, {"harness_version": "0.4.13", "task_hash": "ab", "seed": seed})
    assert logged["bench/tiny_arith_mc/acc"] == [5]
    (payload,) = artifacts.values()
    assert payload["items_of"].endswith("/1234") and payload["samples"]["tiny_arith_mc"]["acc"] == [1.0, 0.0]
