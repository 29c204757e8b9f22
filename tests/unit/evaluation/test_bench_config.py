"""The ``eval`` group (benchmark scores of checkpoints): its bad input is refused at launch, exit 4, with the fix;
the shipped tasks resolve without a model, their data files made absolute and hashed."""
from __future__ import annotations

import pytest

from orchestrator.app.compose import compose_config
from orchestrator.core.errors import ConfigError
from orchestrator.evaluation import spec
from tests.helpers import jobs


def test_the_shipped_tasks_resolve_by_name_with_their_data_hashed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # data_files are relative to the YAML's folder, not to the working directory
    cfg = compose_config(["eval.tasks=[tiny_arith_mc,tiny_arith_gen]"])
    tasks = spec.resolve(cfg.eval)
    assert tasks.names == ["tiny_arith_mc", "tiny_arith_gen"]
    data = tasks.specs[0]["dataset_kwargs"]["data_files"]["test"]
    assert data == str(spec.SHIPPED_TASKS / "tiny_arith" / "test.jsonl")
    assert tasks.harness_version == "0.4.13" and len(tasks.config_hash) == 64
    # the hash follows what decides the scores: the items, the few-shot count, the limit
    assert spec.resolve(compose_config(["eval.tasks=[tiny_arith_mc,tiny_arith_gen]", "eval.limit=50"]).eval
                        ).config_hash != tasks.config_hash
    copied = tmp_path / "mine"
    copied.mkdir()
    (copied / "test.jsonl").write_text((spec.SHIPPED_TASKS / "tiny_arith" / "test.jsonl").read_text()[:-200] + "\n")
    (copied / "t.yaml").write_text((spec.SHIPPED_TASKS / "tiny_arith" / "tiny_arith_mc.yaml").read_text()
                                   .replace("task: tiny_arith_mc", "task: my_arith"))
    mine = spec.resolve(compose_config([f"eval.tasks=[{copied / 't.yaml'}]"]).eval)
    assert mine.names == ["my_arith"] and mine.specs[0]["dataset_kwargs"]["data_files"]["test"] == str(
        copied / "test.jsonl")


def _refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        compose_config(overrides)
    return str(err.value)


@pytest.mark.e2e
def test_a_mistyped_task_name_is_refused_naming_the_close_ones():
    """Heavy for the inner loop: an unknown name is looked up in the harness's whole task index (about 17 s of
    CPU to build here), so it runs with the e2e tier."""
    text = _refusal(["eval.tasks=[tiny_arith_mcq]"])
    assert "'tiny_arith_mcq' is not a task lm-evaluation-harness knows" in text and "tiny_arith_mc" in text


def test_bad_eval_settings_name_the_problem_and_the_fix(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("task: x\ndoc_to_text: [unclosed\n")
    assert f"{broken} does not parse as a task YAML" in _refusal([f"eval.tasks=[{broken}]"])
    text = _refusal(["eval.tasks=[tiny_arith_mc]", "eval.every=2", "checkpoint.every=off", "checkpoint.every_steps=0"])
    assert "eval.every=2" in text and "commits none" in text and "checkpoint.every_steps=N" in text
    assert "eval.tasks is empty" in _refusal(["eval.every=2"])
    assert "eval.batch_size=0 must be at least 1" in _refusal(["eval.tasks=[tiny_arith_mc]", "eval.batch_size=0"])
    assert "does not exist" in _refusal([f"eval.tasks=[{tmp_path / 'none.yaml'}]"])


@pytest.mark.e2e
def test_a_job_without_lm_eval_is_refused_at_launch_with_the_install_fix(tmp_path):
    """lm-eval missing (an import that fails): exit 4, one line naming the install command, nothing written."""
    blocker = tmp_path / "block"
    (blocker / "lm_eval").mkdir(parents=True)
    (blocker / "lm_eval" / "__init__.py").write_text("raise ImportError('No module named lm_eval')\n")
    env = jobs.job_env(tmp_path)
    env["PYTHONPATH"] = f"{blocker}:{env.get('PYTHONPATH', '')}"
    done = jobs.run_job(jobs.FAST + [f"storage.uri={tmp_path / 'runs'}", "eval.tasks=[tiny_arith_mc]"], tmp_path,
                        env=env, timeout=300)
    assert done.returncode == 4, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "lm-eval==0.4.13" in lines[0] and "scripts/setup.sh" in lines[0], lines
    assert not (tmp_path / "runs").exists()
