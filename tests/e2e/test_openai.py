"""The OpenAI port against the real server, through the official ``openai`` client (sync and async)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import openai
import pytest

from tests.e2e.conftest import Server

LLM = "py_llm"  # vLLM backend's conventions, decoupled: one word per response
CHAT = "py_llm_chat"  # the same, with a tokenizer directory whose chat template renders the messages
TRTLLM = "py_trtllm"  # TensorRT-LLM's conventions, one response


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0)


def test_models(client: openai.OpenAI) -> None:
    ids = {m.id for m in client.models.list()}
    assert {LLM, CHAT, TRTLLM} <= ids
    assert "add_sub" not in ids and "py_tokens" not in ids  # models off the conventions are not listed
    assert client.models.retrieve(LLM).id == LLM
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("add_sub")


def test_completion_unary(client: openai.OpenAI) -> None:
    out = client.completions.create(model=LLM, prompt="one two three", max_tokens=4)
    assert out.object == "text_completion" and out.model == LLM
    assert out.choices[0].text == " three two one three"
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (3, 4)


def test_completion_echo_and_stop(client: openai.OpenAI) -> None:
    out = client.completions.create(model=LLM, prompt="a b c", max_tokens=10, echo=True, stop=[" a"])
    assert out.choices[0].text == "a b c c b"
    assert out.choices[0].finish_reason == "stop"


def test_completion_stream(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model=LLM, prompt="x y", max_tokens=3, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert texts == [" y", " x", " y", ""]
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_chat_unary_default_template(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=LLM, messages=[{"role": "user", "content": "hello world"}], max_tokens=4)
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == " assistant: world hello user:"  # "user: hello world\nassistant:"


def test_chat_tokenizer_template(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hello world"}]
    out = client.chat.completions.create(model=CHAT, messages=messages, max_tokens=3)  # type: ignore[arg-type]
    assert out.choices[0].message.content == " <|assistant|> world <s><|user|>hello"
    with pytest.raises(openai.BadRequestError, match="unknown role"):
        client.chat.completions.create(model=CHAT, messages=[{"role": "developer", "content": "x"}])


def test_chat_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=LLM, messages=[{"role": "user", "content": "a b"}], max_tokens=3, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert content == " assistant: b a"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_trtllm_conventions(client: openai.OpenAI) -> None:
    out = client.completions.create(model=TRTLLM, prompt="p q r", max_tokens=2, stop="nothing")
    assert out.choices[0].text == " r q"
    chunks = list(client.completions.create(model=TRTLLM, prompt="p q", max_tokens=2, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == " q p"


def test_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="no_such_model", prompt="x")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="LLM conventions"):
        client.completions.create(model="add_sub", prompt="x")
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.completions.create(model=LLM, prompt="x", n=2)
    with pytest.raises(openai.BadRequestError, match="'temperature' is not supported by model 'py_trtllm'"):
        client.completions.create(model=TRTLLM, prompt="x", temperature=0.5)
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):  # the model itself refuses it
        client.completions.create(model=LLM, prompt="x", presence_penalty=1.0)
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):  # ... streamed too, before any chunk
        list(client.completions.create(model=LLM, prompt="x", presence_penalty=1.0, stream=True))
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(
            model=LLM,
            messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )


def test_async_client(server: Server) -> None:
    async def run() -> tuple[str, str, str | None]:
        async with openai.AsyncOpenAI(base_url=server.openai_url, api_key="unused", max_retries=0) as client:
            unary = await client.completions.create(model=LLM, prompt="k l", max_tokens=2)
            stream = await client.chat.completions.create(
                model=LLM, messages=[{"role": "user", "content": "m"}], max_tokens=2, stream=True
            )
            streamed = "".join([c.choices[0].delta.content or "" async for c in stream])
            models = [m.id async for m in client.models.list()]
            assert LLM in models
            try:
                await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
            except openai.NotFoundError as exc:
                return unary.choices[0].text, streamed, exc.code
            return unary.choices[0].text, streamed, None

    assert asyncio.run(run()) == (" l k", " assistant: m", "model_not_found")


def test_counted_in_statistics(server: Server, client: openai.OpenAI) -> None:
    def successes() -> int:
        url = f"http://{server.http_url}/v2/models/{TRTLLM}/stats"
        with urllib.request.urlopen(url, timeout=10) as r:
            stats = json.load(r)["model_stats"][0]
        return int(stats["inference_stats"]["success"]["count"])

    before = successes()
    client.completions.create(model=TRTLLM, prompt="s", max_tokens=1)
    assert successes() == before + 1
