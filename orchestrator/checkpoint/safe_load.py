"""No code from storage: every pickle a resume reads is loaded with ``weights_only=True``.

Whoever can write the bucket can replace a checkpoint's files and fix the
manifest's hashes to match, so a hash proves nothing against them; what stops
code is the unpickler. The Trainer already loads its files (optimizer,
scheduler, scaler, RNG) with ``weights_only=True``; DeepSpeed 0.19 does not
(``TorchCheckpointEngine.load`` and the ZeRO optimizers pass ``weights_only=False``).

Two guards, one allow-list:

- :func:`check_restorable` loads every pickled file of a verified checkpoint
  once, memory-mapped, with ``weights_only=True`` before the restore accepts it,
  so a refused pickle makes a corrupt checkpoint (the previous one is tried)
  instead of a crash on every attempt;
- :func:`no_code_from_storage` wraps ``trainer.train(resume_from_checkpoint=...)``:
  it sets torch's own ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` switch, which turns every
  ``torch.load`` (DeepSpeed's included) into a ``weights_only=True`` load, and
  allows the few classes the Trainer and DeepSpeed store.

The allow-list (read from transformers 5.24's ``trainer_pt_utils.safe_globals``
and DeepSpeed 0.19's ZeRO ``state_dict``; a real ZeRO-2 checkpoint needs exactly these):

- numpy's array reconstruction and dtypes: the numpy RNG state in ``rng_state*.pth``;
- ``deepspeed.runtime.fp16.loss_scaler.LossScaler`` and ``DynamicLossScaler``:
  data-only objects (a scale and counters) in ZeRO's optimizer states;
- ``deepspeed.runtime.zero.config.ZeroStageEnum``: an int enum;
- ``deepspeed.utils.tensor_fragment.fragment_address``: a dataclass of two ints.

None of them runs anything on construction; the weights-only unpickler builds
them without calling their ``__init__`` or ``__setstate__`` beyond a dict update.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Iterator

from orchestrator.checkpoint import manifest as mf

# Files the Trainer and DeepSpeed write with torch.save; everything else is JSON, text or safetensors.
TORCH_SUFFIXES = (".pt", ".pth", ".bin")
# A pickled TrainingArguments: the Trainer never loads it on resume, and it holds classes far beyond
# the allow-list, so it is hash-checked but never deserialised.
NOT_RESTORED = {"training_args.bin"}
# DeepSpeed reads the folder of its states from these files (``engine.load_checkpoint`` with no tag).
DEEPSPEED_TAG_FILES = ("latest", "latest_universal")
FORCE_WEIGHTS_ONLY_VARIABLE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"


def _numpy_globals() -> list:
    import numpy as np

    core = np._core if hasattr(np, "_core") else np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _deepspeed_globals() -> list:
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def allowed_globals(*, deepspeed: bool) -> list:
    """The classes a checkpoint may hold beyond torch's own weights-only set.

    ``deepspeed``: add DeepSpeed's (imports DeepSpeed; a run that does not use it never needs them).
    """
    return _numpy_globals() + (_deepspeed_globals() if deepspeed else [])


def uses_deepspeed(manifest: dict) -> bool:
    return any(entry["path"] in DEEPSPEED_TAG_FILES for entry in manifest["files"])


def pickled_files(manifest: dict) -> list[str]:
    """The listed files a resume may unpickle (torch.save suffixes, less those never loaded)."""
    return [
        e["path"] for e in manifest["files"] if e["path"].endswith(TORCH_SUFFIXES) and e["path"] not in NOT_RESTORED
    ]


def _refusal(err: Exception) -> str:
    text = str(err)
    # torch's wording differs for a global it blocks ("posix.system") and one it merely does not know
    found = re.search(r"unsupported (?:global: )?GLOBAL (\S+)", text, re.IGNORECASE)
    if found:
        return f"it needs {found.group(1)}, which is not on the allow-list (the pickle could run code)"
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def load_torch_file(
    path: Path, *, deepspeed: bool, mmap: bool = False, name: str | None = None, allowed: list | None = None
):
    """``torch.load(path, weights_only=True)`` with the allow-list.

    ``name``: how the error names the file (default: its file name). ``allowed``: the allow-list already
    resolved (``allowed_globals``; ``deepspeed`` is then unused). Raises CorruptCheckpoint with the reason.
    """
    import torch

    try:
        if allowed is None:
            allowed = allowed_globals(deepspeed=deepspeed)
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # noqa: BLE001 - whatever refuses the file makes the checkpoint corrupt
        raise mf.CorruptCheckpoint(f"file {name or path.name} is refused: {_refusal(err)}") from err


def check_deepspeed_tag(folder: Path, manifest: dict) -> None:
    """DeepSpeed joins the text of ``latest`` onto the checkpoint folder: it must name a listed folder in it."""
    listed = {e["path"] for e in manifest["files"]}
    for name in DEEPSPEED_TAG_FILES:
        if name not in listed:
            continue
        tag = mf.safe_join(folder, name).read_text(errors="replace").strip()
        try:
            mf.check_path(tag)
        except mf.CorruptCheckpoint:
            raise mf.CorruptCheckpoint(f"file {name} names an unsafe folder {tag!r}") from None
        if "/" in tag or not any(p.startswith(f"{tag}/") for p in listed):
            raise mf.CorruptCheckpoint(f"file {name} names {tag!r}, which is not a folder of this checkpoint")


def check_restorable(folder: Path, manifest: dict, *, allowed: list | None = None) -> int:
    """Load every pickled file of a verified checkpoint once (memory-mapped, ``weights_only=True``, the allow-list).

    Call only after :func:`manifest.verify_folder`. Returns how many files were loaded.
    ``allowed``: the allow-list resolved beforehand (``allowed_globals``), for a caller in a thread of its own:
    resolving it imports DeepSpeed, and two threads importing DeepSpeed at once deadlock in the import
    system (one gets a partly initialised module and the file would be refused for it, or the other crashes).
    Raises CorruptCheckpoint naming the first file refused and why; nothing in it ran.
    """
    check_deepspeed_tag(folder, manifest)
    deepspeed = uses_deepspeed(manifest)
    paths = pickled_files(manifest)
    for rel in paths:
        load_torch_file(mf.safe_join(folder, rel), deepspeed=deepspeed, mmap=True, name=rel, allowed=allowed)
    return len(paths)


@contextlib.contextmanager
def no_code_from_storage() -> Iterator[None]:
    """Every ``torch.load`` inside is ``weights_only=True`` (whatever its caller asked), with the allow-list.

    Wrap ``trainer.train(resume_from_checkpoint=...)`` in it. DeepSpeed's classes are
    allowed when DeepSpeed is already imported: nothing can load a DeepSpeed checkpoint
    without it, and a run that does not use it does not pay for importing it.
    """
    import torch

    before = os.environ.get(FORCE_WEIGHTS_ONLY_VARIABLE)
    os.environ[FORCE_WEIGHTS_ONLY_VARIABLE] = "1"
    try:
        with torch.serialization.safe_globals(allowed_globals(deepspeed=sys.modules.get("deepspeed") is not None)):
            yield
    finally:
        if before is None:
            os.environ.pop(FORCE_WEIGHTS_ONLY_VARIABLE, None)
        else:
            os.environ[FORCE_WEIGHTS_ONLY_VARIABLE] = before
