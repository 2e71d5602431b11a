#!/usr/bin/env python3
"""Where a request's CPU goes, layer by layer: the gateway and a Python model's process under load.

    python -m scripts.request_budget [--protocols http,grpc] [--concurrency 16] [--seconds 8]

Serves ``py_add_sub`` (a Python-backend add_sub, FP32 [16], ``max_batch_size 8``, its own process as
Python models have by default) with ``python -m serve_app`` (Ray), loads it with tritonclient's asyncio
clients, and while the load runs samples both processes with py-spy and reads their CPU time from
/proc.  Samples of threads blocked in a wait are dropped; the others are sorted into layers by the
innermost frame that names one, each standing for one sampling interval of CPU.  What /proc counts
beyond them is time py-spy cannot see (Ray's C++ threads, the kernel's share of system calls).  Each
process's busiest thread is also given as the scheduler counts it: the share of the time it ran and the
share it was runnable but waited for a CPU, beside how many of the machine's cores were busy.
``--serve-app DIR`` runs the server from another checkout, so one script measures two builds.  Needs py-spy.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

from scripts.bench import start_server, stop_server
from tests.support.net import free_port

MODEL_PY = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32)),
            ]))
        return responses
"""
CONFIG = """name: "py_add_sub"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

RATE_HZ = 500
# (layer, patterns of a frame's file) in the order they are tried, innermost frame first.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("execute (model, pb_utils)", ("serve_app/backends/", "serve_app/runtime/", "model.py", "numpy/")),
    ("hop (channel, pickle)", ("serve_app/transport/", "serve_app/rayserve/executor", "pickle")),
    ("host (instance, thread hand-off)", ("serve_app/hosting/", "concurrent/futures")),
    ("validate", ("serve_app/inference/validate", "serve_app/inference/signature")),
    ("decode / encode", ("serve_app/protocol/", "google/protobuf", "json")),
    ("schedule", ("serve_app/scheduling/", "serve_app/service/", "serve_app/inference/")),
    ("gRPC framing (HTTP/2)", ("serve_app/grpc_server/", "grpc/", "hpack/", "h2/", "hyperframe/")),
    ("HTTP framing and routing", ("serve_app/http_server/", "uvicorn/", "starlette/", "httptools/")),
    ("Ray (metrics, control loop)", ("ray/",)),
    ("event loop and sockets", ("asyncio/", "uvloop", "selectors", "socket", "ssl")),
]
# Leaves where a thread waits (a lock, a queue, epoll, Ray's core worker loop): not CPU.
IDLE = re.compile(
    r"^\s*(?:\w+\.)*(wait|_wait_for_tstate_lock|select|poll|_worker|main_loop|run|sleep|get|acquire|accept|"
    r"readinto|_recv_into|run_forever|serve_forever|<module>)\s"
)


def build(repo: pathlib.Path) -> None:
    model = repo / "py_add_sub"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(MODEL_PY)
    (model / "config.pbtxt").write_text(CONFIG)


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(pathlib.Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[parent].append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def find(root: int, marker: str) -> int:
    for pid in descendants(root):
        try:
            if marker in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return pid
        except OSError:
            continue
    raise SystemExit(f"no process of the server has '{marker}' in its command line")


def thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of the process's threads, summed by thread name."""
    out: collections.Counter[str] = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            head, _, rest = pathlib.Path(f"/proc/{pid}/task/{tid}/stat").read_text().rpartition(")")
        except OSError:
            continue
        name = head.split("(", 1)[1]
        fields = rest.split()
        out[name] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return dict(out)


