#!/usr/bin/env python3
"""System shared memory against the request body, for large tensors, with Triton's perf_analyzer.

    python -m scripts.bench_shm [--mib 1] [--concurrency 1,4] [--protocols http,grpc] [--interval-ms 3000]

Builds an FP32 Identity model (``identity_fp32``, dims ``[-1]``), starts ``python -m serve_app
--allow-client-shm`` on free ports and runs perf_analyzer (installed into .pa/ by
scripts/install_perf_analyzer.sh when missing) on an input of ``--mib`` MiB, each protocol and
concurrency twice: tensors in the request and response bodies, then ``--shared-memory system`` (inputs and
outputs in regions the tool registers). Raw onnxruntime runs the same Identity in process after the
server stops. One table: infer/s and p50 of each, shared memory over body, and each over raw onnxruntime.
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import subprocess
import tempfile
import time

import numpy as np

from scripts import example_models
from scripts.bench import PA, raw_onnxruntime, start_server, stop_server
from tests.support.net import free_port
from tests.support.paths import ROOT

MODEL = "identity_fp32"


def perf_analyzer(
    url: str, protocol: str, conc: int, elements: int, shm: bool, interval_ms: int, out: pathlib.Path
) -> tuple[float, float] | str:
    """(infer/s, p50 ms) of one bounded run, or an error text."""
    cmd = [str(PA), "-m", MODEL, "-u", url, "-i", protocol, "--shape", f"INPUT0:{elements}",
           "--concurrency-range", f"{conc}:{conc}", "--measurement-interval", str(interval_ms),
           "--max-trials", "5", "--stability-percentage", "50", "-f", str(out)]  # fmt: skip
    if shm:
        cmd += ["--shared-memory", "system", "--output-shared-memory-size", str(elements * 4)]
    out.unlink(missing_ok=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0 or not out.exists():
        return (proc.stdout + proc.stderr)[-400:]
    row = next(csv.DictReader(out.open()))
    return float(row["Inferences/Second"]), float(row["p50 latency"]) / 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=float, default=1.0, help="input (and output) size in MiB")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--protocols", default="http,grpc")
    ap.add_argument("--interval-ms", type=int, default=3000)
    args = ap.parse_args()
    if not PA.exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "install_perf_analyzer.sh")], check=True, cwd=ROOT)
    elements = int(args.mib * 2**20) // 4
    results: dict[tuple[str, int, bool], tuple[float, float] | str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = pathlib.Path(tmp) / "repo"
        model_dir = example_models.identity(repo, "FP32", name=MODEL, max_batch_size=0)
        ports = (free_port(), free_port(), free_port())
        proc = start_server(repo, ports, pathlib.Path(tmp) / "server.log", ["--allow-client-shm"])
        try:
            for protocol in args.protocols.split(","):
                url = f"127.0.0.1:{ports[0] if protocol == 'http' else ports[1]}"
                for conc in (int(c) for c in args.concurrency.split(",")):
                    for shm in (False, True):
                        got = perf_analyzer(
                            url, protocol, conc, elements, shm, args.interval_ms, pathlib.Path(tmp) / "pa.csv"
                        )
                        results[(protocol, conc, shm)] = got
                        shown = f"{got[0]:9,.0f}/s" if isinstance(got, tuple) else f"failed: {got}"
                        print(f"  {protocol:<4} c={conc:<3} {'shm ' if shm else 'body'} {shown}", flush=True)
        finally:
            stop_server(proc)
        time.sleep(5)  # let Ray's processes finish exiting
        raw = raw_onnxruntime(model_dir / "1" / "model.onnx", {"INPUT0": np.ones(elements, np.float32)}, batch=1)
    print(f"\nraw onnxruntime in process, {args.mib:g} MiB Identity: {raw:,.0f} infer/s")
    print(f"{'proto':<5} {'conc':>4} {'body/s':>9} {'p50 ms':>7} {'shm/s':>9} {'p50 ms':>7} {'shm/body':>8} "
          f"{'body/raw':>8} {'shm/raw':>8}")  # fmt: skip
    for protocol in args.protocols.split(","):
        for conc in (int(c) for c in args.concurrency.split(",")):
            body, shm = results[(protocol, conc, False)], results[(protocol, conc, True)]
            if not (isinstance(body, tuple) and isinstance(shm, tuple)):
                print(f"{protocol:<5} {conc:>4}  failed: {body if isinstance(body, str) else shm}")
                continue
            print(
                f"{protocol:<5} {conc:>4} {body[0]:>9,.0f} {body[1]:>7.2f} {shm[0]:>9,.0f} {shm[1]:>7.2f} "
                f"{shm[0] / body[0]:>8.2f} {body[0] / raw:>8.3f} {shm[0] / raw:>8.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
