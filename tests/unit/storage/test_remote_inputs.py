"""A job's files reach the machine that runs it (issue 25).

- SkyPilot and Kubernetes jobs rendered from a project folder carry no path of the launch machine; the rendered
  SkyPilot ``run:`` command, run in a copy of the workdir at another absolute path (as SkyPilot lays out the VM)
  against moto's S3 server, trains to the end.
- An input the worker's machine cannot reach is refused at launch (exit 4) with the fix.
- ``s3://`` data, chat templates and model weights train on moto's S3 server; a changed data object is a changed
  trajectory, so a resume refuses it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from orchestrator.core import exitcodes
from orchestrator.core.errors import DataError
from recipes.data import synthetic_rows
from tests.helpers import jobs

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
SMALL = jobs.with_overrides(jobs.FAST, "train.max_steps=12", "checkpoint.every_steps=4", "checkpoint.every=1h")


def _messages_rows(n: int, seed: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["completion"]}]}
            for r in synthetic_rows("sft", n, seed)]


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _tiny_model() -> Path:
    from recipes.tiny import ensure_tiny_model

    return Path(ensure_tiny_model(64, 2, 4, 512))


@pytest.fixture
def project(tmp_path):
    """A user's project folder: data, a chat template and a model folder, all given by relative paths."""
    folder = tmp_path / "laptop" / "proj"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "train.jsonl").write_text(_jsonl(_messages_rows(120, 7)))
    (folder / "data" / "chat.jinja").write_text(TEMPLATE)
    shutil.copytree(_tiny_model(), folder / "models" / "tiny")
    return folder


RELATIVE_INPUTS = ["recipe=sft", "data=jsonl", "data.path=data/train.jsonl", "data.chat_template=data/chat.jinja",
                   "model.name_or_path=./models/tiny"]


