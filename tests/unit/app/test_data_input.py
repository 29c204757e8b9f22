"""Bad data input is a config error: found at launch where it can be, exit 4 naming the key, never requeued."""
from __future__ import annotations

import pytest

from orchestrator.app.compose import compose_config
from orchestrator.attempt.failure import classify_exception
from orchestrator.core.errors import UserError
from orchestrator.core.exitcodes import ExitClass
from tests.helpers import jobs
from tests.helpers.launcher import launch

ESCAPE = '{% for m in messages %}{{ m["content"] }}{{ "".__class__.__mro__ }}{% endfor %}'


def test_a_chat_template_that_trips_jinjas_sandbox_exits_4_at_launch_with_its_path(tmp_path, monkeypatch, capsys):
    template = tmp_path / "escape.jinja"
    template.write_text(ESCAPE)
    done = launch(jobs.FAST + [f"storage.uri={tmp_path / 'runs'}", "run.name=escape", f"data.chat_template={template}"],
                  tmp_path, monkeypatch, capsys)
    assert done.returncode == 4, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: data.chat_template="), lines
    assert str(template) in lines[0] and "refused by Jinja's sandbox" in lines[0], lines
    assert "access to attribute '__class__' of 'str' object is unsafe" in lines[0], lines
    assert not (tmp_path / "runs").exists(), "nothing may be written (or requeued) for a refused job"


def test_every_template_trl_ships_passes_the_launch_check():
    from recipes.data import check_chat_template, named_chat_templates

    names = named_chat_templates()
    assert "cohere2" in names  # its {% break %} needs the loop controls transformers' environment has
    for name in names:
        check_chat_template(name)


def test_a_template_that_trips_the_sandbox_only_on_some_rows_is_a_config_error_not_a_crash():
    from transformers.utils.chat_template_utils import render_jinja_template

    template = ('{% for m in messages %}{% if m["content"] == "7" %}{{ "".__class__.__mro__ }}{% endif %}'
                '{{ m["content"] }}{% endfor %}')
    render_jinja_template([[{"role": "user", "content": "2"}]], chat_template=template)  # the launch sample passes
    with pytest.raises(Exception) as raised:  # a row of the data reaches the forbidden expression
        render_jinja_template([[{"role": "user", "content": "7"}]], chat_template=template)
    result = classify_exception(raised.value)
    assert result.exit_class == ExitClass.CONFIG_ERROR and result.exit_code == 4 and not result.bug
    assert result.message.startswith("data.chat_template: the trainer refused it (SecurityError: access to attribute")


def test_a_missing_mix_file_is_named_by_its_mix_entry(tmp_path):
    missing = str(tmp_path / "nowhere.jsonl")
    with pytest.raises(UserError) as err:
        compose_config(["data=mix", f"data.mix=[{{source: synthetic}}, {{source: jsonl, path: '{missing}'}}]"])
    assert err.value.exit_code == 4
    message = str(err.value)
    assert message.startswith(f"data.mix[1].path={missing!r}: no such file. Point data.mix[1].path at"), message
    assert "data.path" not in message and "drop the entry from data.mix" in message
    with pytest.raises(UserError, match=r"^data.path=./nowhere.jsonl.: no such file"):
        compose_config(["data=jsonl", "data.path=/nowhere.jsonl"])
