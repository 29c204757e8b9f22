"""A hub model that cannot be fetched is refused at launch (exit 4, the fix named), against a stand-in hub.

Before, a typo or a gated Llama without HF_TOKEN passed the launch and crashed every attempt (requeued, a
traceback each). The hub here is ``tests/helpers/fake_hub.py`` on 127.0.0.1 (``HF_ENDPOINT``), answering as
huggingface.co does (401/403 ``GatedRepo``, 404 ``RepoNotFound``), so each answer goes through
huggingface_hub's own error classes. An unreachable hub is not a config error: a warning, and the launch goes on.
"""
from __future__ import annotations

import logging

import pytest

from orchestrator.app.compose import compose_config
from orchestrator.core.errors import ConfigError
from tests.helpers import jobs
from tests.helpers.fake_hub import GOOD_TOKEN, FakeHub

GATED, PUBLIC = "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The stand-in hub as HF_ENDPOINT, online, no token anywhere (neither HF_TOKEN nor hf auth login's file)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-stored-tokens"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    with FakeHub(public=[PUBLIC], gated=[GATED]) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        yield fake


def _compose(*extra: str):
    return compose_config([f"model.name_or_path={extra[0]}", *extra[1:]])


def test_a_gated_model_without_a_token_is_refused_naming_the_licence_page_and_hf_token(hub):
    with pytest.raises(ConfigError) as err:
        _compose(GATED)
    text = str(err.value)
    assert f"model.name_or_path={GATED} is a gated repository and no Hugging Face token is set" in text
    assert f"{hub.url}/{GATED}" in text and "export HF_TOKEN=hf_..." in text
    assert "\n" not in text


def test_a_gated_model_whose_licence_the_token_has_not_accepted_is_refused(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_other_account")
    with pytest.raises(ConfigError, match=rf"{GATED} is a gated repository .* accept the licence at {hub.url}/{GATED}"):
        _compose(GATED)
    assert any(path.endswith("config.json") and token for _, path, token in hub.requests)


def test_a_gated_model_with_a_token_that_has_access_launches(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert _compose(GATED).model.name_or_path == GATED


def test_a_misspelt_model_is_refused_asking_to_fix_the_name(hub):
    with pytest.raises(ConfigError, match=r"model.name_or_path=Qwen/Qwen2.5-0.5 is not a model on the hub .*fix the "
                                          r"name .*export HF_TOKEN"):
        _compose("Qwen/Qwen2.5-0.5")


def test_a_revision_the_model_does_not_have_is_refused(hub):
    with pytest.raises(ConfigError, match=r"model.revision=v9 is not a branch, tag or commit of Qwen/Qwen2.5-0.5B"):
        _compose(PUBLIC, "model.revision=v9")


def test_a_repository_without_config_json_is_refused_as_not_a_transformers_model(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with FakeHub(no_config=["TheBloke/Llama-2-7B-GGUF"]) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        with pytest.raises(ConfigError, match=r"TheBloke/Llama-2-7B-GGUF has no config.json, so transformers cannot"):
            _compose("TheBloke/Llama-2-7B-GGUF")


def test_an_unreachable_hub_warns_and_the_launch_goes_on(hub, monkeypatch, caplog):
    from tests.helpers.net import free_port

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with caplog.at_level(logging.WARNING, logger="orchestrator.app.hub_access"):
        assert _compose(GATED).model.name_or_path == GATED
    assert f"model.name_or_path={GATED} not checked on the hub" in caplog.text and "launching anyway" in caplog.text


def test_offline_a_cached_model_passes_and_one_not_cached_is_warned_about(hub, monkeypatch, caplog):
    from huggingface_hub import constants, hf_hub_download

    hf_hub_download(PUBLIC, "config.json", cache_dir=constants.HF_HUB_CACHE, endpoint=hub.url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    asked = len(hub.requests)
    with caplog.at_level(logging.WARNING, logger="orchestrator.app.hub_access"):
        assert _compose(PUBLIC)
        assert "not checked" not in caplog.text
        assert _compose(GATED)  # not in the cache: cannot be asked offline, so not refused
    assert len(hub.requests) == asked, "offline: not one request"
    assert f"model.name_or_path={GATED} not checked: HF_HUB_OFFLINE is set" in caplog.text


@pytest.mark.parametrize("model", ["builtin:tiny-llama", "s3://bucket/models/llama", "local-folder"])
def test_local_builtin_and_s3_models_are_not_asked_of_the_hub(hub, model, tmp_path, monkeypatch):
    if model == "local-folder":
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text("{}")
        model = str(tmp_path / "m")
    try:
        _compose(model)
    except ConfigError as err:  # an s3:// model may need other settings; the hub is what matters here
        assert "hub" not in str(err)
    assert hub.requests == []


def test_a_token_from_hf_auth_login_only_is_refused_where_the_job_reads_hf_token(hub, monkeypatch, tmp_path):
    from huggingface_hub import constants

    token_file = tmp_path / "token"
    token_file.write_text(GOOD_TOKEN)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(token_file))
    assert _compose(GATED)  # the local backend's worker finds the same file
    with pytest.raises(ConfigError, match=r"backend=skypilot gives the job the variable HF_TOKEN only .* export "
                                          r"HF_TOKEN=hf_\.\.\. before launching"):
        _compose(GATED, "backend=skypilot", "storage.uri=s3://bucket/runs", "run.name=gated")
    assert _compose(PUBLIC, "backend=skypilot", "storage.uri=s3://bucket/runs", "run.name=public")


@pytest.mark.e2e
@pytest.mark.parametrize("model,needles", [
    (GATED, ["is a gated repository and no Hugging Face token is set", "export HF_TOKEN=hf_..."]),
    ("Qwen/Qwen2.5-0.5", ["is not a model on the hub", "fix the name"]),
])
def test_the_launcher_refuses_an_unfetchable_hub_model_with_exit_4_and_one_line(model, needles, tmp_path):
    env = {k: v for k, v in jobs.job_env(tmp_path).items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf-home"))
    with FakeHub(public=[PUBLIC], gated=[GATED]) as fake:
        env["HF_ENDPOINT"] = fake.url
        done = jobs.run_job(jobs.FAST + [f"storage.uri={tmp_path / 'runs'}", "run.name=hub",
                                         f"model.name_or_path={model}"], tmp_path, env=env, timeout=300, fresh=True)
    assert done.returncode == 4, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    # one error line, and no warning: the launcher's INFO lines (the hub requests, the pinned commit) aside
    errors = [line for line in done.stderr.splitlines() if " INFO " not in line]
    assert len(errors) == 1 and errors[0].startswith("error: "), errors
    for needle in [f"model.name_or_path={model}", *needles]:
        assert needle in errors[0], (needle, errors[0])
    assert not (tmp_path / "runs").exists(), "nothing may be written for a refused job"
