"""The JSON a client of OpenAI's API reads: unary answers, stream chunks, usage and errors.

Shapes follow Triton's front end: a chat stream opens with a chunk that sets
the role, each response of the model is one chunk, a last chunk carries the
finish reason, an optional one the usage (``stream_options.include_usage``),
and ``data: [DONE]`` ends it.  The finish reason is ``length`` when the
model reports as many tokens as ``max_tokens`` allowed, else ``stop``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from serve_app.errors import ErrorCode, ServeError
from serve_app.openai_api.conventions import Piece

DONE = b"data: [DONE]\n\n"
# A text chunk's choice around its JSON string, for completions (False) and chats (True).
_OPEN = {False: b'[{"index":0,"text":', True: b'[{"index":0,"delta":{"content":'}
_CLOSE = {
    False: b',"logprobs":null,"finish_reason":null}]}\n\n',
    True: b'},"logprobs":null,"finish_reason":null}]}\n\n',
}


def event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def error_json(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def error_for(exc: ServeError, status: int) -> dict[str, Any]:
    code = "model_not_found" if exc.code is ErrorCode.NOT_FOUND else None
    return error_json(status, exc.message, code)


def model_entry(name: str, created: int, owned_by: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": owned_by}


@dataclass(slots=True)
class Answer:
    """One request's answer, built as the model's responses come."""

    chat: bool
    model: str
    max_tokens: int
    include_usage: bool = False
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    _prefix: bytes = field(default=b"", init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    def add(self, piece: Piece) -> None:
        """Count the tokens one response reports (the prompt's once, the completion's summed)."""
        if piece.prompt_tokens is not None and self.prompt_tokens is None:
            self.prompt_tokens = piece.prompt_tokens
        if piece.completion_tokens is not None:
            self.completion_tokens = (self.completion_tokens or 0) + piece.completion_tokens

    def usage(self) -> dict[str, int] | None:
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        total = self.prompt_tokens + self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": total}

    def finish_reason(self) -> str:
        done = self.completion_tokens is not None and self.completion_tokens >= self.max_tokens
        return "length" if done else "stop"

    def unary(self, pieces: list[Piece]) -> dict[str, Any]:
        for piece in pieces:
            self.add(piece)
        text = "".join(p.text for p in pieces)
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice.update(logprobs=None, finish_reason=self.finish_reason())
        return {**self._head(unary=True), "choices": [choice], "usage": self.usage()}

    def opening(self) -> list[bytes]:
        """The events before the first response: a chat stream's role chunk."""
        return [self._chunk({"role": "assistant", "content": ""}, None)] if self.chat else []

    def chunk(self, piece: Piece) -> bytes | None:
        """One response's chunk (None for a response without text, such as a usage-only one)."""
        self.add(piece)
        if not piece.text:
            return None
        if not self._prefix:  # every text chunk but its text is the same: its bytes are made once
            head = json.dumps({**self._head(unary=False), "choices": []}, separators=(",", ":"))
            self._prefix = b"data: " + head[: -len("[]}")].encode() + _OPEN[self.chat]
        return self._prefix + json.dumps(piece.text).encode() + _CLOSE[self.chat]

    def closing(self) -> list[bytes]:
        """The finish chunk, the usage chunk when asked for, and the end of the stream."""
        out = [self._chunk({} if self.chat else "", self.finish_reason())]
        if self.include_usage:
            out.append(event({**self._head(unary=False), "choices": [], "usage": self.usage()}))
        return [*out, DONE]

    def _chunk(self, delta: dict[str, str] | str, finish: str | None) -> bytes:
        if isinstance(delta, dict):
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": delta}
        choice.update(logprobs=None, finish_reason=finish)
        return event({**self._head(unary=False), "choices": [choice]})

    def _head(self, *, unary: bool) -> dict[str, Any]:
        kind = ("chat.completion" if unary else "chat.completion.chunk") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "system_fingerprint": None}
