"""Prepared (tokenised) training sets kept in storage, so a restart does not tokenise again.

TRL's SFTTrainer prepares its datasets in its constructor: tokenise, build labels, truncate, and
with ``train.packing`` pack. Only the tokenising is skipped for rows that already have ``input_ids``;
a packed set handed in again would be packed a second time (its ``seq_lengths`` dropped, its rows
binned anew: other batches, other weights). So the cache keeps the trainer's finished sets, the
training set and the held-out one (``DatasetDict.save_to_disk``: Arrow files and JSON, no pickle),
and a restart hands them back with TRL's ``dataset_kwargs={"skip_prepare_dataset": True}``: TRL
does nothing to them, and the rows are those the first attempt trained on. The first attempt saves them under
``<storage.uri>/_prepared/<key>/`` through the checkpoint store's commit protocol (files,
then a manifest with every SHA-256, last); a later attempt, of this job or another with the
same data, downloads it, verifies every hash against the manifest before anything is read,
and hands them to the recipe (``prepared=``) beside the raw rows (the generation metric reads those).
Storage is untrusted (docs/trust.md, "Cached data"): the manifest must parse (signed, with
``ORCH_MANIFEST_HMAC_KEY``) and be this key's, the files ``load_from_disk`` opens by the names in the
entry's JSON must be the manifest's, and the token ids must be the tokenizer's; an entry failing any of it
is reported, the data tokenised again, and the new set replaces it.

The key hashes everything that shapes the prepared rows: the datasets' fingerprints (their rows,
in order: training and held-out), the tokenizer (vocabulary and merges, special tokens, chat template, class), the
recipe (its name and the source of the recipe modules, where the trainer's options are set),
``data.max_length``, ``train.packing``/``packing_strategy``/``padding_free``, and the versions of TRL, transformers, tokenizers and datasets.

SFT only (``recipe=sft`` and ``recipe=qlora``): DPOTrainer tokenises every dataset it is given,
prepared or not. Off for distributed jobs (each rank prepares its own copy) and with
``data.prepared_cache=false``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import shutil
import threading
from pathlib import Path
from typing import Any, Optional

from orchestrator.checkpoint import manifest as mf

log = logging.getLogger(__name__)

PREFIX = "_prepared/"
CACHED_RECIPES = ("sft", "qlora")


def cache_wanted(cfg: Any) -> bool:
    return bool(cfg.data.prepared_cache) and cfg.recipe.name in CACHED_RECIPES and cfg.distributed.name == "none"


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 of what decides a tokenizer's output: its class, vocabulary and merges, special tokens, template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    parts = {
        "class": type(tokenizer).__name__,
        "backend": backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True),
        "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
        "chat_template": getattr(tokenizer, "chat_template", None),
        "padding_side": tokenizer.padding_side,
        "truncation_side": tokenizer.truncation_side,
        "add_bos": getattr(tokenizer, "add_bos_token", None),
        "add_eos": getattr(tokenizer, "add_eos_token", None),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def cache_key(cfg: Any, data_fingerprint: str, tokenizer) -> str:
    """The prepared set's name in storage: a hash of everything that shapes its rows (see the module's doc)."""
    import datasets
    import tokenizers
    import transformers
    import trl

    from recipes import common, sft

    recipe = __import__(f"recipes.{cfg.recipe.name}", fromlist=["build_trainer"])
    parts = {
        "data": data_fingerprint,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "recipe": cfg.recipe.name,
        "recipe_source": hashlib.sha256(
            "".join(inspect.getsource(m) for m in sorted({recipe, sft, common}, key=lambda m: m.__name__)).encode()
        ).hexdigest(),
        "max_length": int(cfg.data.max_length),
        # SFTConfig's dataset options the recipe takes from the config (its fixed ones are in the source above)
        "packing": [bool(cfg.train.packing), str(cfg.train.packing_strategy), bool(cfg.train.padding_free)],
        "versions": [trl.__version__, transformers.__version__, tokenizers.__version__, datasets.__version__],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


class PreparedDataCache:
    """Args:
    checkpoints: the job's ``CheckpointStore`` (its commit protocol and store).
    work: a local folder of this attempt for the downloads.
    """

    def __init__(self, checkpoints: Any, *, work: Path):
        self.checkpoints = checkpoints
        self.store = checkpoints.store
        self.work = Path(work)
        self._keys: dict[str, str] = {}
        self._vocab: dict[str, int] = {}  # the tokenizer's size, by data fingerprint: the token ids' bound
        self._refused: set[str] = set()  # keys whose stored entry was refused: the rebuilt set replaces it
        self.hit: Optional[bool] = None

    def _key(self, cfg: Any, data_fingerprint: str) -> str:
        from recipes.common import resolve_model_path, tokenizer_for

        if self._keys.get(data_fingerprint) is None:  # one tokenizer load per attempt, not one per call
            # the job's tokenizer as the recipe loads it: its model.revision and data.chat_template included
            tokenizer = tokenizer_for(cfg, resolve_model_path(cfg.model))
            self._keys[data_fingerprint] = cache_key(cfg, data_fingerprint, tokenizer)
            self._vocab[data_fingerprint] = len(tokenizer)
        return self._keys[data_fingerprint]

    def load(self, cfg: Any, data_fingerprint: str, *, splits: tuple):
        """The prepared sets (a ``DatasetDict`` of ``splits``: ``train``, and ``eval`` where the job has one),
        downloaded and verified; None when there are none, or they are unusable (reported; the set this attempt
        prepares then replaces them)."""
        key = self._key(cfg, data_fingerprint)
        prefix = f"{PREFIX}{key}/"
        try:
            data = self.store.get_bytes(prefix + mf.MANIFEST_NAME)
        except FileNotFoundError:
            self.hit = False
            return None
        try:
            dataset = self._read(key, mf.loads(data), splits, vocab_size=self._vocab[data_fingerprint])
        except Exception as err:  # noqa: BLE001 - storage is untrusted: whatever is wrong, tokenise again
            log.warning(
                "the prepared dataset %s is unusable (%s); tokenising again, and the new set replaces it",
                self.store.get_uri(prefix),
                err,
            )
            self._refused.add(key)
            self.hit = False
            return None
        self.hit = True
        log.info(
            "prepared training set from %s (%d rows, verified): no tokenisation",
            self.store.get_uri(prefix),
            len(dataset["train"]),
        )
        return dataset

    def _read(self, key: str, manifest: dict, splits: tuple, *, vocab_size: int):
        """Download the entry ``manifest`` lists and check it before and after ``load_from_disk``. Raises."""
        from datasets import DatasetDict

        owner = manifest.get("meta", {}).get("prepared_dataset") if isinstance(manifest.get("meta"), dict) else None
        if owner != key:  # a signed entry copied from another key is signed, but not this key's
            raise mf.CorruptCheckpoint(f"its manifest is that of the prepared set {owner!r}, not {key!r}")
        local = self.work / "prepared" / key
        shutil.rmtree(local, ignore_errors=True)
        mf.fetch_folder(self.store, f"{PREFIX}{key}/", manifest, local)  # every size and SHA-256 before it is read
        check_layout(local, manifest, splits)  # the files load_from_disk opens are the manifest's
        dataset = DatasetDict.load_from_disk(str(local))
        check_token_ids(dataset, vocab_size)
        return dataset

    def save_later(self, cfg: Any, data_fingerprint: str, trainer) -> None:
        """Save the trainer's prepared sets in the background (training does not wait for it)."""
        from datasets import Dataset, DatasetDict

        splits = {"train": trainer.train_dataset}
        if isinstance(trainer.eval_dataset, Dataset):
            splits["eval"] = trainer.eval_dataset
        key = self._key(cfg, data_fingerprint)
        threading.Thread(
            target=self._save, args=(key, DatasetDict(splits)), name="prepared-dataset", daemon=True
        ).start()

    def _save(self, key: str, dataset) -> None:
        prefix = f"{PREFIX}{key}/"
        local = self.work / "prepared-save" / key
        try:
            if key not in self._refused and self.store.exists(prefix + mf.MANIFEST_NAME):
                return  # another job saved it meanwhile (a refused entry is replaced)
            shutil.rmtree(local, ignore_errors=True)
            dataset.save_to_disk(str(local))
            self.checkpoints.commit_folder(local, prefix, step=0, fence=0, meta={"prepared_dataset": key})
            log.info("prepared training set saved to %s", self.store.get_uri(prefix))
        except Exception as err:  # noqa: BLE001 - a cache that could not be written costs the next restart only
            log.warning("could not save the prepared training set to %s: %s", self.store.get_uri(prefix), err)
        finally:
            shutil.rmtree(local, ignore_errors=True)


