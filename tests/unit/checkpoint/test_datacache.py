"""The prepared-dataset cache: what it is keyed by, and that a tampered copy in storage is never read.

A bad entry (a manifest that does not parse, is unsigned once a key is set, belongs to another key; files
that do not match; a state.json naming files outside; token ids past the vocabulary) is reported, the data
tokenised again, and the new set replaces it. The whole-job proofs run real jobs on moto's S3 server.
"""
from __future__ import annotations

import hashlib
import json
import logging

import pytest

from orchestrator.attempt.datacache import PREFIX, PreparedDataCache, cache_key, cache_wanted
from orchestrator.checkpoint import manifest as mf
from orchestrator.checkpoint.store import CheckpointStore
from orchestrator.app.compose import compose_config
from orchestrator.storage import LocalStore
from tests.helpers import jobs

VOCAB = 100
SPLITS = ("train", "eval")


def _cache(tmp_path, name: str = "w"):
    store = LocalStore(tmp_path / "store")
    cache = PreparedDataCache(CheckpointStore(store, "job", staging_dir=tmp_path / "staging"), work=tmp_path / name)
    # the key and the vocabulary's size, as _key would have taken them from the config and the tokenizer
    cache._keys["fp"], cache._vocab["fp"] = "k", VOCAB
    return store, cache


def _sets(top: int = 10):
    from datasets import Dataset, DatasetDict

    rows = Dataset.from_list([{"input_ids": [1, 2, top - 8 + i], "labels": [-100, 2, top - 8 + i]} for i in range(8)])
    return DatasetDict({"train": rows, "eval": rows.select(range(2))})


