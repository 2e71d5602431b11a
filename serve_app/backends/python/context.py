"""What model code reaches through ``pb_utils`` beyond its requests: its directory, BLS, model control.

The backend sets a :class:`ModelContext` around every call into the model (``initialize``,
``execute``, ``finalize``, a decoupled model's later sends), in a context variable, so
``pb_utils.InferenceRequest(...).exec()`` or ``pb_utils.get_model_dir()`` know which model calls
them even when several run in one process (tests, ``--local``).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncGenerator
from dataclasses import dataclass
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


def current() -> ModelContext | None:
    return CURRENT.get()