def check_layout(folder: Path, manifest: dict, splits: tuple) -> None:
    """The files ``DatasetDict.load_from_disk`` opens are files of the manifest. It joins the split names of
    ``dataset_dict.json`` and the Arrow file names of each split's ``state.json`` to the folder as they are
    (``../`` and absolute names included), so both are checked first. Raises CorruptCheckpoint."""
    names = _stored_json(folder, manifest, "dataset_dict.json").get("splits")
    if not isinstance(names, list) or sorted(map(str, names)) != sorted(splits):
        raise mf.CorruptCheckpoint(f"its dataset_dict.json lists the splits {names!r}, not {list(splits)!r}")
    for split in splits:
        files = _stored_json(folder, manifest, f"{split}/state.json").get("_data_files")
        if not isinstance(files, list) or not files:
            raise mf.CorruptCheckpoint(f"its {split}/state.json lists no data files")
        for item in files:
            name = item.get("filename") if isinstance(item, dict) else item
            mf.listed_path(
                manifest, f"{split}/{name}" if isinstance(name, str) else name, named_by=f"{split}/state.json"
            )


def _stored_json(folder: Path, manifest: dict, path: str) -> dict:
    mf.listed_path(manifest, path, named_by="the cache entry")
    try:
        value = json.loads(mf.safe_join(folder, path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise mf.CorruptCheckpoint(f"its {path} is not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise mf.CorruptCheckpoint(f"its {path} is not a JSON object")
    return value


def check_token_ids(dataset, vocab_size: int) -> None:
    """Every split's ``input_ids`` (and ``labels``, but for -100) are token ids of the tokenizer: an id past
    the vocabulary would stop training with an IndexError in the embedding. Raises CorruptCheckpoint."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for split, rows in dataset.items():
        if "input_ids" not in rows.column_names:
            raise mf.CorruptCheckpoint(f"its {split} split has no input_ids")
        for column, ignored in (("input_ids", None), ("labels", -100)):
            if column not in rows.column_names:
                continue
            values = rows.data.column(column)
            kind = values.type
            if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(kind.value_type):
                raise mf.CorruptCheckpoint(f"its {split} split's {column} are {kind}, not lists of token ids")
            flat = pc.list_flatten(values)
            if ignored is not None:
                flat = pc.filter(flat, pc.not_equal(flat, ignored))
            bounds = pc.min_max(flat)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
            if low is not None and (low < 0 or high >= vocab_size):
                raise mf.CorruptCheckpoint(
                    f"its {split} split's {column} hold token ids from {low} to {high}, "
                    f"outside the tokenizer's vocabulary (0 to {vocab_size - 1})"
                )
