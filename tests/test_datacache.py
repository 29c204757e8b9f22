"""The prepared-dataset cache: what it is keyed by, and that a tampered copy in storage is never read."""
from __future__ import annotations

import pytest
from orchestrator.attempt.datacache import PreparedDataCache, cache_key, cache_wanted
from orchestrator.checkpoint.store import CheckpointStore
from orchestrator.compose import compose_config
from orchestrator.storage import LocalStore


def _cache(tmp_path):
    store = LocalStore(tmp_path / "store")
    return store, PreparedDataCache(CheckpointStore(store, "job", staging_dir=tmp_path / "staging"), work=tmp_path / "w")


def test_a_saved_set_loads_back_and_a_flipped_byte_is_refused_before_it_is_read(tmp_path):
    from datasets import Dataset, DatasetDict

    store, cache = _cache(tmp_path)
    cache._keys["fp"] = "k"  # the key, as _key would have made it from the config and the tokenizer
    rows = Dataset.from_list([{"input_ids": [1, 2, 3 + i], "labels": [-100, 2, 3 + i]} for i in range(8)])
    cache._save("k", DatasetDict({"train": rows, "eval": rows.select(range(2))}))
    loaded = cache.load(None, "fp")
    assert loaded["train"]["input_ids"] == rows["input_ids"] and len(loaded["eval"]) == 2 and cache.hit is True
    arrow = next(k for k in store.list("_prepared/k/") if k.endswith(".arrow"))
    data = bytearray(store.get_bytes(arrow))
    data[len(data) // 2] ^= 0x01
    store.put_bytes(arrow, bytes(data))
    assert cache.load(None, "fp") is None and cache.hit is False  # tokenise again instead


@pytest.mark.e2e
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
