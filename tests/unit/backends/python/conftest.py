"""The ``make`` fixture: a PythonBackend built from model code written into ``tmp_path``."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from serve_app.backends import BackendContext
from serve_app.backends.python.backend import PythonBackend
from serve_app.config import autocomplete_config, parse_config

INSTANCE = "m_0_0"

CONFIG = """
name: "m"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ {dims} ] }}
]
{extra}
"""

Factory = Callable[..., PythonBackend]


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Factory]:
    """Builds backends from model code (closing them after the test; ``sys.path`` restored)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    made: list[PythonBackend] = []

    def build(
        code: str | None,
        *,
        max_batch_size: int = 0,
        dims: str = "4",
        extra: str = "",
        device_kind: str = "KIND_CPU",
        gpu_ids: tuple[int, ...] = (),
        server_link: object = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> PythonBackend:
        model_file = model_path(tmp_path)
        model_file.parent.mkdir(parents=True, exist_ok=True)
        if code is not None:
            model_file.write_text(textwrap.dedent(code).lstrip())
        text = CONFIG.format(max_batch_size=max_batch_size, dims=dims, extra=extra)
        config = autocomplete_config(
            parse_config(text, model="m", path="config.pbtxt"),
            model="m",
            model_dir=model_file.parent.parent,
            model_file=model_file,
        )
        ctx = BackendContext(
            model_name="m",
            version=1,
            config=config,
            model_file=model_file,
            device_kind=device_kind,
            gpu_ids=gpu_ids,
            instance_name=INSTANCE,
            server_link=server_link,
            loop=loop,
        )
        backend = PythonBackend(ctx)
        made.append(backend)
        return backend

    yield build
    for backend in made:
        loop_thread = getattr(backend, "_loop", None)
        backend.close()
        if loop_thread is not None:
            # wait for the loop's own thread to close it, so no later test sees its ResourceWarning
            close_loop(loop_thread)


def close_loop(loop_thread: Any) -> bool:
    """Wait for an instance's event-loop thread to end (it closes its loop as it does); True if it did."""
    loop_thread._thread.join(timeout=60)
    if loop_thread._thread.is_alive():
        return False
    closed: bool = loop_thread.loop.is_closed()
    return closed


def model_path(tmp_path: Path) -> Path:
    return tmp_path / "m" / "1" / "model.py"
