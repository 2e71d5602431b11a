"""The JSON and events a client of OpenAI's API reads."""

from __future__ import annotations

import json

from serve_app.errors import InvalidArgument, NotFound
from serve_app.openai_api.answers import DONE, Answer, error_for
from serve_app.openai_api.conventions import Piece


def events(raw: list[bytes]) -> list[object]:
    out: list[object] = []
    for e in raw:
        assert e.startswith(b"data: ") and e.endswith(b"\n\n")
        body = e[6:-2]
        out.append("[DONE]" if body == b"[DONE]" else json.loads(body))
    return out


def test_unary_completion_with_usage_and_length() -> None:
    answer = Answer(chat=False, model="m", max_tokens=2)
    body = answer.unary([Piece(" a", 3, 1), Piece(" b", 3, 1)])
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"] == [{"index": 0, "text": " a b", "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_unary_chat_without_counts() -> None:
    body = Answer(chat=True, model="m", max_tokens=16).unary([Piece("hello")])
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] is None


def test_chat_stream() -> None:
    answer = Answer(chat=True, model="m", max_tokens=16, include_usage=True)
    raw = [*answer.opening(), answer.chunk(Piece(" x", 2, 1)), answer.chunk(Piece("", 2, 0)), *answer.closing()]
    got = events([e for e in raw if e is not None])
    assert got[-1] == "[DONE]" and raw[-1] == DONE
    role, content, finish, usage = got[:-1]
    assert isinstance(role, dict) and role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert isinstance(content, dict) and content["choices"][0]["delta"] == {"content": " x"}
    assert content["object"] == "chat.completion.chunk"
    assert isinstance(finish, dict) and finish["choices"][0]["finish_reason"] == "stop"
    assert isinstance(usage, dict) and usage["choices"] == [] and usage["usage"]["completion_tokens"] == 1


def test_completion_stream_has_no_opening() -> None:
    answer = Answer(chat=False, model="m", max_tokens=1)
    assert answer.opening() == []
    chunk = events([answer.chunk(Piece(" y", 1, 1)) or b""])[0]
    assert isinstance(chunk, dict) and chunk["choices"][0]["text"] == " y"
    finish = events(answer.closing())[0]
    assert isinstance(finish, dict) and finish["choices"][0]["finish_reason"] == "length"


def test_error_shape() -> None:
    assert error_for(NotFound("no such model"), 404) == {
        "error": {"message": "no such model", "type": "invalid_request_error", "param": None, "code": "model_not_found"}
    }
    assert error_for(InvalidArgument("bad"), 500)["error"]["type"] == "server_error"
