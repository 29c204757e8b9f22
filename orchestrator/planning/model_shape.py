"""A model's shape from its ``config.json`` alone: reading the config (local folder, hub, shipped preset) and
counting parameters by part, LoRA adapters included. The planner's assumptions are in ``orchestrator.planning.memory``'s
docstring (a Llama-style decoder)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping

from orchestrator.core.errors import ConfigError

log = logging.getLogger(__name__)

PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"
HUB_TIMEOUT_SECONDS = 5.0
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")


def tiny_llama_config(model_cfg: Any) -> dict:
    """config.json fields of ``builtin:tiny-llama`` from a ``model`` config.

    The same function ``recipes.tiny`` builds the model from, so the planner and
    the builder cannot disagree (intermediate_size = 4 x hidden_size, no GQA).
    """
    from recipes.tiny import tiny_llama_config as build_spec

    return build_spec(
        int(model_cfg.hidden_size), int(model_cfg.num_layers), int(model_cfg.num_heads), int(model_cfg.vocab_size)
    )


def load_model_config(
    name_or_path: str, preset: str = "custom", *, model_cfg: Any = None, timeout_seconds: float = HUB_TIMEOUT_SECONDS
) -> dict:
    """The model's config.json as a dict, without downloading weights.

    ``builtin:tiny-llama``: computed by :func:`tiny_llama_config` from ``model_cfg``
    (defaults of ``ModelConfig`` when None). A local folder (or .json file): its
    config.json. A hub id: config.json only, via ``hf_hub_download`` with a short
    timeout; when the hub cannot be reached, the shipped ``presets/<preset>.json``,
    saying so in one line on stderr. Raises ConfigError when none of these works.
    """
    if name_or_path.startswith("builtin:"):
        if model_cfg is None:
            from orchestrator.config.schema import ModelConfig

            model_cfg = ModelConfig(name_or_path=name_or_path)
        return tiny_llama_config(model_cfg)
    local = Path(name_or_path).expanduser()
    if local.exists():
        path = local / "config.json" if local.is_dir() else local
        if not path.is_file():
            raise ConfigError(f"{local} has no config.json; point model.name_or_path at a saved model folder.")
        return json.loads(path.read_text())
    try:
        return json.loads(Path(_hub_config_path(name_or_path, timeout_seconds)).read_text())
    except Exception as err:  # noqa: BLE001 - any hub failure means: use the shipped copy
        reason = str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__
    shipped = PRESETS_DIR / f"{preset}.json"
    if shipped.is_file():
        log.warning(
            "plan: no config.json for %s from the hub (%s); using the shipped presets/%s",
            name_or_path,
            reason,
            shipped.name,
        )
        return json.loads(shipped.read_text())
    known = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.json")))
    raise ConfigError(
        f"cannot read config.json for {name_or_path!r}: the hub is unreachable ({reason}) and there is no shipped "
        f"preset {preset!r} (shipped: {known}). Set model.name_or_path to a local folder holding config.json, "
        "or model.preset to one of the shipped presets."
    )


def _hub_config_path(repo_id: str, timeout_seconds: float) -> str:
    """config.json from the local hub cache, else from the hub when its host answers within the timeout.

    The reachability probe keeps an offline machine from sitting through
    huggingface_hub's retries with backoff (about 25 s).
    """
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, hf_hub_download

    try:
        return hf_hub_download(repo_id, "config.json", local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached: go on to the hub
        pass
    if constants.HF_HUB_OFFLINE:
        raise ConnectionError("HF_HUB_OFFLINE is set")
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout_seconds).close()
    except OSError as err:
        raise ConnectionError(f"cannot connect to {host}: {err}") from None
    return hf_hub_download(repo_id, "config.json", etag_timeout=timeout_seconds)


def _dims(config: Mapping[str, Any]) -> dict:
    try:
        h, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        heads, vocab = int(config["num_attention_heads"]), int(config["vocab_size"])
        inter = int(config["intermediate_size"])
    except KeyError as err:
        raise ConfigError(
            f"model config lacks {err.args[0]!r}; the planner needs a Llama-style config.json "
            "(hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size)."
        ) from None
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or h // heads)
    return {
        "h": h,
        "layers": layers,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "inter": inter,
        "vocab": vocab,
        "q_dim": heads * head_dim,
        "kv_dim": kv_heads * head_dim,
    }


def projection_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each linear projection in one decoder layer."""
    d = _dims(config)
    return {
        "q_proj": (d["h"], d["q_dim"]),
        "k_proj": (d["h"], d["kv_dim"]),
        "v_proj": (d["h"], d["kv_dim"]),
        "o_proj": (d["q_dim"], d["h"]),
        "gate_proj": (d["h"], d["inter"]),
        "up_proj": (d["h"], d["inter"]),
        "down_proj": (d["inter"], d["h"]),
    }


def count_parameters(config: Mapping[str, Any]) -> dict[str, int]:
    """Parameter counts by part, from config.json alone (see the module docstring).

    Returns embeddings, attention, mlp, norms, lm_head (0 when tied), total, and
    linear_weights (the decoder's projection weights: what NF4 quantises).
    """
    d = _dims(config)
    shapes = projection_shapes(config)
    model_type = str(config.get("model_type", "llama"))
    attn_w = sum(i * o for name, (i, o) in shapes.items() if name in ATTENTION_MODULES)
    mlp_w = sum(i * o for name, (i, o) in shapes.items() if name in MLP_MODULES)
    attn_b = 0
    if config.get("attention_bias"):
        attn_b = d["q_dim"] + 2 * d["kv_dim"] + d["h"]
    elif model_type == "qwen2":
        attn_b = d["q_dim"] + 2 * d["kv_dim"]
    mlp_b = 2 * d["inter"] + d["h"] if config.get("mlp_bias") else 0
    qk_norms = 2 * d["head_dim"] if model_type == "qwen3" else 0
    L = d["layers"]
    counts = {
        "embeddings": d["vocab"] * d["h"],
        "attention": L * (attn_w + attn_b),
        "mlp": L * (mlp_w + mlp_b),
        "norms": L * (2 * d["h"] + qk_norms) + d["h"],
        "lm_head": 0 if config.get("tie_word_embeddings", False) else d["vocab"] * d["h"],
    }
    counts["total"] = sum(counts.values())
    counts["linear_weights"] = L * (attn_w + mlp_w)
    return counts


def lora_parameters(config: Mapping[str, Any], r: int, target_modules: Any) -> int:
    """Trainable LoRA parameters: r*(in + out) per targeted projection, every layer.

    ``target_modules`` is a list of projection names or "all-linear" (every
    projection, not lm_head). Raises ConfigError for a name that is not a projection.
    """
    shapes = projection_shapes(config)
    if isinstance(target_modules, str):
        targets = list(shapes) if target_modules == "all-linear" else [target_modules]
    else:
        targets = list(target_modules)
    if "all-linear" in targets:
        targets = list(shapes)
    unknown = [t for t in targets if t not in shapes]
    if unknown:
        raise ConfigError(
            f"recipe.lora_target_modules: {', '.join(unknown)} is not a projection of this model; "
            f"choose from {', '.join(shapes)} or all-linear."
        )
    return _dims(config)["layers"] * sum(int(r) * (shapes[t][0] + shapes[t][1]) for t in dict.fromkeys(targets))


# ---------------------------------------------------------------- memory
