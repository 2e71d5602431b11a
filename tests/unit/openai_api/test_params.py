"""Reading OpenAI request bodies: what is mapped, what is refused."""

from __future__ import annotations

import pytest

from serve_app.errors import InvalidArgument
from serve_app.openai_api.params import DEFAULT_MAX_TOKENS, chat_params, completion_params, parse_body


def test_completion_fields() -> None:
    p = completion_params(
        {"model": "m", "prompt": "hi", "max_tokens": 5, "temperature": 0.5, "top_p": 1, "seed": 3, "stop": "x",
         "stream": True, "stream_options": {"include_usage": True}, "echo": True, "user": "u", "n": 1}
    )  # fmt: skip
    assert (p.model, p.prompt, p.max_tokens, p.stop, p.stream, p.include_usage, p.echo) == (
        "m", "hi", 5, ["x"], True, True, True
    )  # fmt: skip
    assert p.sampling == {"temperature": 0.5, "top_p": 1.0, "seed": 3}


def test_defaults() -> None:
    p = completion_params({"model": "m", "prompt": ["one"]})
    assert (p.prompt, p.max_tokens, p.stream, p.stop, p.sampling) == ("one", DEFAULT_MAX_TOKENS, False, [], {})


def test_chat_messages_and_max_completion_tokens() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    messages = [{"role": "system", "content": "be"}, {"role": "user", "content": parts}]
    p = chat_params({"model": "m", "max_tokens": 3, "max_completion_tokens": 7, "messages": messages})
    assert p.max_tokens == 7
    assert p.messages == [{"role": "system", "content": "be"}, {"role": "user", "content": "ab"}]


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "prompt": "x", "n": 2},
        {"model": "m", "prompt": "x", "logprobs": 2},
        {"model": "m", "prompt": "x", "suffix": "s"},
        {"model": "m", "prompt": "x", "best_of": 3},
        {"model": "m", "prompt": "x", "logit_bias": {"1": 2}},
        {"model": "m", "prompt": "x", "stream_options": {"include_usage": True}},
        {"model": "m", "prompt": "x", "max_tokens": 0},
        {"model": "m", "prompt": "x", "temperature": "hot"},
        {"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]},
        {"model": "m", "prompt": [1, 2]},
        {"model": "m", "prompt": "x", "frobnicate": 1},
        {"prompt": "x"},
    ],
)
def test_completion_refused(body: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        completion_params(body)


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": []},
        {"model": "m", "messages": [{"content": "x"}]},
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
    ],
)
def test_chat_refused(body: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        chat_params(body)


def test_body_must_be_an_object() -> None:
    with pytest.raises(InvalidArgument):
        parse_body(b"[1]")
    with pytest.raises(InvalidArgument):
        parse_body(b"{")
