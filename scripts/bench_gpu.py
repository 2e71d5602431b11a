#!/usr/bin/env python3
"""Models on the GPU served by serve_app on Ray (and by Triton, on the same model.py), against raw PyTorch
at the batch each formed, in one bounded run.

    python -m scripts.bench_gpu [--seconds 4] [--concurrency 1,16,64] [--protocols http,grpc] [--out F.json]
    python -m scripts.bench_gpu --triton DIR [--only triton]   # Triton's rows too (DIR: triton.tar.xz unpacked)
    python -m scripts.bench_gpu --local                        # the local server (no Ray) instead
    python -m scripts.bench_gpu --dry-run    # the same steps on the CPU with a small model (no figures)

The repository (``tests/support/gpu_models.py``), every model on GPU 0: ``ts_mlp`` (TorchScript, no
batcher) at concurrency 1; ``ts_mlp_db`` (TorchScript, ``dynamic_batching``) and ``py_torch`` (the same
MLP run by torch inside a Python model, two instances sharing the GPU, ``dynamic_batching``) at each
``--concurrency``. Triton serves ``py_torch``'s very directory. The servers' statistics give the batches
formed; raw PyTorch then runs the module in this process at batch 1 and at each batch formed. One table:
infer/s, p50, p99, the mean batch, raw PyTorch at that batch, and served over raw.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from scripts.load_clients import run_load
from tests.support import gpu_models
from tests.support.kserve_client import HttpClient, batch_counts
from tests.support.net import free_port

LOCAL_READY = b"serve_app (local, no Ray) ready"
RAY_READY = b"serve_app ready"
OUTPUTS = ["OUTPUT__0", "DEVICE__1"]
DRY_RUN_RESOURCES = '{"GPU": 1, "gpu_idx_0": 1}'  # the dry run's pretend GPU (tests/gpu/conftest.py)


@dataclass
class Served:
    server: str  # "serve_app" or "triton"
    model: str
    protocol: str
    concurrency: int
    infer_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    batch: float = 1.0  # mean batch size the server formed
    sizes: dict[int, int] = field(default_factory=dict)
    device: int = -2  # the CUDA ordinal the model reported (-1: the CPU)
    raw_infer_s: float = 0.0  # raw PyTorch at round(batch)
    error: str = ""

    @property
    def ratio(self) -> float:
        return self.infer_s / self.raw_infer_s if self.raw_infer_s else float("nan")


def measure(run: Served, port: int, stats: HttpClient, procs: int, warmup_s: float, seconds: float) -> None:
    path = f"/v2/models/{run.model}/stats"
    before = batch_counts(stats.get_json(path)["model_stats"][0])
    x = np.random.default_rng(port).standard_normal((1, gpu_models.MLP_IN)).astype(np.float32)
    load = run_load(port, run.protocol, run.model, {"INPUT__0": x}, OUTPUTS, run.concurrency, seconds,
                    procs=procs, warmup_s=warmup_s)  # fmt: skip
    after = batch_counts(stats.get_json(path)["model_stats"][0])
    if load.errors:
        run.error = load.errors[0]
    run.infer_s, run.p50_ms, run.p99_ms = load.per_s, load.percentile(0.5), load.percentile(0.99)
    run.device = int(load.first.get("DEVICE__1", [-2])[0])
    run.sizes = {b: n - before.get(b, 0) for b, n in after.items() if n > before.get(b, 0)}
    executions = sum(run.sizes.values())
    run.batch = sum(b * n for b, n in run.sizes.items()) / executions if executions else 1.0


def raw_torch(model_file: pathlib.Path, batch: int, device: str, seconds: float) -> float:
    """In-process inferences per second at ``batch``: numpy in, to the device, forward, back to numpy."""
    import torch

    module = torch.jit.load(str(model_file), map_location=device).eval()
    x = np.random.default_rng(batch).standard_normal((batch, gpu_models.MLP_IN)).astype(np.float32)

    def once() -> None:
        with torch.inference_mode():
            out = module(torch.from_numpy(x).to(device))
            out[0].cpu().numpy()

    for _ in range(10):
        once()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 10:
        once()
        n += 1
    return n * batch / (time.perf_counter() - t0)


def cuda_device() -> str:
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def rows(server: str, protocols: list[str], concurrency: list[int]) -> list[Served]:
    out = []
    for protocol in protocols:
        if server == "serve_app":
            out.append(Served(server, gpu_models.SERVED_MLP, protocol, 1))
        for c in concurrency:
            if server == "serve_app":
                out.append(Served(server, gpu_models.BATCHED_MLP, protocol, c))
            out.append(Served(server, gpu_models.PY_TORCH, protocol, c))
    return out


def bench_server(
    server: str, repo: pathlib.Path, args: argparse.Namespace, log_dir: pathlib.Path, runs: list[Served]
) -> None:
    """Start ``server`` on ``repo``, run its rows, stop it."""
    import os

    from scripts.bench import start_server, stop_server
    from scripts.triton_server import start_triton, stop_triton

    ports = (free_port(), free_port(), free_port())
    log = log_dir / f"server-bench-{server}.log"
    todo = rows(server, args.protocols.split(","), [int(c) for c in args.concurrency.split(",")])
    if server == "triton":
        proc = start_triton(args.triton, repo, ports, log)
        stop = stop_triton
    else:
        if args.dry_run:
            os.environ["RAY_OVERRIDE_RESOURCES"] = DRY_RUN_RESOURCES
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # "" would hide the pretend GPU
        extra = ["--local"] if args.local else ["--object-store-memory", str(512 * 2**20)]
        proc = start_server(repo, ports, log, extra, ready=LOCAL_READY if args.local else RAY_READY)
        stop = stop_server
    try:
        stats = HttpClient(ports[0])
        for i, run in enumerate(todo):
            port = ports[0] if run.protocol == "http" else ports[1]
            profiling = start_profile(proc.pid, args) if i == 0 and server == "serve_app" else []
            try:
                measure(run, port, stats, args.client_procs, args.warmup, args.seconds)
                end_profile(profiling, args)
                if not args.dry_run and run.device != 0 and not run.error:
                    run.error = f"the model ran on device {run.device}, not cuda:0"
            except Exception as exc:
                run.error = repr(exc)[:400]
            runs.append(run)
            print(f"  {server:<9} {run.model:<10} {run.protocol:<4} c={run.concurrency:<3} {run.infer_s:9,.0f}/s  "
                  f"batch {run.batch:.1f}{'  ' + run.error if run.error else ''}", flush=True)  # fmt: skip
        stats.close()
    finally:
        stop(proc)


def start_profile(session: int, args: argparse.Namespace) -> list[tuple[str, subprocess.Popen[bytes]]]:
    """``py-spy record`` of the gateway and the GPU host during the first row (c=1): where a request's time
    goes on the GPU node. Nothing where py-spy is missing or ``--profile-dir`` unset."""
    from tests.support.faults import replica_pids

    spy = shutil.which("py-spy")
    if not args.profile_dir or spy is None or args.local:
        return []
    args.profile_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for name in ("gateway", "host-gpu0"):
        for pid in replica_pids(session, name)[:1]:
            raw = args.profile_dir / f"profile-{name}.txt"
            cmd = [spy, "record", "--pid", str(pid), "--duration", str(max(1, int(args.seconds + args.warmup))),
                   "--rate", "500", "--format", "raw", "--nonblocking", "-o", str(raw)]  # fmt: skip
            out.append((name, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)))
    return out


def end_profile(profiling: list[tuple[str, subprocess.Popen[bytes]]], args: argparse.Namespace) -> None:
    """Wait for the profiles and write each one's busiest functions (own samples) beside it."""
    for name, proc in profiling:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        raw = args.profile_dir / f"profile-{name}.txt"
        if raw.exists():
            (args.profile_dir / f"profile-{name}-top.txt").write_text(top_frames(raw.read_text()))