def _launch(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(jobs.launch_cmd(args), cwd=cwd, env=env or jobs.job_env(cwd), capture_output=True,
                          text=True, timeout=300)


def _rendered(stdout: str, marker: str) -> dict:
    return yaml.safe_load(stdout[stdout.index(marker):])


# -- the launch: what each backend is handed ------------------------------------------------------------------


@pytest.mark.e2e
def test_rendered_skypilot_task_runs_and_recovers_in_copies_of_the_workdir_elsewhere(project, s3_server, s3_bucket,
                                                                                    tmp_path):
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    args = [*RELATIVE_INPUTS, *SMALL, *storage.overrides(), "run.name=sky1", "backend=skypilot",
            "backend.dry_run=true"]
    done = _launch(args, project)
    assert done.returncode == 0, done.stderr[-3000:]
    task = _rendered(done.stdout, "# sky jobs launch")
    assert task["workdir"] == str(project)  # the local side of the sync
    assert str(project) not in task["run"] and str(project.parent) not in task["run"], task["run"]
    assert "run.work_dir" not in task["run"]
    assert "data.path=./data/train.jsonl" in task["run"] and "model.name_or_path=./models/tiny" in task["run"]

    # the VM: SkyPilot copies the workdir to ~/sky_workdir and runs `run:` there; the laptop's folder is gone.
    # The first VM fails after a checkpoint; the recovery runs on another VM, whose home is elsewhere.
    first, second = (tmp_path / vm / "home" / user / "sky_workdir"
                     for vm, user in (("vm1", "ubuntu"), ("vm2", "gcpuser")))
    shutil.copytree(project, first)
    shutil.copytree(project, second)
    shutil.rmtree(project.parent)
    crashed = _run_on_vm(task, first, {"ORCH_FAULT_AFTER_STEPS": "6"})
    assert crashed.returncode not in (exitcodes.COMPLETED, exitcodes.CONFIG_ERROR), crashed.stderr[-4000:]
    assert jobs.committed_steps(storage, "sky1") == [4]
    recovered = _run_on_vm(task, second)
    assert recovered.returncode == exitcodes.COMPLETED, recovered.stderr[-4000:]
    ledger = jobs.ledger(storage, "sky1")
    assert ledger["status"] == "completed" and ledger["attempts"][-1]["step_end"] == 12
    assert ledger["attempts"][-1]["checkpoint_step_at_start"] == 4  # resumed: the same trajectory on another VM
    assert (second / ".cache" / "work").is_dir()  # the worker's own work folder, under its working directory


def _run_on_vm(task: dict, vm: Path, extra: dict | None = None) -> subprocess.CompletedProcess:
    env = jobs.job_env(vm, {**{k: str(v) for k, v in task["envs"].items()}, **(extra or {})})
    env["PATH"] = f"{Path(jobs.PYTHON).parent}{os.pathsep}{env['PATH']}"  # `python` is the VM's environment
    return subprocess.run(["bash", "-c", task["run"]], cwd=vm, env=env, capture_output=True, text=True, timeout=600)


def test_kubernetes_job_from_a_project_folder_holds_no_launch_path(project, monkeypatch, capsys):
    from orchestrator import launch

    monkeypatch.chdir(project)
    code = launch.main(["recipe=sft", "data=jsonl", "data.path=/app/data/train.jsonl",
                        "data.chat_template=/app/data/chat.jinja", "model.name_or_path=/app/models/tiny",
                        "storage.uri=s3://bucket/runs", "backend=kubernetes", "backend.image=registry.example/orch:1",
                        "+backend.extra.image_paths=[/app/data,/app/models]", "backend.dry_run=true"])
    out = capsys.readouterr().out
    assert code == 0
    container = _rendered(out, "# kubectl apply")["spec"]["template"]["spec"]["containers"][0]
    text = json.dumps(container)
    assert str(project) not in text and "run.work_dir" not in text, text
    assert "data.path=/app/data/train.jsonl" in container["args"]


@pytest.mark.parametrize("backend, given, fix", [
    ("skypilot", "data.path={outside}", "outside the folder SkyPilot syncs to the VM"),
    ("skypilot", "model.name_or_path={outside_dir}", "outside the folder SkyPilot syncs to the VM"),
    ("skypilot", "backend.image=registry.example/orch:1", "with backend.image SkyPilot syncs no workdir"),
    ("kubernetes", "data.path=data/train.jsonl", "a Kubernetes pod sees only its image and object storage"),
    ("kubernetes", "data.chat_template=data/chat.jinja", "a Kubernetes pod sees only its image and object storage"),
])
def test_an_input_the_worker_cannot_reach_is_refused_at_launch_with_the_fix(project, tmp_path, monkeypatch, capsys,
                                                                          backend, given, fix):
    from orchestrator import launch

    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text(_jsonl(_messages_rows(20, 1)))
    monkeypatch.chdir(project)
    image = ["backend.image=registry.example/orch:1"] if backend == "kubernetes" else []
    args = ["recipe=sft", "data=jsonl", "data.path=data/train.jsonl", "storage.uri=s3://bucket/runs",
            f"backend={backend}", "backend.dry_run=true", *image,
            given.format(outside=outside, outside_dir=_tiny_model())]
    code = launch.main(args)
    err = capsys.readouterr().err
    assert code == exitcodes.CONFIG_ERROR, err
    assert fix in err and "s3://" in err, err
    assert "task" not in capsys.readouterr().out


def test_a_skypilot_input_left_out_of_the_sync_by_gitignore_is_refused(project, monkeypatch, capsys):
    from orchestrator import launch

    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / ".gitignore").write_text("data/\n")
    monkeypatch.chdir(project)
    code = launch.main([*RELATIVE_INPUTS, "storage.uri=s3://bucket/runs", "backend=skypilot", "backend.dry_run=true"])
    err = capsys.readouterr().err
    assert code == exitcodes.CONFIG_ERROR and ".gitignore" in err, err


