"""Storage is not trusted: manifest paths are checked before any download, pickles never run code.

Fast tests without a training job; the whole-job proof is tests/e2e/test_tampered_bucket.py.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from orchestrator.checkpoint import manifest as mf
from orchestrator.checkpoint import safe_load
from orchestrator.checkpoint.ref_logps import RefLogProbStore
from orchestrator.checkpoint.store import CheckpointStore
from orchestrator.storage import LocalStore

GOOD_PATHS = ["adapter_model.safetensors", "global_step8/mp_rank_00_model_states.pt", "a/b/c.json", "latest",
              "file..with..dots", ".hidden"]
BAD_PATHS = {
    "../../x": "climbs out with '..'",
    "a/../../x": "climbs out with '..'",
    "..": "climbs out with '..'",
    "/etc/x": "absolute",
    "//server/share": "absolute",
    "C:/Windows/x": "absolute",
    "": "not a non-empty string",
    "a//b": "an empty or '.' part",
    "a/": "an empty or '.' part",
    "./a": "an empty or '.' part",
    "a\\..\\..\\x": "contains a backslash",
    "a\x00b": "contains a control character",
    "a\nb": "contains a control character",
}


@pytest.mark.parametrize("path", GOOD_PATHS)
def test_safe_paths_pass(path):
    assert mf.check_path(path) == path


@pytest.mark.parametrize("path,why", list(BAD_PATHS.items()))
def test_unsafe_paths_are_refused_with_the_path_and_why(path, why):
    with pytest.raises(mf.CorruptCheckpoint) as err:
        mf.check_path(path)
    assert repr(path) in str(err.value) and why in str(err.value)


@pytest.mark.parametrize("path", [None, 3, ["a"]])
def test_a_path_that_is_not_a_string_is_refused(path):
    with pytest.raises(mf.CorruptCheckpoint, match="unsafe path"):
        mf.check_path(path)


def _manifest(files: list[dict]) -> bytes:
    return json.dumps({"version": mf.MANIFEST_VERSION, "files": files, "step": 1, "fence": 1}).encode()


def _entry(path: str, data: bytes = b"x") -> dict:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize("entry,message", [
    (_entry("../../x"), "unsafe path '../../x'"),
    (_entry("/etc/passwd"), "unsafe path '/etc/passwd' (absolute)"),
    ({"path": "a", "size": -1, "sha256": "0" * 64}, "invalid size"),
    ({"path": "a", "size": 1, "sha256": "not-hex"}, "invalid SHA-256"),
    (_entry("manifest.json"), "lists itself"),
    ("a-string", "not an object"),
])
def test_loads_refuses_a_manifest_with_a_bad_entry(entry, message):
    with pytest.raises(mf.CorruptCheckpoint, match=message.replace("(", r"\(").replace(")", r"\)")):
        mf.loads(_manifest([_entry("ok.json"), entry]))


@pytest.mark.parametrize("field,value", [("fence", "1"), ("fence", 1.5), ("fence", None), ("step", -3), ("step", True)])
def test_loads_refuses_a_manifest_whose_step_or_fence_is_not_a_count(field, value):
    """They name the checkpoint's folder (``%09d-%04d``): a tampered one is a corrupt checkpoint, not a crash."""
    doc = json.loads(_manifest([_entry("ok.json")]))
    doc[field] = value
    with pytest.raises(mf.CorruptCheckpoint, match=f"the manifest's {field} is"):
        mf.loads(json.dumps(doc).encode())


def test_loads_refuses_a_listed_path_twice_and_garbage():
    with pytest.raises(mf.CorruptCheckpoint, match="twice"):
        mf.loads(_manifest([_entry("a"), _entry("a")]))
    with pytest.raises(mf.CorruptCheckpoint, match="not valid JSON"):
        mf.loads(b"\xff{")
    with pytest.raises(mf.CorruptCheckpoint, match="not one this version writes"):
        mf.loads(b"[]")