def top_frames(collapsed: str, n: int = 30) -> str:
    """The functions with the most samples of their own in ``py-spy --format raw`` (collapsed) stacks."""
    own: dict[str, int] = {}
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.split(";")[-1]
        own[leaf] = own.get(leaf, 0) + int(count)
        total += int(count)
    rows = sorted(own.items(), key=lambda kv: -kv[1])[:n]
    return f"{total} samples\n" + "".join(f"{100 * c / max(1, total):5.1f}%  {f}\n" for f, c in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0, help="measured window of each run")
    ap.add_argument("--warmup", type=float, default=1.0, help="load before each window, not counted")
    ap.add_argument("--concurrency", default="1,16,64", help="clients on the batched models")
    ap.add_argument("--protocols", default="http,grpc")
    ap.add_argument("--client-procs", type=int, default=8, help="client processes sharing the clients (0: threads)")
    ap.add_argument("--local", action="store_true", help="serve_app's local server (no Ray)")
    ap.add_argument("--triton", type=pathlib.Path, help="unpacked triton.tar.xz: Triton's rows too")
    ap.add_argument("--only", choices=("serve_app", "triton"), help="one server's rows")
    ap.add_argument("--out", type=pathlib.Path, help="write the figures here as JSON")
    ap.add_argument("--log-dir", type=pathlib.Path, help="keep the servers' logs here")
    ap.add_argument("--profile-dir", type=pathlib.Path, help="py-spy profiles of the gateway and GPU host here")
    ap.add_argument("--dry-run", action="store_true", help="on the CPU, a small MLP, short windows: no figures")
    args = ap.parse_args(argv)
    device = cuda_device()
    if args.dry_run:
        args.seconds, args.warmup, args.client_procs = 0.3, 0.1, 0
        args.concurrency = "1,4"
    elif device == "cpu":
        print("error: PyTorch finds no CUDA GPU here; --dry-run runs the steps on the CPU", file=sys.stderr)
        return 2
    servers = [s for s in ("serve_app", "triton") if args.only in (None, s) and (s != "triton" or args.triton)]
    sizes: dict[str, int] = dict(gpu_models.CPU_MLP) if args.dry_run else {}
    started = time.monotonic()
    runs: list[Served] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp) / "repo"
        plain = gpu_models.ts_mlp(repo, gpu_models.SERVED_MLP, **sizes)
        gpu_models.ts_mlp(repo, gpu_models.BATCHED_MLP, extra=gpu_models.batching(True), **sizes)
        gpu_models.py_torch(repo, extra=gpu_models.batching(True), **sizes)
        triton_repo = pathlib.Path(tmp) / "triton_repo"  # Triton serves the Python model alone
        triton_repo.mkdir()
        (triton_repo / gpu_models.PY_TORCH).symlink_to(repo / gpu_models.PY_TORCH)
        for server in servers:
            try:
                bench_server(server, triton_repo if server == "triton" else repo, args,
                             args.log_dir or pathlib.Path(tmp), runs)  # fmt: skip
            except SystemExit as exc:  # a server that did not start: its rows say why
                runs.extend(replace_error(r, str(exc)[-400:]) for r in rows(server, args.protocols.split(","),
                            [int(c) for c in args.concurrency.split(",")]))  # fmt: skip
        raw: dict[int, float] = {}
        for run in runs:
            b = max(1, round(run.batch))
            if b not in raw and not run.error:
                raw[b] = raw_torch(plain / "1" / "model.pt", b, device, min(args.seconds, 3.0))
            run.raw_infer_s = raw.get(b, 0.0)
    report(runs, raw, device, args.dry_run, time.monotonic() - started)
    if args.out:
        args.out.write_text(json.dumps(
            {"device": device, "dry_run": args.dry_run, "raw_infer_s": raw,
             "runs": [asdict(r) | {"ratio": r.ratio} for r in runs]}, indent=2))  # fmt: skip
    return 1 if any(r.error for r in runs) else 0