def test_slurm_keeps_absolute_paths_of_the_shared_filesystem(project, monkeypatch, capsys):
    from orchestrator import launch

    monkeypatch.chdir(project)
    code = launch.main([*RELATIVE_INPUTS, "backend=slurm", "backend.dry_run=true"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"data.path={project}/data/train.jsonl" in out and f"model.name_or_path={project}/models/tiny" in out


# -- s3:// inputs ------------------------------------------------------------------------------------------------


def _put(s3_server, uri: str, body: bytes) -> None:
    bucket, _, key = uri[len("s3://"):].partition("/")
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=body)


def _upload_folder(s3_server, folder: Path, uri: str) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            _put(s3_server, f"{uri.rstrip('/')}/{path.relative_to(folder).as_posix()}", path.read_bytes())


def _storage_cfg(s3_server):
    from orchestrator.config.schema import StorageConfig

    return StorageConfig(endpoint_url=s3_server.endpoint_url, region=s3_server.region)


def test_an_object_a_folder_and_a_glob_download_once_and_verified(s3_server, s3_bucket, tmp_path):
    from orchestrator.storage.inputs import InputFiles

    bucket = s3_bucket.split("/")[2]
    for name in ("a.jsonl", "b.jsonl", "notes.txt"):
        _put(s3_server, f"s3://{bucket}/data/shards/{name}", f"{name}\n".encode())
    files = InputFiles(_storage_cfg(s3_server), tmp_path / "inputs")
    one = files.fetch(f"s3://{bucket}/data/shards/a.jsonl")
    assert [p.name for p in one] == ["a.jsonl"] and one[0].read_text() == "a.jsonl\n"
    assert [p.name for p in files.fetch(f"s3://{bucket}/data/shards/")] == ["a.jsonl", "b.jsonl", "notes.txt"]
    assert [p.name for p in files.fetch(f"s3://{bucket}/data/shards/*.jsonl")] == ["a.jsonl", "b.jsonl"]
    before = one[0].stat().st_mtime_ns
    assert files.fetch(f"s3://{bucket}/data/shards/a.jsonl")[0].stat().st_mtime_ns == before  # not fetched again
    with pytest.raises(DataError, match="no such object"):
        files.fetch(f"s3://{bucket}/data/missing.jsonl")


def test_a_key_that_would_leave_the_download_folder_is_refused(s3_server, s3_bucket, tmp_path):
    from orchestrator.storage.inputs import InputFiles

    bucket = s3_bucket.split("/")[2]
    _put(s3_server, f"s3://{bucket}/models/x/config.json", b"{}")
    _put(s3_server, f"s3://{bucket}/models/x/../../../escape.txt", b"owned")
    files = InputFiles(_storage_cfg(s3_server), tmp_path / "inputs")
    with pytest.raises(DataError, match="outside the download folder"):
        files.folder_of(f"s3://{bucket}/models/x")
    assert not list(tmp_path.rglob("escape.txt"))


def test_a_key_that_is_both_an_object_and_a_folder_is_refused_naming_both(s3_server, s3_bucket, tmp_path):
    """S3 holds ``m/weights`` and ``m/weights/part-1`` side by side; a folder cannot: the download crashed on it.
    Now the listing is refused, naming the two keys, before anything is downloaded."""
    from orchestrator.storage.inputs import InputFiles

    bucket = s3_bucket.split("/")[2]
    _put(s3_server, f"s3://{bucket}/m/config.json", b"{}")
    _put(s3_server, f"s3://{bucket}/m/weights", b"file")
    _put(s3_server, f"s3://{bucket}/m/weights/part-1", b"part")
    files = InputFiles(_storage_cfg(s3_server), tmp_path / "inputs")
    with pytest.raises(DataError, match=r"m/weights is an object and also a folder of m/weights/part-1"):
        files.folder_of(f"s3://{bucket}/m")
    assert not [p for p in (tmp_path / "inputs").rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_bytes_that_do_not_match_the_listed_size_or_etag_are_refused(tmp_path):
    from orchestrator.storage.inputs import verify

    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 100)
    good = hashlib.md5(b"x" * 100).hexdigest()
    verify(path, 100, f'"{good}"', "s3://b/f.bin")
    with pytest.raises(DataError, match="do not match the object's ETag"):
        verify(path, 100, '"' + hashlib.md5(b"y").hexdigest() + '"', "s3://b/f.bin")
    with pytest.raises(DataError, match="the bucket listed 101"):
        verify(path, 101, f'"{good}"', "s3://b/f.bin")


def test_a_multipart_upload_is_checked_against_its_etag(s3_server, s3_bucket, tmp_path):
    from orchestrator.storage.inputs import InputFiles, verify

    from boto3.s3.transfer import TransferConfig

    bucket = s3_bucket.split("/")[2]
    body = os.urandom(9 * 1024 * 1024)
    src = tmp_path / "big.bin"
    src.write_bytes(body)
    s3_server.client().upload_file(str(src), bucket, "w/big.bin", Config=TransferConfig(
        multipart_threshold=5 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024))
    etag = s3_server.client().head_object(Bucket=bucket, Key="w/big.bin")["ETag"]
    assert etag.strip('"').endswith("-2")
    got = InputFiles(_storage_cfg(s3_server), tmp_path / "inputs").fetch(f"s3://{bucket}/w/big.bin")[0]
    assert got.read_bytes() == body
    src.write_bytes(body[:-1] + b"\0" if body[-1] else body[:-1] + b"\1")
    with pytest.raises(DataError, match="ETag"):
        verify(src, len(body), etag, "s3://b/w/big.bin")


def test_parquet_shards_under_a_glob_are_read_in_key_order(s3_server, s3_bucket, tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.storage import inputs
    from orchestrator.storage.inputs import InputFiles
    from recipes.data import _read_jsonl

    bucket = s3_bucket.split("/")[2]
    rows = synthetic_rows("sft", 6, 3)
    for i in range(2):
        out = tmp_path / f"part-{i}.parquet"
        pq.write_table(pa.Table.from_pylist(rows[3 * i:3 * i + 3]), out)
        _put(s3_server, f"s3://{bucket}/pq/part-{i}.parquet", out.read_bytes())
    monkeypatch.setitem(inputs._ACTIVE, "files", InputFiles(_storage_cfg(s3_server), tmp_path / "inputs"))
    assert _read_jsonl(f"s3://{bucket}/pq/part-*.parquet") == rows


def test_a_missing_s3_input_is_refused_at_launch(s3_server, s3_bucket, tmp_path):
    done = _launch(["recipe=sft", "data=jsonl", f"data.path={s3_bucket}/nothing-here.jsonl",
                    f"storage.uri={s3_bucket}", f"storage.endpoint_url={s3_server.endpoint_url}",
                    "backend=skypilot", "backend.dry_run=true"], tmp_path)
    assert done.returncode == exitcodes.CONFIG_ERROR, done.stderr[-2000:]
    assert "data.path" in done.stderr and "no such object" in done.stderr


@pytest.mark.e2e
def test_data_template_and_model_from_s3_train_on_moto(s3_server, s3_bucket, tmp_path):
    bucket = s3_bucket.split("/")[2]
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    _put(s3_server, f"s3://{bucket}/data/train.jsonl", _jsonl(_messages_rows(120, 7)).encode())
    _put(s3_server, f"s3://{bucket}/data/chat.jinja", TEMPLATE.encode())
    _upload_folder(s3_server, _tiny_model(), f"s3://{bucket}/models/tiny/")
    args = [*SMALL, *storage.overrides(), "run.name=from-s3", "recipe=sft", "data=jsonl",
            f"data.path=s3://{bucket}/data/train.jsonl", f"data.chat_template=s3://{bucket}/data/chat.jinja",
            f"model.name_or_path=s3://{bucket}/models/tiny/"]
    done = jobs.run_job(args, tmp_path)
    assert done.returncode == exitcodes.COMPLETED, done.stderr[-4000:]
    ledger = jobs.ledger(storage, "from-s3")
    assert ledger["status"] == "completed" and ledger["attempts"][-1]["step_end"] == 12
    assert jobs.final_digest(storage, "from-s3")


@pytest.mark.e2e
def test_a_changed_data_object_is_a_changed_trajectory(s3_server, s3_bucket, tmp_path):
    bucket = s3_bucket.split("/")[2]
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    data = f"s3://{bucket}/data/{uuid.uuid4().hex[:6]}.jsonl"
    _put(s3_server, data, _jsonl(synthetic_rows("sft", 120, 7)).encode())
    args = [*SMALL, *storage.overrides(), "run.name=changed", "recipe=sft", "data=jsonl", f"data.path={data}",
            "requeue.max_failures=0"]
    crashed = jobs.run_job(args, tmp_path, env=jobs.job_env(tmp_path, {"ORCH_FAULT_AFTER_STEPS": "9"}))
    assert crashed.returncode not in (0, exitcodes.PREEMPTED), crashed.stderr[-3000:]
    assert jobs.committed_steps(storage, "changed") == [4, 8]

    _put(s3_server, data, _jsonl(synthetic_rows("sft", 120, 8)).encode())  # same key, other rows
    resumed = jobs.run_job(jobs.with_overrides(args, "requeue.max_failures=3"), tmp_path)
    assert resumed.returncode == exitcodes.CONFIG_ERROR, resumed.stderr[-3000:]
    # found when the attempt lists the object, before it downloads it (the dataset's fingerprint would refuse later)
    assert f"{data} changed since the job's first attempt" in resumed.stderr, resumed.stderr[-3000:]


@pytest.mark.e2e
def test_a_model_swapped_under_its_s3_key_between_attempts_stops_the_job(s3_server, s3_bucket, tmp_path):
    """An s3:// model swapped between attempts was resumed on silently (eval_loss 15.1 against 0.90): the first
    attempt records a digest of what it listed under the key, and a later attempt that lists others stops before
    downloading them (exit 4, never requeued), naming the input."""
    bucket = s3_bucket.split("/")[2]
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    model = f"s3://{bucket}/models/{uuid.uuid4().hex[:6]}/"
    _upload_folder(s3_server, _tiny_model(), model)
    args = [*SMALL, *storage.overrides(), "run.name=swapped", "recipe=sft", f"model.name_or_path={model}",
            "requeue.max_failures=0"]
    crashed = jobs.run_job(args, tmp_path, env=jobs.job_env(tmp_path, {"ORCH_FAULT_AFTER_STEPS": "9"}))
    assert crashed.returncode not in (0, exitcodes.PREEMPTED), crashed.stderr[-3000:]
    assert jobs.committed_steps(storage, "swapped") == [4, 8]

    config = json.loads((_tiny_model() / "config.json").read_text())
    _put(s3_server, f"{model}config.json", json.dumps(dict(config, note="another upload")).encode())
    resumed = jobs.run_job(jobs.with_overrides(args, "requeue.max_failures=3"), tmp_path)
    assert resumed.returncode == exitcodes.CONFIG_ERROR, resumed.stderr[-3000:]
    assert f"{model} changed since the job's first attempt" in resumed.stderr, resumed.stderr[-3000:]
    assert len(jobs.ledger(storage, "swapped")["attempts"]) == 2  # stopped, not requeued


def test_skypilot_file_mounts_and_mix_sources_are_given_as_the_vm_sees_them(project, tmp_path, monkeypatch, capsys):
    from orchestrator import launch
    from orchestrator.app.compose import compose_config

    datasets = tmp_path / "datasets"
    datasets.mkdir()
    (datasets / "b.jsonl").write_text(_jsonl(_messages_rows(30, 2)))
    mix = f"data.mix=[{{path: {project}/data/train.jsonl, weight: 3}}, {{path: {datasets}/b.jsonl, weight: 1}}]"
    monkeypatch.chdir(project)
    code = launch.main(["recipe=sft", "data=mix", mix, "storage.uri=s3://bucket/runs", "backend=skypilot",
                        f"+backend.extra.file_mounts={{/mnt/datasets: {datasets}}}", "backend.dry_run=true"])
    out = capsys.readouterr().out
    assert code == 0
    task = _rendered(out, "# sky jobs launch")
    assert task["file_mounts"] == {"/mnt/datasets": str(datasets)}
    assert str(project) not in task["run"] and str(datasets) not in task["run"], task["run"]
    import shlex

    worker_args = shlex.split(task["run"])[3:]
    cfg = compose_config(worker_args, launch_checks=False)  # the worker's own reading of its command
    assert [s.path for s in cfg.data.mix] == ["./data/train.jsonl", "/mnt/datasets/b.jsonl"]
    assert [s.weight for s in cfg.data.mix] == [3.0, 1.0]


def test_mix_sources_in_s3_are_read_through_the_jobs_storage_settings(s3_server, s3_bucket, tmp_path, monkeypatch):
    from orchestrator.storage import inputs
    from orchestrator.app.compose import compose_config
    from recipes.data import load_datasets

    bucket = s3_bucket.split("/")[2]
    for name, seed in (("a", 1), ("b", 2)):
        _put(s3_server, f"s3://{bucket}/mix/{name}.jsonl", _jsonl(synthetic_rows("sft", 40, seed)).encode())
    cfg = compose_config(["recipe=sft", "data=mix", f"storage.uri={s3_bucket}",
                          f"storage.endpoint_url={s3_server.endpoint_url}",
                          f"data.mix=[{{path: 's3://{bucket}/mix/a.jsonl', weight: 1}}, "
                          f"{{path: 's3://{bucket}/mix/b.jsonl', weight: 1}}]"])  # launch checks list them
    monkeypatch.setitem(inputs._ACTIVE, "files", None)
    inputs.use(cfg.storage, tmp_path / "inputs")
    train, held_out = load_datasets(cfg.data, "sft")
    assert len(train) + len(held_out) > 40
    assert sorted(p.name for p in (tmp_path / "inputs").rglob("*.jsonl")) == ["a.jsonl", "b.jsonl"]


def test_trls_training_templates_pass_the_launch_check():
    from recipes.data import check_chat_template

    check_chat_template("llama3_training")  # {% generation %}: transformers' own tag, which plain Jinja refuses
    check_chat_template("qwen2_5_training")


def test_an_s3_template_that_is_not_jinja_stops_the_attempt_with_the_fix(s3_server, s3_bucket, tmp_path, monkeypatch):
    from orchestrator.storage import inputs
    from orchestrator.storage.inputs import InputFiles
    from recipes.data import chat_template_text

    bucket = s3_bucket.split("/")[2]
    _put(s3_server, f"s3://{bucket}/t/bad.jinja", b"{% for m in messages %}{{ m }")
    monkeypatch.setitem(inputs._ACTIVE, "files", InputFiles(_storage_cfg(s3_server), tmp_path / "inputs"))
    with pytest.raises(DataError, match="is not valid Jinja"):
        chat_template_text(f"s3://{bucket}/t/bad.jinja")