def test_safe_join_refuses_a_symlink_leading_out(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (folder / "link").symlink_to(tmp_path / "elsewhere")
    assert mf.safe_join(folder, "sub/file.pt") == folder / "sub" / "file.pt"
    with pytest.raises(mf.CorruptCheckpoint, match="leads out of the checkpoint folder"):
        mf.safe_join(folder, "link/file.pt")


# ---- restore against a real store: the climbing entry is never downloaded -------------------------

def _put_checkpoint(store, name: str, files: dict[str, bytes], extra_entries: list[dict] = ()) -> None:
    prefix = f"job/checkpoints/{name}/"
    for path, data in files.items():
        store.put_bytes(prefix + path, data)
    entries = [_entry(p, d) for p, d in files.items()] + list(extra_entries)
    store.put_bytes(prefix + "manifest.json", _manifest(entries))


@pytest.fixture(params=["local", "s3"])
def any_store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return request.getfixturevalue("s3_store")


def test_restore_skips_a_manifest_with_a_climbing_path_and_writes_nothing_outside(any_store, tmp_path, caplog):
    outside = tmp_path / "outside"
    outside.mkdir()
    climb = "../" * 40 + str(outside / "climbed").lstrip("/")
    absolute = str(outside / "absolute")
    _put_checkpoint(any_store, "000000004-0001", {"state.json": b"older"})
    evil = b"planted by a bucket writer"
    if not isinstance(any_store, LocalStore):  # S3 keys may hold '..' and '//': put the objects there
        any_store.put_bytes(f"job/checkpoints/000000008-0001/{climb}", evil)
        any_store.put_bytes(f"job/checkpoints/000000008-0001/{absolute}", evil)
    _put_checkpoint(any_store, "000000008-0001", {"state.json": b"newer"}, [_entry(climb, evil), _entry(absolute, evil)])

    checkpoints = CheckpointStore(any_store, "job", staging_dir=tmp_path / "staging")
    with caplog.at_level(logging.WARNING, logger="orchestrator.checkpoint"):
        local, manifest = checkpoints.restore_latest(tmp_path / "restore")
    assert manifest["step"] == 1 and local.name == "000000004-0001"
    assert (local / "state.json").read_bytes() == b"older"
    assert list(outside.iterdir()) == []
    assert any("000000008-0001" in r.message and repr(climb) in r.message for r in caplog.records), caplog.text


def test_restore_says_when_no_checkpoint_is_usable(tmp_path, caplog):
    store = LocalStore(tmp_path / "store")
    _put_checkpoint(store, "000000004-0001", {"state.json": b"x"}, [_entry("/etc/passwd")])
    with caplog.at_level(logging.WARNING, logger="orchestrator.checkpoint"):
        assert CheckpointStore(store, "job", staging_dir=tmp_path / "s").restore_latest(tmp_path / "r") == (None, None)
    assert "none of the 1 committed checkpoints is usable; training starts from scratch" in caplog.text


# ---- pickles --------------------------------------------------------------------------------------

class RunsCommand:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _save(obj, path: Path) -> Path:
    import torch

    torch.save(obj, path)
    return path


def test_a_pickle_that_runs_a_command_is_refused_without_running(tmp_path):
    marker = tmp_path / "ran"
    evil = _save({"x": RunsCommand(f"touch {marker}")}, tmp_path / "optimizer.pt")
    with pytest.raises(mf.CorruptCheckpoint, match="optimizer.pt is refused: it needs posix.system"):
        safe_load.load_torch_file(evil, deepspeed=True, mmap=True)
    assert not marker.exists()


def test_deepspeeds_own_weights_only_false_load_is_forced_safe(tmp_path):
    """DeepSpeed's TorchCheckpointEngine.load passes weights_only=False; inside the guard it cannot run code."""
    import pickle

    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    marker = tmp_path / "ran"
    evil = _save({"x": RunsCommand(f"touch {marker}")}, tmp_path / "mp_rank_00_model_states.pt")
    engine = TorchCheckpointEngine()
    with safe_load.no_code_from_storage():
        with pytest.raises(pickle.UnpicklingError):
            engine.load(str(evil), map_location="cpu")
    assert not marker.exists()
    assert safe_load.FORCE_WEIGHTS_ONLY_VARIABLE not in os.environ  # the switch is off again afterwards


def test_the_classes_deepspeed_and_the_trainer_store_are_allowed(tmp_path):
    """What a ZeRO optimizer state and the Trainer's RNG state hold loads under the guard, and nothing more."""
    import numpy as np
    import torch
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    dynamic = DynamicLossScaler(init_scale=2.0**8, scale_window=1000, min_scale=1, delayed_shift=2,
                                consecutive_hysteresis=False, dtype=torch.half)
    state = {"loss_scaler": LossScaler(scale=1.0), "dynamic": dynamic, "zero_stage": ZeroStageEnum.gradients,
             "param_slice_mappings": [{"w": fragment_address(numel=4, start=0)}],
             "rng": np.random.get_state(), "t": torch.ones(3)}
    path = _save(state, tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with safe_load.no_code_from_storage():
        loaded = TorchCheckpointEngine().load(str(path), map_location="cpu")
    assert loaded["zero_stage"] is ZeroStageEnum.gradients and loaded["param_slice_mappings"][0]["w"].numel == 4
    assert loaded["loss_scaler"].cur_scale == 1.0 and loaded["dynamic"].cur_scale == 2.0**8
    assert safe_load.load_torch_file(path, deepspeed=True, mmap=True)["rng"][0] == "MT19937"
    with pytest.raises(mf.CorruptCheckpoint, match="LossScaler"):  # without DeepSpeed's classes: refused
        safe_load.load_torch_file(path, deepspeed=False)


def _folder_with(tmp_path: Path, files: dict[str, bytes]) -> tuple[Path, dict]:
    folder = tmp_path / "ckpt"
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder, mf.build_manifest(folder, run_name="job", step=1, fence=1, meta={})


@pytest.mark.parametrize("tag,why", [("../../elsewhere", "unsafe folder"), ("global_step9", "not a folder of this")])
def test_deepspeeds_latest_must_name_a_folder_of_the_checkpoint(tmp_path, tag, why):
    folder, manifest = _folder_with(tmp_path, {"latest": tag.encode(), "global_step4/x.json": b"{}"})
    with pytest.raises(mf.CorruptCheckpoint, match=why):
        safe_load.check_restorable(folder, manifest)


def test_training_args_are_never_unpickled(tmp_path):
    """The Trainer never loads training_args.bin on resume, so it is hash-checked only, whatever it holds."""
    marker = tmp_path / "ran"
    folder, manifest = _folder_with(tmp_path, {"latest": b"global_step4", "global_step4/x.json": b"{}"})
    _save({"x": RunsCommand(f"touch {marker}")}, folder / "training_args.bin")
    _save({"t": 1}, folder / "scheduler.pt")
    manifest = mf.build_manifest(folder, run_name="job", step=1, fence=1, meta={})
    assert safe_load.check_restorable(folder, manifest) == 1
    assert not marker.exists()



def test_a_deepspeed_runs_background_restore_imports_nothing_in_its_thread(tmp_path, monkeypatch):
    """The model's load imports DeepSpeed while the checkpoint downloads; a second thread importing it meanwhile
    deadlocks in the import system (a sound ZeRO checkpoint was refused for a half-imported loss_scaler)."""
    import threading

    from deepspeed.runtime.fp16.loss_scaler import LossScaler

    from orchestrator.attempt.checkpoints import BackgroundRestore

    resolved_in = []
    real = safe_load.allowed_globals

    def recording(**kw):
        resolved_in.append(threading.current_thread().name)
        return real(**kw)

    monkeypatch.setattr(safe_load, "allowed_globals", recording)
    folder = tmp_path / "trainer-8"
    (folder / "global_step8").mkdir(parents=True)
    (folder / "latest").write_text("global_step8")
    _save({"loss_scaler": LossScaler(scale=1.0)}, folder / "global_step8" / "optim_states.pt")
    checkpoints = CheckpointStore(LocalStore(tmp_path / "store"), "job", staging_dir=tmp_path / "staging")
    checkpoints.commit_async(folder, step=8, fence=1, meta={}, may_commit=lambda: None,
                             on_committed=lambda result, manifest: None)
    checkpoints.wait()
    checkpoints.close()

    local, manifest = BackgroundRestore(checkpoints, tmp_path / "restore", deepspeed=True).start().result()
    assert manifest["step"] == 8 and (local / "latest").read_text() == "global_step8"
    assert resolved_in == [threading.current_thread().name]  # once, by the caller, before the thread started

# ---- optional signing (ORCH_MANIFEST_HMAC_KEY) -----------------------------------------------------

def _commit(store, tmp_path: Path, step: int, data: bytes) -> str:
    """A real commit through CheckpointStore (so the manifest is written, and signed, as a job writes it)."""
    folder = tmp_path / f"trainer-{step}"
    folder.mkdir()
    (folder / "state.json").write_bytes(data)
    checkpoints = CheckpointStore(store, "job", staging_dir=tmp_path / "staging")
    name = checkpoints.commit_async(folder, step=step, fence=1, meta={}, may_commit=lambda: None,
                                    on_committed=lambda result, manifest: None)
    checkpoints.wait()
    checkpoints.close()
    assert checkpoints.results[-1].ok, checkpoints.results
    return name


def test_with_a_key_a_re_hashed_manifest_is_refused_and_the_previous_one_restored(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(mf.SIGNING_KEY_VARIABLE, "k" * 32)
    store = LocalStore(tmp_path / "store")
    older = _commit(store, tmp_path, 4, b"older")
    newer = _commit(store, tmp_path, 8, b"newer")
    # a bucket writer replaces a file and fixes its hash, but cannot sign
    key = f"job/checkpoints/{newer}/manifest.json"
    manifest = json.loads(store.get_bytes(key))
    store.put_bytes(f"job/checkpoints/{newer}/state.json", b"replaced")
    manifest["files"] = [_entry("state.json", b"replaced")]
    store.put_bytes(key, json.dumps(manifest).encode())

    with caplog.at_level(logging.WARNING, logger="orchestrator.checkpoint"):
        local, _ = CheckpointStore(store, "job", staging_dir=tmp_path / "s").restore_latest(tmp_path / "restore")
    assert local.name == older and (local / "state.json").read_bytes() == b"older"
    assert f"checkpoint {newer} is unusable (the manifest's signature does not match" in caplog.text


def test_with_a_key_unsigned_and_foreign_manifests_are_refused_without_one_ignored(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "store")
    unsigned = json.loads(store.get_bytes(f"job/checkpoints/{_commit(store, tmp_path, 4, b'x')}/manifest.json"))
    assert "signature" not in unsigned
    monkeypatch.setenv(mf.SIGNING_KEY_VARIABLE, "one key")
    with pytest.raises(mf.CorruptCheckpoint, match=f"not signed, and {mf.SIGNING_KEY_VARIABLE} is set"):
        mf.loads(json.dumps(unsigned).encode())
    signed = mf.dumps(unsigned)
    assert mf.loads(signed)["files"] == unsigned["files"]
    monkeypatch.setenv(mf.SIGNING_KEY_VARIABLE, "another key")
    with pytest.raises(mf.CorruptCheckpoint, match="signature does not match"):
        mf.loads(signed)
    monkeypatch.delenv(mf.SIGNING_KEY_VARIABLE)
    assert mf.loads(signed)["step"] == 4  # no key here: the signature is not checked


# ---- DPO's stored reference log-probabilities ------------------------------------------------------

GOOD_LOGPS = {"ref_chosen_logps": np.array([-1.5, -2.25, -3.0], np.float32),
              "ref_rejected_logps": np.array([-4.0, -5.5, 0.0], np.float32)}


def _ref_store(tmp_path: Path, run: str = "job") -> RefLogProbStore:
    checkpoints = CheckpointStore(LocalStore(tmp_path / "store"), run, staging_dir=tmp_path / f"staging-{run}")
    return RefLogProbStore(checkpoints, work=tmp_path / f"work-{run}", main=True, trajectory={"t": 1})


def _ref_key(store: RefLogProbStore, data: str = "d") -> str:
    return store.key(split="train", data_fingerprint=data, model_fingerprint="m", batch_size=8)


NOT_LOGPS = "values that are not log-probabilities (finite and at most 0), e.g."


@pytest.mark.parametrize("bad,why", [
    (np.array([-1.0, np.nan, -2.0], np.float32), f"hold 1 {NOT_LOGPS} nan"),
    (np.array([-np.inf, -1.0, -2.0], np.float32), f"hold 1 {NOT_LOGPS} -inf"),
    (np.array([-1.0, 0.5, 3.0], np.float64), f"hold 2 {NOT_LOGPS} 0.5"),
    (np.array([-1, -2, -3], np.int64), "are int64, not floating-point log-probabilities"),
])
def test_stored_reference_log_probs_that_are_not_log_probabilities_are_refused(tmp_path, caplog, bad, why):
    store = _ref_store(tmp_path)
    key = _ref_key(store)
    # written with matching sizes, hashes (and, with a key, a signature): only the values say they are wrong
    store.save(key, dict(GOOD_LOGPS, ref_rejected_logps=bad))
    with caplog.at_level(logging.WARNING, logger="orchestrator.checkpoint"):
        assert store.load(key, rows=3) is None
    assert "are unusable" in caplog.text and f"ref_rejected_logps {why}" in caplog.text, caplog.text
    store.save(key, GOOD_LOGPS)  # what the attempt does after computing them again: the bad entry is replaced
    assert np.array_equal(store.load(key, rows=3)["ref_rejected_logps"], GOOD_LOGPS["ref_rejected_logps"])


def test_with_a_key_signed_log_probs_of_another_key_or_job_are_refused(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(mf.SIGNING_KEY_VARIABLE, "a key shared by the job's machines")
    raw = LocalStore(tmp_path / "store")
    ours, other_job = _ref_store(tmp_path), _ref_store(tmp_path, "other")
    key, other_key = _ref_key(ours), _ref_key(ours, "another data set")
    ours.save(other_key, GOOD_LOGPS)
    other_job.save(key, GOOD_LOGPS)
    copies = {f"job/ref_log_probs/{other_key}/": "another key", f"other/ref_log_probs/{key}/": "another job"}
    for source, what in copies.items():
        for name in raw.list(source):
            raw.put_bytes(f"job/ref_log_probs/{key}/" + name[len(source):], raw.get_bytes(name))
        assert mf.loads(raw.get_bytes(f"job/ref_log_probs/{key}/manifest.json"))  # signed: the signature holds
        with caplog.at_level(logging.WARNING, logger="orchestrator.checkpoint"):
            assert ours.load(key, rows=3) is None, what
        assert "its manifest is that of job" in caplog.text and f"not of job 'job', key {key[:12]!r}" in caplog.text
        caplog.clear()
    ours.save(key, GOOD_LOGPS)
    assert ours.load(key, rows=3) is not None
