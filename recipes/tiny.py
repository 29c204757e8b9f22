"""A tiny Llama and its tokenizer, built locally and deterministically.

The default job and the tests run with no network, so instead of a hub model
they use this one: built from a config and a seed, saved with ``save_pretrained``
into a cache folder and loaded back through the same ``from_pretrained`` path as
any hub model. The tokenizer is a BPE trained on the built-in task's text.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

TINY_NAME = "builtin:tiny-llama"
FORMAT_PRETRAIN_STEPS = 300
BUILD_VERSION = 3  # bump when the build changes, so cached models are rebuilt (3: built in a child process)
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n"
    "{% elif m['role'] == 'system' %}{{ m['content'] }}\n"
    "{% else %}A: {{ m['content'] }}{{ eos_token }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A: {% endif %}"
)


def cache_root() -> Path:
    return Path(os.environ.get("ORCH_CACHE_DIR", Path.home() / ".cache" / "spot-orchestrator")).expanduser().resolve()


def tiny_llama_config(hidden_size: int, num_layers: int, num_heads: int, vocab_size: int) -> dict:
    """The config.json fields of the tiny model (also used by the planner)."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden_size,
        "intermediate_size": 4 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads,
        "vocab_size": vocab_size,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def _tokenizer_corpus() -> list[str]:
    from recipes.data import tokenizer_training_text

    return tokenizer_training_text()


MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")  # what a complete build holds


def _complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in MODEL_FILES)


def _build_plan(hidden_size: int, num_layers: int, num_heads: int, vocab_size: int) -> tuple[dict, int, Path]:
    """The model's config, its format-pretraining steps and its folder in the cache."""
    spec = tiny_llama_config(hidden_size, num_layers, num_heads, vocab_size)
    # only the default-sized model is taught the task's format: larger ones (benchmarks) stay random,
    # where a few hundred CPU steps would cost minutes and buy nothing
    pretrain_steps = FORMAT_PRETRAIN_STEPS if hidden_size <= 128 else 0
    digest = hashlib.sha256(json.dumps([spec, pretrain_steps, BUILD_VERSION], sort_keys=True).encode()).hexdigest()[:12]
    return spec, pretrain_steps, cache_root() / "models" / f"tiny-llama-{digest}"


def tiny_model_folder(hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, vocab_size: int = 512) -> Path:
    """Where ``ensure_tiny_model`` keeps this model (built or not)."""
    return _build_plan(hidden_size, num_layers, num_heads, vocab_size)[2]


def ensure_tiny_model(hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, vocab_size: int = 512) -> Path:
    """Build the tiny model once into the cache (atomically, under a lock); return its folder.

    The build runs in a child process of its own: a caller inside a distributed job (rank 1 of an
    ``accelerate launch``) would otherwise get a folder without weights, because ``save_pretrained``
    writes only on rank 0 once ``torch.distributed`` is initialised, and the caller's RNG is left alone.
    """
    spec, pretrain_steps, target = _build_plan(hidden_size, num_layers, num_heads, vocab_size)
    digest = target.name.removeprefix("tiny-llama-")
    root = target.parent
    if _complete(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".tiny-llama-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent attempts must not build it twice
        if _complete(target):
            return target
        # left by a killed build of this model (we hold its lock), or an incomplete folder from an older build
        for stale in [*root.glob(f".build-{digest}-*"), target]:
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f".build-{digest}-"))
        try:
            _build_in_child(spec, staging, pretrain_steps)
            missing = [name for name in MODEL_FILES if not (staging / name).is_file()]
            if missing:
                raise RuntimeError(f"building the tiny model left no {', '.join(missing)} in {staging}")
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _build_in_child(spec: dict, out: Path, pretrain_steps: int) -> None:
    import subprocess
    import sys

    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "GROUP_RANK",
            "ROLE_RANK",
            "NODE_RANK",
        }
        and not k.startswith(("ACCELERATE_", "TORCHELASTIC_"))
    }
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
    code = (
        "import json, sys; from pathlib import Path; from recipes.tiny import _build; "
        "_build(json.loads(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec), str(out), str(pretrain_steps)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"building the tiny model failed (exit {done.returncode}):\n{done.stderr[-4000:]}")


def _build(spec: dict, out: Path, pretrain_steps: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec["vocab_size"],
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    cfg_fields = {k: v for k, v in spec.items() if k not in {"model_type", "architectures", "torch_dtype"}}
    config = LlamaConfig(
        **cfg_fields,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    # the configured size (what the planner counts), or more if the tokenizer came out larger
    config.vocab_size = max(spec["vocab_size"], len(fast))
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if pretrain_steps:
        _pretrain_format(model, fast, steps=pretrain_steps)
    model.save_pretrained(out, safe_serialization=True)


def _pretrain_format(model, tokenizer, steps: int = 300, batch_size: int = 32) -> None:
    """Teach the random model the task's *format* (not its answers) with a short full-parameter run.

    A purely random base gives near-uniform logits that LoRA barely moves; a hub
    base model knows its language. Here the answers are random, so the base
    starts near chance on the task and fine-tuning has something real to learn.
    """
    import random

    import torch

    from recipes.data import _problem

    rng = random.Random(7)
    texts = []
    for _ in range(steps * batch_size):
        question, _answer = _problem(rng)
        texts.append(f"Q: {question}\nA: {rng.randint(0, 18)}{tokenizer.eos_token}")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for i in range(steps):
        enc = tokenizer(texts[i * batch_size : (i + 1) * batch_size], return_tensors="pt", padding=True)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