def sched_ns(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread's nanoseconds on a CPU and runnable but waiting for one (the scheduler's own counts)."""
    out: dict[int, tuple[int, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            on_cpu, waiting, _ = pathlib.Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        out[int(tid)] = (int(on_cpu), int(waiting))
    return out


def busiest(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], wall_ns: int) -> tuple[float, float]:
    """The busiest thread's shares of a window: on a CPU, and waiting for one.  A thread that waits while a
    core idles is a bubble no CPU per request shows."""
    if not after or wall_ns <= 0:
        return 0.0, 0.0
    tid = max(after, key=lambda t: after[t][0] - before.get(t, (0, 0))[0])
    on_cpu, waiting = (a - b for a, b in zip(after[tid], before.get(tid, (0, 0)), strict=True))
    return on_cpu / wall_ns, waiting / wall_ns


def busy_jiffies() -> tuple[int, int]:
    """The machine's busy and total CPU time so far (/proc/stat), in clock ticks."""
    fields = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def load(url: str, protocol: str, concurrency: int, seconds: float) -> int:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    if protocol == "grpc":
        import tritonclient.grpc.aio as client_module
    else:
        import tritonclient.http.aio as client_module  # type: ignore[no-redef]
    client = client_module.InferenceServerClient(url)
    inputs = [client_module.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    done = 0
    end = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < end:
            await client.infer("py_add_sub", inputs)
            done += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return done


def spy(pid: int, seconds: float, out: pathlib.Path) -> subprocess.Popen[bytes]:
    command = ["py-spy", "record", "-p", str(pid), "-d", str(int(seconds)), "-r", str(RATE_HZ), "-f", "raw"]
    command += ["-o", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def layers_of(profile: pathlib.Path) -> tuple[collections.Counter[str], int]:
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in profile.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        if IDLE.match(frames[-1].strip()):
            continue
        total += int(n)
        for frame in reversed(frames):
            layer = next((name for name, pats in LAYERS if any(p in frame for p in pats)), None)
            if layer is not None:
                counts[layer] += int(n)
                break
        else:
            counts["other"] += int(n)
    return counts, total


def measure(protocol: str, concurrency: int, seconds: float, work: pathlib.Path, checkout: str | None) -> None:
    repo = work / f"repo-{protocol}"
    build(repo)
    ports = (free_port(), free_port(), free_port())
    saved, here = os.environ.get("PYTHONPATH"), os.getcwd()
    if checkout:  # Ray puts the driver's working directory first on its workers' path: both must name it
        os.environ["PYTHONPATH"] = checkout
        os.chdir(checkout)
    try:
        server = start_server(repo, ports, work / f"server-{protocol}.log", [])
    finally:
        os.chdir(here)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        url = f"127.0.0.1:{ports[1] if protocol == 'grpc' else ports[0]}"
        asyncio.run(load(url, protocol, concurrency, 3.0))  # warm-up
        pids = {"gateway": find(server.pid, "serve_app:gateway"), "model": find(server.pid, "py_add_sub.v1")}
        before = {k: cpu_seconds(p) for k, p in pids.items()}
        threads_before = {k: thread_seconds(p) for k, p in pids.items()}
        sched_before = {k: sched_ns(p) for k, p in pids.items()}
        machine_before, start_ns = busy_jiffies(), time.monotonic_ns()
        spies = {k: spy(p, seconds, work / f"{protocol}-{k}.txt") for k, p in pids.items()}
        done = asyncio.run(load(url, protocol, concurrency, seconds))
        spent = {k: cpu_seconds(p) - before[k] for k, p in pids.items()}
        threads = {k: thread_seconds(p) for k, p in pids.items()}
        wall_ns = time.monotonic_ns() - start_ns
        shares = {k: busiest(sched_before[k], sched_ns(p), wall_ns) for k, p in pids.items()}
        machine = [after - first for after, first in zip(busy_jiffies(), machine_before, strict=True)]
        for process in spies.values():
            process.wait(timeout=120)
    finally:
        stop_server(server)
    cores = (os.cpu_count() or 1) * machine[0] / max(machine[1], 1)
    print(f"\n{protocol} c={concurrency}: {done / seconds:,.0f} requests/s, {cores:.2f} busy cores (the load included)")
    for name in pids:
        per_request_us = spent[name] / done * 1e6
        counts, _ = layers_of(work / f"{protocol}-{name}.txt")
        print(f"  {name} process: {per_request_us:,.0f} µs CPU per request")
        seen = 0.0
        for layer, n in counts.most_common():
            us = n / RATE_HZ / done * 1e6  # each sample of a running thread stands for 1/RATE_HZ s of CPU
            seen += us
            print(f"    {layer:36} {us:6.0f} µs")
        print(f"    {'not seen by py-spy (native threads)':36} {max(per_request_us - seen, 0):6.0f} µs")
        by_thread = collections.Counter(
            {n: t - threads_before[name].get(n, 0.0) for n, t in threads[name].items()}
        ).most_common(4)
        print("    by thread: " + ", ".join(f"{n} {t / done * 1e6:.0f} µs" for n, t in by_thread))
        on_cpu, waiting = shares[name]
        print(f"    busiest thread: on a CPU {on_cpu:.0%} of the time, runnable and waiting for one {waiting:.0%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--keep", type=pathlib.Path, help="write the profiles and logs here, and keep them")
    parser.add_argument("--serve-app", help="a checkout whose serve_app the server runs (default: this one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="request_budget_") as tmp:
        work = args.keep or pathlib.Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for protocol in args.protocols.split(","):
            measure(protocol, args.concurrency, args.seconds, work, args.serve_app)
    return 0


if __name__ == "__main__":
    sys.exit(main())
