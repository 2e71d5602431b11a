#!/usr/bin/env python3
"""What a Python-backend model costs per request, against the ONNX model and against raw calls, in one run.

    python -m scripts.bench_python [--seconds 5] [--concurrency 1,4] [--server-arg=...]

One repository: the ``add_sub`` ONNX model; Triton's ``add_sub`` as a ``model.py`` twice, in a process of
its own (``py_add_sub``, the default) and in the gateway (``py_add_sub_gw``, ``dedicated_process:
false``); and ``py_chain``, a model that runs ``py_add_sub`` twice by BLS.  `python -m serve_app` serves
it on free ports; closed-loop tritonclient gRPC clients (one thread and one connection each) measure
requests per second and latency for each model, and for the same two-step pipeline driven from the
client (two ``py_add_sub`` calls per request).  After the server stops, the same ``model.py``'s
``execute`` is called directly in this process (with the same ``pb_utils`` requests the backend builds)
and the ONNX model through onnxruntime, so the table ends with the ratios that matter: the Python model
against the ONNX model and against its own ``execute``, and the BLS chain against the client's two calls.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from scripts import example_models, python_models
from scripts.bench import raw_onnxruntime, start_server
from tests.support.net import free_port

A = np.arange(16, dtype=np.float32)
B = np.full(16, 2.0, dtype=np.float32)
SHARED = 'parameters { key: "dedicated_process" value: { string_value: "false" } }\n'


@dataclass
class Point:
    name: str
    conc: int
    per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    errors: list[str] = field(default_factory=list)


def build(repo: pathlib.Path) -> None:
    example_models.add_sub(repo)  # FP32 [16], batched: requests carry a batch dimension of 1
    python_models.add_sub(repo)
    python_models.add_sub(repo, name="py_add_sub_gw", extra=SHARED)
    python_models.bls_chain(repo)


def call_for(url: str, name: str):  # type: ignore[no-untyped-def]
    """One request's worth of work for ``name`` (a model, or ``client_chain``), on a client of its own."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)

    def inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
        out = []
        for n, arr in (("INPUT0", a), ("INPUT1", b)):
            t = grpcclient.InferInput(n, list(arr.shape), "FP32")
            t.set_data_from_numpy(arr)
            out.append(t)
        return out

    if name == "add_sub":
        ins = inputs(A[None], B[None])
        return lambda: client.infer("add_sub", ins)
    if name == "client_chain":

        def chain() -> None:
            r = client.infer("py_add_sub", inputs(A, B))
            r = client.infer("py_add_sub", inputs(r.as_numpy("OUTPUT0"), r.as_numpy("OUTPUT1")))
            if not np.array_equal(r.as_numpy("OUTPUT0"), 2 * A):
                raise AssertionError("wrong answer")

        return chain
    ins = inputs(A, B)
    return lambda: client.infer(name, ins)


def measure(url: str, name: str, conc: int, seconds: float) -> Point:
    point = Point(name, conc)
    latencies: list[list[float]] = [[] for _ in range(conc)]
    calls = [call_for(url, name) for _ in range(conc)]
    for call in calls:  # warm up: connections, first executions
        for _ in range(20):
            call()
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                calls[i]()
            except Exception as exc:
                point.errors.append(str(exc)[:200])
                return
            latencies[i].append(time.perf_counter() - t0)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(conc)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spent = time.monotonic() - t0
    flat = sorted(x for lat in latencies for x in lat)
    if flat:
        point.per_s = len(flat) / spent
        point.p50_ms = statistics.median(flat) * 1000
        point.p99_ms = flat[min(len(flat) - 1, int(len(flat) * 0.99))] * 1000
    return point


def raw_execute(model_file: pathlib.Path, seconds: float) -> float:
    """``execute`` of the model.py called directly, one request per call: what the backend wraps."""
    import json

    from serve_app.backends.python import utils as pb_utils
    from serve_app.backends.python.backend import install_utils_module, load_model_module

    install_utils_module()
    model = load_model_module(model_file, "_bench_raw_model").TritonPythonModel()
    config = {"output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32"}, {"name": "OUTPUT1", "data_type": "TYPE_FP32"}]}
    model.initialize({"model_config": json.dumps(config)})
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        request = pb_utils.InferenceRequest.received("", {"INPUT0": A, "INPUT1": B}, ("OUTPUT0", "OUTPUT1"), {})
        model.execute([request])
        n += 1
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--server-arg", action="append", default=[])
    args = parser.parse_args(argv)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    names = ["add_sub", "py_add_sub", "py_add_sub_gw", "py_chain", "client_chain"]
    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp) / "repo"
        build(repo)
        ports = (free_port(), free_port(), free_port())
        proc = start_server(repo, ports, pathlib.Path(tmp) / "server.log", args.server_arg)
        url = f"127.0.0.1:{ports[1]}"
        points: list[Point] = []
        try:
            for conc in concurrency:
                for name in names:
                    points.append(measure(url, name, conc, args.seconds))
                    print(f"  {name} c={conc}: {points[-1].per_s:.0f}/s", file=sys.stderr)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        raw_py = raw_execute(repo / "py_add_sub" / "1" / "model.py", args.seconds)
        raw_ort = raw_onnxruntime(repo / "add_sub" / "1" / "model.onnx", {"INPUT0": A[None], "INPUT1": B[None]}, 1)
    by = {(p.name, p.conc): p for p in points}
    print(f"{'model':<16}{'conc':>5}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}  errors")
    for p in points:
        print(f"{p.name:<16}{p.conc:>5}{p.per_s:>9.0f}{p.p50_ms:>9.2f}{p.p99_ms:>9.2f}  {p.errors[:1] or ''}")
    print(f"\nraw execute() of py_add_sub's model.py: {raw_py:,.0f} calls/s; raw onnxruntime add_sub: {raw_ort:,.0f}/s")
    for conc in concurrency:

        def ratio(a: str, b: str, c: int = conc) -> str:
            x, y = by[(a, c)].per_s, by[(b, c)].per_s
            return f"{x / y:.2f}" if y else "n/a"

        print(
            f"c={conc}: py_add_sub / add_sub (ONNX) {ratio('py_add_sub', 'add_sub')}; "
            f"py_add_sub_gw / add_sub {ratio('py_add_sub_gw', 'add_sub')}; "
            f"BLS chain / client chain {ratio('py_chain', 'client_chain')}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
