"""What model code reaches through ``pb_utils`` beyond its requests: its directory, BLS, model control.

The backend sets a :class:`ModelContext` around every call into the model (``initialize``,
``execute``, ``finalize``, a decoupled model's later sends), in a context variable, so
``pb_utils.InferenceRequest(...).exec()`` or ``pb_utils.get_model_dir()`` know which model calls
them even when several run in one process (tests, ``--local``).

A thread the model starts itself has none of that context (threads do not inherit context
variables).  Triton serves BLS from such threads whenever the instance is between ``initialize``
and ``finalize``, so an instance in that state is registered by its version directory, and a call
with no context is the model's whose code is on the calling thread's stack.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import sys
import threading
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

from serve_app.inference.types import InferRequest, InferResponse, StreamItem


class ServerLink(Protocol):
    """How a Python model reaches the server from inside ``execute``: BLS and model control."""

    async def infer(self, request: InferRequest) -> InferResponse:
        """A request to another model, through that model's scheduler (batching, sequences, statistics)."""
        ...

    def infer_stream(self, request: InferRequest) -> AsyncGenerator[StreamItem, None]:
        """The same, for a decoupled model: its responses as they come (the last one marked final)."""
        ...

    async def load(self, name: str, config: str, files: dict[str, bytes]) -> None: ...

    async def unload(self, name: str, unload_dependents: bool) -> None: ...

    async def is_ready(self, name: str, version: str) -> bool: ...


@dataclass
class ModelContext:
    model_name: str
    model_dir: str  # the version directory: pb_utils.get_model_dir()
    instance_name: str
    link: ServerLink | None = None  # None: BLS and model control are not available here
    loop: asyncio.AbstractEventLoop | None = None  # where ``link``'s coroutines run
    in_execute: bool = False

    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """Where the link's coroutines run: the one given, else the link's own (a link may learn its loop late)."""
        loop: asyncio.AbstractEventLoop | None = self.loop or getattr(self.link, "loop", None)
        return loop


CURRENT: contextvars.ContextVar[ModelContext | None] = contextvars.ContextVar("serve_app_python_model", default=None)


# Instances between initialize and finalize, by version directory (with a trailing separator).
_SERVING: dict[str, list[ModelContext]] = {}
_SERVING_LOCK = threading.Lock()


def serving(context: ModelContext) -> None:
    """``context``'s instance is initialized: its model's own threads may call BLS from now on."""
    with _SERVING_LOCK:
        _SERVING.setdefault(_key(context.model_dir), []).append(context)


def stopped(context: ModelContext) -> None:
    """``context``'s instance is finalizing (or failed): no longer found from its model's threads."""
    with _SERVING_LOCK:
        key = _key(context.model_dir)
        contexts = [c for c in _SERVING.get(key, []) if c is not context]
        if contexts:
            _SERVING[key] = contexts
        else:
            _SERVING.pop(key, None)


def _key(model_dir: str) -> str:
    return os.path.join(os.path.abspath(model_dir), "")


def _from_stack() -> ModelContext | None:
    """The serving instance whose model's code is on this thread's stack (innermost first)."""
    if not _SERVING:
        return None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        for key, contexts in list(_SERVING.items()):
            if filename.startswith(key) and contexts:
                return contexts[0]
        frame = frame.f_back
    return None


def current() -> ModelContext | None:
    """The calling model's context: the one set around the call, else (a thread of the model's own) the
    serving instance whose code called."""
    return CURRENT.get() or _from_stack()
