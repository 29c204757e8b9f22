"""Every config in conf/ composes; bad input is refused before training with a clear message and exit 4."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.app.compose import compose_config
from orchestrator.config.compose import conf_dir
from tests.helpers.launcher import launch
from tests.helpers.paths import REPO

GROUPS = sorted(p.name for p in conf_dir().iterdir() if p.is_dir() and p.name != "experiment")


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_config_composes(group, option, tmp_path):
    extra = []
    if group == "data" and option == "jsonl":
        f = tmp_path / "d.jsonl"
        f.write_text(json.dumps({"prompt": "Q: 1 + 1 =\\nA:", "completion": " 2"}) + "\n")
        extra = [f"data.path={f}"]
    if group == "data" and option == "hub":
        extra = ["data.path=trl-lib/Capybara"]
    if group == "data" and option == "mix":
        extra = ["data.mix=[{source: synthetic, seed: 1}, {source: synthetic, seed: 2, weight: 3}]"]
    if group == "storage" and option == "s3":
        extra = ["storage.uri=s3://bucket/runs"]
    if group == "compute":
        import yaml

        gpus = yaml.safe_load((conf_dir() / "compute" / f"{option}.yaml").read_text()).get("gpus_per_node", 0)
        if gpus > 1:  # one training process per GPU, or the job is refused for billing idle GPUs
            extra = ["distributed=ddp", f"distributed.processes_per_node={gpus}"]
    if group == "backend" and option in ("kubernetes", "skypilot"):
        extra = ["storage.uri=s3://bucket/runs"]  # remote nodes vanish with their disks: local storage is refused
    cfg = compose_config([f"{group}={option}", *extra])
    assert cfg[group] is not None


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml")))
def test_every_experiment_composes(experiment):
    cfg = compose_config([f"+experiment={experiment}"])
    assert cfg.run.name


def test_the_default_job_is_sft_lora_on_the_tiny_model():
    cfg = compose_config([])
    assert (cfg.recipe.name, cfg.recipe.peft, cfg.model.name_or_path) == ("sft", "lora", "builtin:tiny-llama")


def test_every_yaml_starts_with_the_command_that_uses_it():
    for path in conf_dir().rglob("*.yaml"):
        head = path.read_text().splitlines()[:5]
        assert head[0].startswith("#"), path
        assert any("python -m orchestrator.launch" in line for line in head), path


def _launch(args, tmp_path, monkeypatch, capsys):
    """The launcher's checks in-process (compose, validate), as ``python -m orchestrator.launch`` runs them."""
    return launch([*args, f"storage.uri={tmp_path / 'runs'}"], tmp_path, monkeypatch, capsys)


def _jsonl(tmp_path: Path, rows: list[dict]) -> Path:
    f = tmp_path / "data.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


