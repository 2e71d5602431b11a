"""An OpenAI completion or chat request body, read and checked before any model is asked.

Fields the front end cannot honour are refused, not ignored: a client that
asks for ``n=2`` or ``logprobs`` must not get a silent single choice.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from serve_app.errors import InvalidArgument

DEFAULT_MAX_TOKENS = 16  # Triton's front end's --default-max-tokens, and OpenAI's completions default

# Read but not passed to the model (Triton's front end drops them too).
_IGNORED = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls"})
# Sampling fields that go to the model: in sampling_parameters (vLLM) or as inputs (TensorRT-LLM).
SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "seed")
_COMMON = frozenset({"model", "stream", "stream_options", "max_tokens", "stop", "n", *SAMPLING, *_IGNORED})
_COMPLETION = _COMMON | {"prompt", "echo", "logprobs", "suffix", "best_of", "logit_bias"}
_CHAT = _COMMON | {
    "messages", "max_completion_tokens", "logprobs", "top_logprobs", "logit_bias", "tools", "tool_choice",
    "functions", "function_call", "response_format",
}  # fmt: skip


@dataclass(slots=True)
class Params:
    """What the mapping needs of a request: the prompt (or messages) and the generation settings."""

    model: str
    stream: bool = False
    include_usage: bool = False
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: list[str] = field(default_factory=list)
    echo: bool = False
    prompt: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)
    sampling: dict[str, float | int] = field(default_factory=dict)  # the SAMPLING fields given


def parse_body(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        raise InvalidArgument("the request body is not valid JSON") from None
    if not isinstance(obj, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return obj


def completion_params(obj: dict[str, Any]) -> Params:
    _known(obj, _COMPLETION)
    if _given(obj, "suffix"):
        raise InvalidArgument("'suffix' is not supported")
    if _given(obj, "best_of") and obj["best_of"] != 1:
        raise InvalidArgument("'best_of' other than 1 is not supported")
    if _given(obj, "logprobs") and obj["logprobs"] != 0:
        raise InvalidArgument("'logprobs' is not supported")
    params = _common(obj, default_max=DEFAULT_MAX_TOKENS)
    prompt = obj.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidArgument("'prompt' must be a string (a batch of prompts, or token ids, is not supported)")
    params.prompt = prompt
    params.echo = _bool(obj, "echo", False)
    return params


def chat_params(obj: dict[str, Any]) -> Params:
    _known(obj, _CHAT)
    for name in ("tools", "tool_choice", "functions", "function_call"):
        if _given(obj, name) and obj[name] != "none":
            raise InvalidArgument(f"'{name}' is not supported: no tool call parser is configured")
    if obj.get("logprobs") or _given(obj, "top_logprobs"):
        raise InvalidArgument("'logprobs' and 'top_logprobs' are not supported")
    fmt = obj.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise InvalidArgument('\'response_format\' other than {"type": "text"} is not supported')
    limit = obj["max_completion_tokens"] if _given(obj, "max_completion_tokens") else obj.get("max_tokens")
    params = _common(dict(obj, max_tokens=limit), default_max=DEFAULT_MAX_TOKENS)
    params.messages = _messages(obj.get("messages"))
    return params


def _common(obj: dict[str, Any], *, default_max: int) -> Params:
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidArgument("'model' must name a model")
    params = Params(model=model, stream=_bool(obj, "stream", False))
    options = obj.get("stream_options")
    if options is not None:
        if not params.stream:
            raise InvalidArgument("'stream_options' can only be used when 'stream' is true")
        if not isinstance(options, dict):
            raise InvalidArgument("'stream_options' must be an object")
        params.include_usage = _bool(options, "include_usage", False)
    if _given(obj, "n") and obj["n"] != 1:
        raise InvalidArgument(f"Received n={obj['n']}, but only single choice (n=1) is currently supported")
    if _given(obj, "logit_bias"):
        raise InvalidArgument("'logit_bias' is not supported")
    params.max_tokens = default_max if obj.get("max_tokens") is None else _int(obj, "max_tokens", minimum=1)
    params.stop = _stop(obj.get("stop"))
    for name in SAMPLING:
        if _given(obj, name):
            params.sampling[name] = _int(obj, name, minimum=0) if name == "seed" else _number(obj, name)
    return params


def _known(obj: dict[str, Any], known: frozenset[str] | set[str]) -> None:
    unknown = sorted(set(obj) - known)
    if unknown:
        raise InvalidArgument(f"Unrecognized request argument(s) supplied: {', '.join(unknown)}")


def _given(obj: dict[str, Any], name: str) -> bool:
    return obj.get(name) is not None


def _bool(obj: dict[str, Any], name: str, default: bool) -> bool:
    value = obj.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidArgument(f"'{name}' must be a boolean")
    return value


def _int(obj: dict[str, Any], name: str, *, minimum: int) -> int:
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"'{name}' must be an integer of at least {minimum}")
    return value


def _number(obj: dict[str, Any], name: str) -> float:
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"'{name}' must be a number")
    return float(value)


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    words = [value] if isinstance(value, str) else value
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words) or len(words) > 4:
        raise InvalidArgument("'stop' must be a string or a list of up to 4 strings")
    return list(words)


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise InvalidArgument("'messages' must be a non-empty list")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidArgument(f"messages[{i}] must be an object with a 'role'")
        out.append({"role": message["role"], "content": _content(i, message.get("content"))})
    return out


def _content(i: int, content: Any) -> str:
    """A message's text: a string, or the text parts of a list (other parts are refused)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidArgument(f"messages[{i}]: only text content parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidArgument(f"messages[{i}].content must be a string or a list of text parts")
