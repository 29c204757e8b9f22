"""The locally built tiny model: complete whoever builds it first, rank 1 of a distributed job included."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers import jobs

RANKS = textwrap.dedent("""
    import os, sys
    import torch.distributed as dist
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
    if rank == 1:  # the other rank builds it, inside the initialised process group (as in an accelerate launch)
        from recipes.tiny import ensure_tiny_model
        print(ensure_tiny_model(192, 1, 4, 512))
    dist.barrier()
    dist.destroy_process_group()
""")


def test_a_build_by_rank_one_of_a_distributed_job_holds_the_weights(tmp_path, monkeypatch):
    """Rank 1 builds inside an initialised process group (where ``save_pretrained`` writes only on rank 0), over
    an incomplete folder an older build by rank 1 left (the tokenizer only): the whole folder is the new build."""
    env = {**jobs.job_env(tmp_path), "ORCH_CACHE_DIR": str(tmp_path / "cache")}
    monkeypatch.setenv("ORCH_CACHE_DIR", env["ORCH_CACHE_DIR"])
    from recipes.tiny import tiny_model_folder

    folder = tiny_model_folder(192, 1, 4, 512)
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text("{}")
    procs = [subprocess.Popen([sys.executable, "-c", RANKS, str(rank), str(tmp_path / "rendezvous")], env=env,
                              cwd=jobs.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert Path(outs[1][0].strip().splitlines()[-1]) == folder
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(folder))
    assert (folder / "tokenizer.json").read_text() != "{}"
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(folder).config.hidden_size == 192
