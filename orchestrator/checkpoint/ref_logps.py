"""DPO's reference log-probabilities, computed once per job and stored beside its checkpoints.

``recipe.precompute_ref_log_probs=true`` has TRL run the frozen reference over the dataset before
training and train on stored per-pair numbers; TRL keeps them only in a temporary cache, so every
attempt of a preemptible job would run the reference over the whole dataset again. Here they are
committed under ``<run>/ref_log_probs/<key>/`` with the checkpoints' protocol (files, then the
manifest last) and loaded by the next attempt.

``key`` is a SHA-256 over what the numbers depend on: the split's tokens, the reference model's
fingerprint (TRL's ``hash_module`` of the weights), the precompute batch size (padding) and the
job's trajectory config, so a changed model or dataset never reads stale values.

Storage is untrusted: the manifest's paths are checked before any download, the file's size and
SHA-256 before it is read, and the file is safetensors (no pickle) whose arrays must have the split's
length and hold log-probabilities (finite, at most 0); the manifest must be this job's, for this key
(``run_name``, ``meta.key``: what ties a signed entry to its place). Anything else is reported and the
log-probs are computed again (and stored again under the same key).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any, Optional

from orchestrator.checkpoint import manifest as mf

log = logging.getLogger(__name__)

FILE = "ref_logps.safetensors"
COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")


def ref_logps_key(
    *, split: str, data_fingerprint: str, model_fingerprint: str, batch_size: int, trajectory: dict
) -> str:
    body = {
        "split": split,
        "data": data_fingerprint,
        "model": model_fingerprint,
        "batch_size": int(batch_size),
        "trajectory": trajectory,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


class RefLogProbStore:
    """Args:
    checkpoints: the job's ``CheckpointStore`` (its commit protocol; ``.store`` to read).
    work: a local scratch folder of this attempt.
    main: whether this rank writes (the others only read).
    fence: the attempt's fence, recorded in the manifest (a callable: it is known after the ledger's begin).
    """

    def __init__(self, checkpoints: Any, *, work: Path, main: bool, trajectory: dict, fence=lambda: 0):
        self.checkpoints, self.store = checkpoints, checkpoints.store
        self.prefix = f"{checkpoints.run_name}/ref_log_probs/"
        self.work, self.main, self.trajectory, self.fence = Path(work), main, trajectory, fence

    def key(self, *, split: str, data_fingerprint: str, model_fingerprint: str, batch_size: int) -> str:
        return ref_logps_key(
            split=split,
            data_fingerprint=data_fingerprint,
            model_fingerprint=model_fingerprint,
            batch_size=batch_size,
            trajectory=self.trajectory,
        )

    def load(self, key: str, *, rows: int) -> Optional[dict]:
        """The stored arrays (numpy, by column) for ``key``, verified; None when there are none usable."""
        from safetensors.numpy import load_file

        manifest_key = f"{self.prefix}{key}/{mf.MANIFEST_NAME}"
        if not self.store.exists(manifest_key):
            return None
        local = self.work / "ref_log_probs" / key
        shutil.rmtree(local, ignore_errors=True)
        try:
            manifest = mf.loads(self.store.get_bytes(manifest_key))
            self._check_owner(manifest, key)
            if [e["path"] for e in manifest["files"]] != [FILE]:
                raise mf.CorruptCheckpoint(f"it lists {[e['path'] for e in manifest['files']]}, not [{FILE!r}]")
            self.store.download_file(f"{self.prefix}{key}/{FILE}", mf.safe_join(local, FILE))
            mf.verify_folder(local, manifest)
            arrays = load_file(str(local / FILE))
            check_arrays(arrays, rows)
        except (mf.CorruptCheckpoint, FileNotFoundError, ValueError, OSError) as err:
            log.warning("stored reference log-probs %s are unusable (%s); computing them again", key[:12], err)
            return None
        finally:
            shutil.rmtree(local, ignore_errors=True)
        return arrays

    def _check_owner(self, manifest: dict, key: str) -> None:
        """The entry is this job's, for this key: a signed entry copied from another key or job is signed too."""
        meta: Any = manifest.get("meta") if isinstance(manifest.get("meta"), dict) else {}
        if meta.get("key") != key or manifest.get("run_name") != self.checkpoints.run_name:
            raise mf.CorruptCheckpoint(
                f"its manifest is that of job {manifest.get('run_name')!r}, key "
                f"{str(meta.get('key'))[:12]!r}, not of job {self.checkpoints.run_name!r}, "
                f"key {key[:12]!r}"
            )

    def save(self, key: str, arrays: dict) -> None:
        """Commit ``arrays`` under ``key`` (main rank only; a failure costs only a recomputation later)."""
        from safetensors.numpy import save_file

        if not self.main:
            return
        folder = self.work / "ref_log_probs_out" / key
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        try:
            save_file({k: arrays[k] for k in COLUMNS}, str(folder / FILE))
            self.checkpoints.commit_folder(
                folder,
                f"{self.prefix}{key}/",
                step=0,
                fence=self.fence(),
                meta={"kind": "dpo_reference_log_probs", "key": key},
            )
            log.info("reference log-probs stored under %s%s/", self.prefix, key[:12])
        except Exception as err:  # noqa: BLE001 - training goes on; the next attempt computes them again
            log.warning(
                "could not store the reference log-probs (%s: %s); a resumed attempt will compute them again",
                type(err).__name__,
                err,
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def check_arrays(arrays: dict, rows: int) -> None:
    """The stored arrays are ``rows`` log-probabilities of each column: floats, finite and at most 0 (a sum of
    log-probabilities of tokens). NaN or positive values would train to NaN weights. Raises CorruptCheckpoint."""
    import numpy as np

    if sorted(arrays) != sorted(COLUMNS) or any(a.shape != (rows,) for a in arrays.values()):
        raise mf.CorruptCheckpoint(
            f"its arrays are {{{', '.join(f'{k}: {v.shape}' for k, v in arrays.items())}}}"
            f", not {rows} values of each of {', '.join(COLUMNS)}"
        )
    for name in COLUMNS:
        values = arrays[name]
        if not np.issubdtype(values.dtype, np.floating):
            raise mf.CorruptCheckpoint(f"its {name} are {values.dtype}, not floating-point log-probabilities")
        bad = ~np.isfinite(values) | (values > 0)
        if bad.any():
            raise mf.CorruptCheckpoint(
                f"its {name} hold {int(bad.sum())} values that are not log-probabilities "
                f"(finite and at most 0), e.g. {float(values[bad][0])}"
            )
