"""Chat messages to a prompt: a tokenizer's template rendered as transformers does, or the default."""

from __future__ import annotations

import json
import pathlib

import pytest

from serve_app.errors import InternalError, InvalidArgument
from serve_app.openai_api.chat_template import default_prompt, render

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}{{ messages | tojson }}"
)


def test_default() -> None:
    assert default_prompt(MESSAGES) == "system: be brief\nuser: hi\nassistant:"


def test_tokenizer_config(tmp_path: pathlib.Path) -> None:
    config = {"chat_template": TEMPLATE, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    prompt = render(str(tmp_path), MESSAGES)
    assert prompt.startswith("<s><|system|>\nbe brief</s>\n<|user|>\nhi</s>\n<|assistant|>\n")
    assert prompt.endswith(json.dumps(MESSAGES))
    with pytest.raises(InvalidArgument, match="no tools"):
        render(str(tmp_path), [{"role": "tool", "content": "x"}])


def test_named_templates_and_template_file(tmp_path: pathlib.Path) -> None:
    named = {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(named))
    assert render(str(tmp_path), MESSAGES) == "D"
    other = tmp_path / "other"
    other.mkdir()
    (other / "chat_template.jinja").write_text("{{ messages[-1]['content'] }}")
    assert render(str(other), MESSAGES) == "hi"


def test_sandboxed(tmp_path: pathlib.Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ ''.__class__.__mro__ }}"}))
    with pytest.raises(InvalidArgument):
        render(str(tmp_path), MESSAGES)


def test_missing_template(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InternalError, match="no chat template"):
        render(str(tmp_path), MESSAGES)