def _rewrite(store, prefix: str, path: str, data: bytes) -> None:
    """Put ``data`` at ``prefix + path`` and fix the manifest's size and hash to match, as a bucket writer can."""
    manifest = json.loads(store.get_bytes(prefix + mf.MANIFEST_NAME))
    entries = {e["path"]: e for e in manifest["files"]}
    entries[path] = {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest["files"] = list(entries.values())
    store.put_bytes(prefix + path, data)
    store.put_bytes(prefix + mf.MANIFEST_NAME, json.dumps(manifest).encode())


def _refused_then_replaced(store, cache, caplog, why: str) -> None:
    """The entry is refused with ``why`` in the warning; the set this attempt prepares replaces it and loads."""
    with caplog.at_level(logging.WARNING, logger="orchestrator.worker"):
        assert cache.load(None, "fp", splits=SPLITS) is None and cache.hit is False
    assert "is unusable" in caplog.text and why in caplog.text, caplog.text
    cache._save("k", _sets())  # what save_later does with the trainer's sets, in its thread
    assert cache.load(None, "fp", splits=SPLITS)["train"]["input_ids"] == _sets()["train"]["input_ids"]
    assert cache.hit is True


def test_a_saved_set_loads_back_and_a_flipped_byte_is_refused_before_it_is_read(tmp_path):
    from datasets import Dataset, DatasetDict

    store, cache = _cache(tmp_path)
    rows = Dataset.from_list([{"input_ids": [1, 2, 3 + i], "labels": [-100, 2, 3 + i]} for i in range(8)])
    cache._save("k", DatasetDict({"train": rows, "eval": rows.select(range(2))}))
    loaded = cache.load(None, "fp", splits=SPLITS)
    assert loaded["train"]["input_ids"] == rows["input_ids"] and len(loaded["eval"]) == 2 and cache.hit is True
    arrow = next(k for k in store.list("_prepared/k/") if k.endswith(".arrow"))
    data = bytearray(store.get_bytes(arrow))
    data[len(data) // 2] ^= 0x01
    store.put_bytes(arrow, bytes(data))
    assert cache.load(None, "fp", splits=SPLITS) is None and cache.hit is False  # tokenise again instead


def test_the_key_follows_the_data_the_tokenizer_the_length_and_packing_and_only_sft_is_cached():
    from recipes.common import load_tokenizer, resolve_model_path

    cfg = compose_config(["recipe=sft"])
    tokenizer = load_tokenizer(resolve_model_path(cfg.model))
    key = cache_key(cfg, "data-a", tokenizer)
    assert key == cache_key(cfg, "data-a", tokenizer)
    assert key != cache_key(cfg, "data-b", tokenizer)
    assert key != cache_key(compose_config(["recipe=sft", "data.max_length=32"]), "data-a", tokenizer)
    # a packed set is another set: a packed job must not take an unpacked job's rows, nor one packed otherwise
    packed = cache_key(compose_config(["recipe=sft", "train.packing=true"]), "data-a", tokenizer)
    assert key != packed != cache_key(compose_config(["recipe=sft", "train.packing=true",
                                                      "train.packing_strategy=wrapped"]), "data-a", tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<extra>"]})
    assert key != cache_key(cfg, "data-a", tokenizer)
    assert cache_wanted(cfg) and cache_wanted(compose_config(["recipe=qlora"]))
    assert not cache_wanted(compose_config(["recipe=dpo"]))
    assert not cache_wanted(compose_config(["recipe=sft", "data.prepared_cache=false"]))
    assert not cache_wanted(compose_config(["recipe=sft", "distributed=ddp"]))


def test_an_entry_refused_for_a_changed_byte_is_replaced_by_the_rebuilt_set(tmp_path, caplog):
    store, cache = _cache(tmp_path)
    cache._save("k", _sets())
    arrow = next(k for k in store.list("_prepared/k/") if k.endswith(".arrow"))
    store.put_bytes(arrow, store.get_bytes(arrow)[:-8])  # truncated
    _refused_then_replaced(store, cache, caplog, "truncated")


@pytest.mark.parametrize("manifest,why", [
    (b'{"version": 1, "files": [', "not valid JSON"),
    (json.dumps({"version": 1, "files": [{"path": "../../x", "size": 1, "sha256": "0" * 64}]}).encode(),
     "unsafe path '../../x'"),
])
def test_a_manifest_that_does_not_parse_is_reported_skipped_and_replaced(tmp_path, caplog, manifest, why):
    store, cache = _cache(tmp_path)
    cache._save("k", _sets())
    store.put_bytes("_prepared/k/manifest.json", manifest)
    _refused_then_replaced(store, cache, caplog, why)


def test_turning_signing_on_rebuilds_an_unsigned_entry_once_and_signs_it(tmp_path, caplog, monkeypatch):
    store, cache = _cache(tmp_path)
    cache._save("k", _sets())  # written before the key was set
    monkeypatch.setenv(mf.SIGNING_KEY_VARIABLE, "a key shared by the job's machines")
    _refused_then_replaced(store, cache, caplog, "not signed")
    assert "signature" in json.loads(store.get_bytes("_prepared/k/manifest.json"))


def test_a_signed_entry_of_another_key_is_refused(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv(mf.SIGNING_KEY_VARIABLE, "a key shared by the job's machines")
    store, cache = _cache(tmp_path)
    cache._save("other", _sets(top=50))  # another data set's entry, signed with the same key
    for key in store.list("_prepared/other/"):
        store.put_bytes(key.replace("_prepared/other/", "_prepared/k/"), store.get_bytes(key))
    assert mf.loads(store.get_bytes("_prepared/k/manifest.json"))  # the copy's signature holds
    _refused_then_replaced(store, cache, caplog, "that of the prepared set 'other', not 'k'")


def test_a_state_json_naming_a_file_outside_the_entry_is_refused_before_loading(tmp_path, caplog):
    store, cache = _cache(tmp_path)
    cache._save("k", _sets())
    # a valid Arrow file outside the entry's folder, with other rows, that load_from_disk would open
    outside = tmp_path / "outside"
    _sets(top=90).save_to_disk(str(outside))
    arrow = next((outside / "train").glob("*.arrow"))
    state = json.loads(store.get_bytes("_prepared/k/train/state.json"))
    state["_data_files"] = [{"filename": "../" * 12 + str(arrow).lstrip("/")}]
    _rewrite(store, "_prepared/k/", "train/state.json", json.dumps(state).encode())
    _refused_then_replaced(store, cache, caplog, "train/state.json names an unsafe path")


def test_a_state_json_naming_a_file_the_manifest_does_not_list_is_refused(tmp_path, caplog):
    store, cache = _cache(tmp_path)
    cache._save("k", _sets())
    state = json.loads(store.get_bytes("_prepared/k/train/state.json"))
    state["_data_files"] = [{"filename": "extra.arrow"}, *state["_data_files"]]
    _rewrite(store, "_prepared/k/", "train/state.json", json.dumps(state).encode())
    _refused_then_replaced(store, cache, caplog, "names 'train/extra.arrow', a file the manifest does not list")


@pytest.mark.parametrize("top", [VOCAB + 5, VOCAB])
def test_token_ids_past_the_vocabulary_are_refused_and_the_set_rebuilt(tmp_path, caplog, top):
    store, cache = _cache(tmp_path)
    cache._save("k", _sets(top=top + 1))  # written by someone, hashes and all: ids up to top
    _refused_then_replaced(store, cache, caplog, f"input_ids hold token ids from 1 to {top}, outside the "
                                                 f"tokenizer's vocabulary (0 to {VOCAB - 1})")


def test_negative_labels_other_than_the_ignored_index_are_refused(tmp_path, caplog):
    from datasets import Dataset, DatasetDict

    store, cache = _cache(tmp_path)
    rows = Dataset.from_list([{"input_ids": [1, 2, 3], "labels": [-100, -7, 3]}] * 4)
    cache._save("k", DatasetDict({"train": rows, "eval": rows}))
    _refused_then_replaced(store, cache, caplog, "labels hold token ids from -7 to 3")


def _run(base: list[str], name: str, tmp_path, **env) -> tuple[int, str]:
    """One uninterrupted job: no floor under its steps (nothing interrupts it mid-run)."""
    env = {"ORCH_STEP_DELAY_SECONDS": "0", **env}
    done = jobs.run_job(base + [f"run.name={name}"], tmp_path, env=jobs.job_env(tmp_path, env))
    return done.returncode, done.stdout + done.stderr


@pytest.mark.e2e
def test_jobs_on_a_bad_then_unsigned_cache_entry_complete_and_replace_it(s3_server, s3_bucket, tmp_path, monkeypatch):
    """Real SFT jobs with the same data on moto's S3 server: the first saves the prepared set; a manifest with a
    climbing path, then signing turned on, each cost the next job one tokenisation (it completes and replaces
    the entry), never a crash; the job after that trains from the signed entry."""
    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    base = jobs.with_overrides(jobs.FAST, "recipe=sft") + storage.overrides()
    rc, log = _run(base, "first", tmp_path)
    assert rc == 0, log[-3000:]
    store = storage.store()
    manifests = [k for k in store.list(PREFIX) if k.endswith("/" + mf.MANIFEST_NAME)]
    assert len(manifests) == 1, manifests
    store.put_bytes(manifests[0], json.dumps({"version": 1, "files": [
        {"path": "../../../etc/x", "size": 1, "sha256": "0" * 64}]}).encode())

    rc, log = _run(base, "second", tmp_path)
    assert rc == 0, log[-3000:]
    assert "is unusable" in log and "unsafe path '../../../etc/x'" in log, log[-3000:]
    assert "train" in {e["path"].split("/")[0] for e in mf.loads(store.get_bytes(manifests[0]))["files"]}

    key = {mf.SIGNING_KEY_VARIABLE: "a key shared by the job's machines"}
    rc, log = _run(base, "third", tmp_path, **key)
    assert rc == 0, log[-3000:]
    assert "is unusable" in log and "not signed" in log, log[-3000:]
    monkeypatch.setenv(mf.SIGNING_KEY_VARIABLE, key[mf.SIGNING_KEY_VARIABLE])
    mf.loads(store.get_bytes(manifests[0]))  # signed now

    rc, log = _run(base, "fourth", tmp_path, **key)
    assert rc == 0, log[-3000:]
    assert "prepared training set from" in log and "is unusable" not in log, log[-3000:]


@pytest.mark.e2e
def test_a_dpo_job_whose_stored_reference_log_probs_turned_nan_computes_them_again(s3_server, s3_bucket, tmp_path):
    """A real DPO job on moto's S3 server stores its reference log-probs and is killed; a bucket writer replaces
    them with NaN arrays of the same shape (hashes fixed). The relaunched job refuses them, computes them again,
    completes, and its final weights are finite."""
    import numpy as np
    from safetensors.numpy import load, save

    storage = jobs.Storage(s3_bucket, s3_server.endpoint_url)
    run = "dpo-nan"
    overrides = jobs.with_overrides(jobs.FAST, "recipe=dpo", "recipe.precompute_ref_log_probs=true") + \
        storage.overrides() + [f"run.name={run}"]
    proc = jobs.start_job(overrides, tmp_path)
    try:
        jobs.wait_for_new_checkpoint(storage, run, proc, 0)
    finally:
        jobs.kill_group(proc)
    store = storage.store()
    manifests = [k for k in store.list(f"{run}/ref_log_probs/") if k.endswith("/" + mf.MANIFEST_NAME)]
    assert manifests, store.list(f"{run}/")
    for key in manifests:
        prefix = key[: -len(mf.MANIFEST_NAME)]
        arrays = load(store.get_bytes(prefix + "ref_logps.safetensors"))
        _rewrite(store, prefix, "ref_logps.safetensors", save({k: np.full_like(v, np.nan) for k, v in arrays.items()}))

    done = jobs.run_job(overrides, tmp_path)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "are unusable (its ref_chosen_logps hold" in log and "not log-probabilities" in log, log[-4000:]
    assert "reference log-probs of the train split computed" in log, log[-4000:]
    assert jobs.ledger(storage, run)["status"] == "completed"
    final = json.loads(store.get_bytes(f"{run}/final/{mf.MANIFEST_NAME}"))
    weights = [load(store.get_bytes(f"{run}/final/{f['path']}")) for f in final["files"]
               if f["path"].endswith(".safetensors")]
    assert weights and all(np.isfinite(t).all() for w in weights for t in w.values())
