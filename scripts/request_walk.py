"""Which of serve_app's modules one request enters, counted from a trace: the walks docs/architecture.md
describes, measured rather than remembered.

    python -m scripts.request_walk

It serves a small repository in this process with the local server's parts (the same service, schedulers,
front ends and instance host as a Ray gateway that holds the instance), sends one request of each kind
with a stock tritonclient from another thread, and records every function call made in serve_app's
modules while the second of two identical requests is in flight (the first warms caches and lazy
imports).  Every thread the server starts is traced (``threading.setprofile`` before anything starts).
It prints, per request, the modules in the order they were first entered and how many modules and
packages that is.  What a Ray deployment adds on the way (the executor's channel to another process,
the sequence router's hop) is not in this process and not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import tempfile
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from scripts import example_models, python_models

_active = False
_entered: dict[str, None] = {}  # module -> None, in the order first entered


def _profile(frame: types.FrameType, event: str, arg: Any) -> None:
    if _active and event == "call":
        module = frame.f_globals.get("__name__", "")
        if module.startswith("serve_app.") and module not in _entered:
            _entered[module] = None


def traced(send: Callable[[], None]) -> list[str]:
    """The serve_app modules entered while ``send()`` (run twice, traced the second time) is in flight."""
    global _active
    send()
    _entered.clear()
    _active = True
    try:
        send()
    finally:
        _active = False
    return list(_entered)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_infer(http_port: int) -> Callable[[], None]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))

    def send() -> None:
        client.infer("add_sub", inputs)

    return send


def grpc_sequence_step(grpc_port: int) -> Callable[[], None]:
    """A START step of a stateful model over ModelStreamInfer (each send a new sequence)."""
    import queue

    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.ones((1, 1), np.int32))
    sequence = iter(range(1000, 2000))

    def send() -> None:
        client.async_stream_infer("py_stateful", [inp], sequence_id=next(sequence), sequence_start=True)
        answer = answers.get(timeout=60)
        if isinstance(answer, Exception):
            raise answer

    return send


def report(what: str, modules: list[str]) -> None:
    packages = {m.split(".")[1] for m in modules if m.count(".") >= 2}
    print(f"\n{what}: {len(modules)} modules in {len(packages)} packages")
    for module in modules:
        print(f"  {module.removeprefix('serve_app.')}")


async def main(repo: Path) -> None:
    from serve_app.front_ends import start_front_ends
    from serve_app.local.service import LocalService
    from serve_app.settings import ServerSettings

    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    settings = ServerSettings.from_args(
        {"model_repository": str(repo), "host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port,
         "metrics_port": metrics_port}
    )  # fmt: skip
    local = await asyncio.to_thread(LocalService.from_repository, repo)
    front = await start_front_ends(local.service, settings)
    try:
        report("HTTP POST /v2/models/add_sub/infer", await asyncio.to_thread(traced, http_infer(http_port)))
        step = await asyncio.to_thread(grpc_sequence_step, grpc_port)
        report("gRPC ModelStreamInfer, a sequence's START step", await asyncio.to_thread(traced, step))
    finally:
        await front.stop()
        local.close()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    threading.setprofile(_profile)
    sys.setprofile(_profile)
    with tempfile.TemporaryDirectory() as tmp:
        example_models.add_sub(Path(tmp), dynamic_batching=True)
        python_models.stateful(Path(tmp))
        asyncio.run(main(Path(tmp)))