@pytest.mark.parametrize(
    "args,needles",
    [
        (["train.no_such_key=1"], ["train.no_such_key", "its keys are", "max_steps"]),
        (["train.max_steps=many"], ["train.max_steps=many", "could not be converted"]),
        (["recipe=ppo"], ["recipe=ppo", "choose one of: dpo, grpo, qlora, sft"]),
        (["data=jsonl", "data.path=/no/such/file.jsonl"], ["/no/such/file.jsonl", "no such file"]),
        (["model.name_or_path=/no/such/model"], ["/no/such/model", "does not exist"]),
        (["checkpoint.every=sometimes"], ["checkpoint.every", "90s, 15m, 1h"]),
        (["recipe=dpo", "recipe.peft=full"], ["recipe.peft=full works with recipe=sft or grpo"]),
        (["recipe.quantization=nf4", "recipe.peft=full"], ["recipe.quantization=nf4 needs recipe.peft=lora"]),
        (["tracking.enabled=false", "tracking.log_final_weights=true"], ["tracking.log_final_weights=true", "tracking.enabled=true"]),
        # a quoted Hydra value can hold a newline, which would become a line of the sbatch script
        (["run.name='x\necho hi'"], ["run.name='x\\necho hi'", "letters, digits, '.', '_' or '-'", "Kubernetes label"]),
        (["run.name=-x"], ["run.name='-x'", "starting and ending with a letter or digit"]),
        (["run.name=" + "a" * 64], ["1-63"]),
        (["+run.notes.note='a\x1b[2Jb'"], ["run.notes.note=", "control character"]),
        (["budget.webhook_url_env=NO_SUCH_WEBHOOK_VAR"], ["NO_SUCH_WEBHOOK_VAR is not set", "export NO_SUCH_WEBHOOK_VAR="]),
        (["budget.webhook_url_env=A-B"], ["budget.webhook_url_env='A-B'", "name of an environment variable"]),
        # the node's disk vanishes with the node: the ledger, caps and checkpoints must live in object storage
        (["backend=kubernetes", "backend.image=x", "backend.dry_run=true"], ["backend=kubernetes", "s3://bucket/runs"]),
        (["backend=skypilot", "backend.dry_run=true"], ["backend=skypilot", "vanishes", "s3://"]),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(args, needles, tmp_path, monkeypatch, capsys):
    result = _launch(args, tmp_path, monkeypatch, capsys)
    assert result.returncode == 4, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists(), "nothing may be written for a refused job"


def test_a_dataset_without_the_recipes_columns_is_refused(tmp_path, monkeypatch, capsys):
    data = _jsonl(tmp_path, [{"question": "1+1", "answer": "2"}])
    result = _launch(["data=jsonl", f"data.path={data}"], tmp_path, monkeypatch, capsys)
    assert result.returncode == 4
    assert "needs {completion, prompt} or {messages}" in result.stderr
    dpo = _launch(["recipe=dpo", "data=jsonl", f"data.path={_jsonl(tmp_path, [{'prompt': 'a', 'completion': 'b'}])}"],
                  tmp_path, monkeypatch, capsys)
    assert dpo.returncode == 4 and "{chosen, prompt, rejected}" in dpo.stderr


def test_invalid_json_names_the_line(tmp_path, monkeypatch, capsys):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "a", "completion": "b"}\n{not json\n')
    result = _launch(["data=jsonl", f"data.path={f}"], tmp_path, monkeypatch, capsys)
    assert result.returncode == 4 and "line 2" in result.stderr


def test_compose_raises_config_error_for_unknown_group():
    with pytest.raises(ConfigError, match="there is no config group 'nosuch'"):
        compose_config(["nosuch.key=1"])


@pytest.mark.e2e
def test_readme_config_reference_is_current():
    """The config reference (docs/configuration.md) is the script's output: a new or renamed key fails until it is regenerated."""
    root = REPO
    out = subprocess.run([sys.executable, str(root / "scripts" / "config_reference.py")], capture_output=True,
                         text=True, check=True).stdout
    assert out in (root / "docs" / "configuration.md").read_text(), "run bash scripts/readme_config_reference.sh"


@pytest.mark.e2e
def test_every_problem_of_a_config_is_named_in_one_message_and_the_command_exits_4(tmp_path):
    """torchtune's config.validate habit: a config with three mistakes is refused once, naming all three.

    The one config check run as the user runs it, a new ``python -m orchestrator.launch`` whose exit status is 4
    (what an engine keys on: no requeue); the others run the same launcher in-process (``tests/helpers/launcher.py``)."""
    result = subprocess.run([sys.executable, "-m", "orchestrator.launch", "run.name=-x", "checkpoint.keep_last=1",
                             "checkpoint.every=soon", f"storage.uri={tmp_path / 'runs'}"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 4, result.stderr
    assert "3 problems in the config" in result.stderr, result.stderr
    for needle in ("run.name='-x'", "checkpoint.keep_last must be at least 2", "checkpoint.every='soon'"):
        assert needle in result.stderr, (needle, result.stderr)
    assert result.stderr.count("error:") == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_key_of_another_recipe_is_refused_naming_the_recipe_it_belongs_to():
    with pytest.raises(ConfigError, match=r"recipe.dpo_beta is a key of recipe=dpo only"):
        compose_config(["recipe=sft", "recipe.dpo_beta=0.2"])
    assert compose_config(["recipe=dpo", "recipe.dpo_beta=0.2"]).recipe.dpo_beta == 0.2
    assert "dpo_beta" not in compose_config(["recipe=qlora"]).recipe


def test_relative_paths_are_pinned_to_the_launch_directory(tmp_path, monkeypatch):
    from orchestrator.config.compose import absolutize, with_default_storage

    monkeypatch.chdir(tmp_path)
    pinned = absolutize(["storage.uri=runs", "data.path=d.jsonl", "run.work_dir=work", "model.name_or_path=./m",
                         "model.name_or_path=Qwen/Qwen2.5-0.5B", "storage.uri=s3://b/p", "run.name=x"])
    assert pinned == [f"storage.uri={tmp_path}/runs", f"data.path={tmp_path}/d.jsonl", f"run.work_dir={tmp_path}/work",
                      f"model.name_or_path={tmp_path}/m", "model.name_or_path=Qwen/Qwen2.5-0.5B", "storage.uri=s3://b/p",
                      "run.name=x"]
    defaults = with_default_storage(compose_config([]), [])
    assert defaults == [f"storage.uri={tmp_path}/.cache/runs", f"run.work_dir={tmp_path}/.cache/work"]