def replace_error(run: Served, why: str) -> Served:
    run.error = why
    return run


def report(runs: list[Served], raw: dict[int, float], device: str, dry_run: bool, elapsed: float) -> None:
    print()
    print(f"raw PyTorch in-process on {device}, inferences/s: "
          + ", ".join(f"batch {b}: {v:,.0f}" for b, v in sorted(raw.items())))  # fmt: skip
    head = f"{'server':<9} {'model':<10} {'proto':<5} {'conc':>4} {'infer/s':>9} {'p50 ms':>7} {'p99 ms':>7}"
    print(head + f" {'batch':>6} {'raw/s':>9} {'served/raw':>10} {'device':>6}")
    for r in runs:
        if r.error:
            print(f"{r.server:<9} {r.model:<10} {r.protocol:<5} {r.concurrency:>4}  failed: {r.error}")
            continue
        print(f"{r.server:<9} {r.model:<10} {r.protocol:<5} {r.concurrency:>4} {r.infer_s:9,.0f} {r.p50_ms:7.2f} "
              f"{r.p99_ms:7.2f} {r.batch:6.1f} {r.raw_infer_s:9,.0f} {r.ratio:10.2f} {r.device:>6}")  # fmt: skip
    by_key = {(r.server, r.protocol, r.concurrency): r for r in runs if r.model == gpu_models.PY_TORCH and not r.error}
    for (server, protocol, c), r in sorted(by_key.items()):
        t = by_key.get(("triton", protocol, c))
        if server == "serve_app" and t and t.infer_s:
            print(f"py_torch {protocol} c={c}: serve_app/Triton {r.infer_s / t.infer_s:.2f}")
    note = " (dry run on the CPU: not figures)" if dry_run else ""
    print(f"done in {elapsed:.0f}s{note}")


if __name__ == "__main__":
    sys.exit(main())
