"""Chat messages to one prompt: the tokenizer's chat template when there is one, else a plain default.

A tokenizer directory (``tokenizer_config.json``, or ``chat_template.jinja``
beside it) is rendered as transformers renders it: Jinja2's immutable sandbox
with ``trim_blocks`` and ``lstrip_blocks``, the ``tojson`` filter,
``raise_exception`` and ``strftime_now``, and the tokenizer's special tokens.
Nothing is downloaded: the directory must be on the gateway's disk.
Jinja2 comes with the ``openai`` extra.

The default, for models without a tokenizer, puts each message on its own
line as ``<role>: <content>`` and ends with ``assistant:``.
"""

from __future__ import annotations

import datetime
import functools
import json
import pathlib
from typing import Any

from serve_app.errors import InternalError, InvalidArgument

TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def default_prompt(messages: list[dict[str, str]]) -> str:
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def render(tokenizer_dir: str, messages: list[dict[str, str]]) -> str:
    """``messages`` through the chat template of ``tokenizer_dir``, with the generation prompt added."""
    template, tokens = _load(tokenizer_dir)
    from jinja2.exceptions import TemplateError

    try:
        return str(_compile(template).render(messages=messages, add_generation_prompt=True, tools=None, **tokens))
    except TemplateError as exc:
        raise InvalidArgument(f"the chat template refused the messages: {exc}") from None


@functools.lru_cache(maxsize=32)
def _load(tokenizer_dir: str) -> tuple[str, dict[str, str]]:
    """The template and special tokens of a tokenizer directory (read once per directory)."""
    root = pathlib.Path(tokenizer_dir)
    config: dict[str, Any] = {}
    try:
        if (root / TOKENIZER_CONFIG).is_file():
            config = json.loads((root / TOKENIZER_CONFIG).read_text())
        template = (
            (root / TEMPLATE_FILE).read_text() if (root / TEMPLATE_FILE).is_file() else config.get("chat_template")
        )
    except (OSError, ValueError) as exc:
        raise InternalError(f"could not read the tokenizer in {tokenizer_dir}: {exc}") from None
    if isinstance(template, list):  # named templates: the default one
        template = next(
            (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
        )
    if not isinstance(template, str):
        raise InternalError(f"the tokenizer in {tokenizer_dir} has no chat template")
    tokens = {}
    for name in _SPECIAL_TOKENS:
        value = config.get(name)
        if isinstance(value, dict):  # an AddedToken written out
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return template, tokens


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> Any:
    try:
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise InternalError("chat templates need Jinja2: install serve_app with the 'openai' extra") from None

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise InternalError(f"the chat template does not compile: {exc}") from None
