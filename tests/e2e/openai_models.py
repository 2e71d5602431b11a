"""Models for test_openai.py: the LLM conventions the OpenAI port serves, and one it must not list."""

from __future__ import annotations

import json
import pathlib

from scripts import llm_models

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + m['role']) }}"
    "{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build(repo: pathlib.Path) -> None:
    llm_models.text_llm(repo)  # vLLM's conventions, decoupled
    llm_models.trtllm_style(repo)  # TensorRT-LLM's, one response
    chat = llm_models.text_llm(repo, name="py_llm_chat")
    tokenizer = chat / "tokenizer"
    tokenizer.mkdir(exist_ok=True)
    config = {"chat_template": CHAT_TEMPLATE, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    config_file = chat / "config.pbtxt"
    config_file.write_text(
        config_file.read_text() + 'parameters { key: "tokenizer" value: { string_value: "tokenizer" } }\n'
    )
