#!/usr/bin/env python3
"""Benchmark the sequence batcher: steps/s of concurrent sequences over gRPC streaming, against raw onnxruntime.

    scripts/bench_sequences [--concurrency 4,16,32] [--sequence-length 20] [--instances 2] [--hidden 256]
                            [--interval-ms 4000] [--state-backup off,on] [--server-arg=...]

Builds ``seq_rnn``, a stateful model with implicit state (``OUTPUT_STATE = tanh(INPUT_STATE @ W + INPUT)``,
state and input of ``--hidden`` FP32 values, direct strategy, max_batch_size 8, ``--instances`` instances),
starts `python -m serve_app` on free ports and drives it with Triton's perf_analyzer over gRPC streaming
(``--streaming --sequence-length L``; each of C concurrent sequences sends its next step when the previous
answer arrives).  The server's statistics give the batch sizes formed.  A Python probe then sends
sequences one at a time to split the latency of START steps (which ask the sequence router for a slot)
from that of the other steps (which go straight to their instance): the router's share of per-request
latency is the START surplus spread over a sequence's steps, over the mean step latency.  Raw onnxruntime
is measured in-process afterwards (state carried in numpy) at batch 1 and at the batch sizes formed.
``--state-backup`` runs it all once per setting of the model's ``sequence_state_backup`` parameter (each
step's state sent to the sequence router before the step is answered), so the cost of the backup shows as
the difference between the rows.
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import signal
import subprocess
import tempfile
import time
import urllib.request

import numpy as np

from scripts.bench import PA, start_server
from tests.support.net import free_port
from tests.support.paths import ROOT

MODEL = "seq_rnn"


def build(repo: pathlib.Path, hidden: int, instances: int, backup: str = "auto") -> pathlib.Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["INPUT_STATE", "W"], ["m"]),
            helper.make_node("Add", ["m", "INPUT"], ["a"]),
            helper.make_node("Tanh", ["a"], ["OUTPUT_STATE"]),
            helper.make_node("Identity", ["OUTPUT_STATE"], ["OUTPUT"]),
        ],
        MODEL,
        [vi("INPUT", TensorProto.FLOAT, ["b", hidden]), vi("INPUT_STATE", TensorProto.FLOAT, ["b", hidden])],
        [vi("OUTPUT", TensorProto.FLOAT, ["b", hidden]), vi("OUTPUT_STATE", TensorProto.FLOAT, ["b", hidden])],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    d = repo / MODEL
    (d / "1").mkdir(parents=True)
    onnx.save(model, str(d / "1" / "model.onnx"))
    (d / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f'input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {hidden} ] }} ]\n'
        f'output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {hidden} ] }} ]\n'
        "sequence_batching {\n  max_sequence_idle_microseconds: 5000000\n  direct { }\n"
        f'  state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_FP32 dims: [ {hidden} ]\n'
        f'            initial_state: {{ data_type: TYPE_FP32 dims: [ {hidden} ] zero_data: true name: "zero" }} }} ]\n'
        "}\n"
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
        'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
        f'parameters {{ key: "sequence_state_backup" value: {{ string_value: "{backup}" }} }}\n'
    )
    return d / "1" / "model.onnx"


def stats(http: int) -> tuple[int, int, dict[int, int]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{MODEL}/stats", timeout=10) as r:
        s = json.load(r)["model_stats"][0]
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in s["batch_stats"]}
    return int(s["inference_count"]), int(s["execution_count"]), sizes


def perf_analyzer(grpc: int, conc: int, length: int, interval_ms: int, out: pathlib.Path) -> dict[str, float]:
    cmd = [str(PA), "-m", MODEL, "-u", f"127.0.0.1:{grpc}", "-i", "grpc", "--streaming",
           "--sequence-length", str(length), "--concurrency-range", f"{conc}:{conc}",
           "--measurement-interval", str(interval_ms), "-s", "30", "--max-trials", "4", "-f", str(out)]  # fmt: skip
    out.unlink(missing_ok=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0 or not out.exists():
        return {"error": (proc.stdout + proc.stderr)[-600:]}  # type: ignore[dict-item]
    row = next(csv.DictReader(out.open()))
    return {
        "steps_s": float(row["Inferences/Second"]),
        "p50_ms": float(row["p50 latency"]) / 1000,
        "p99_ms": float(row["p99 latency"]) / 1000,
    }


def probe(grpc: int, hidden: int, sequences: int, length: int) -> tuple[float, float]:
    """Mean latency (ms) of START steps and of the other steps, one sequence at a time."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
    x = grpcclient.InferInput("INPUT", [1, hidden], "FP32")
    x.set_data_from_numpy(np.ones((1, hidden), np.float32))
    starts, steps = [], []
    for seq in range(sequences):
        for i in range(length):
            t0 = time.perf_counter()
            client.infer(MODEL, [x], sequence_id=10_000_000 + seq, sequence_start=i == 0, sequence_end=i == length - 1)
            (starts if i == 0 else steps).append(time.perf_counter() - t0)
    return 1000 * float(np.mean(starts[1:])), 1000 * float(np.mean(steps))


def raw_onnxruntime(model_file: pathlib.Path, hidden: int, batch: int, seconds: float = 3.0) -> float:
    """Steps per second in-process at ``batch``, carrying the state between calls: the server's limit."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(model_file), opts, providers=["CPUExecutionProvider"])
    x = np.ones((batch, hidden), np.float32)
    state = np.zeros((batch, hidden), np.float32)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 5:
        _, state = sess.run(None, {"INPUT": x, "INPUT_STATE": state})
        n += 1
    return n * batch / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="4,16,32", help='perf_analyzer runs ("" for the probe only)')
    ap.add_argument("--sequence-length", type=int, default=20)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--interval-ms", type=int, default=4000)
    ap.add_argument("--state-backup", default="off,on", help="comma-separated: off, on (the model's parameter)")
    ap.add_argument("--server-arg", action="append", default=[], help="extra `python -m serve_app` option")
    args = ap.parse_args()
    if not PA.exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "install_perf_analyzer.sh")], check=True, cwd=ROOT)
    modes = [m.strip() for m in args.state_backup.split(",") if m.strip()]
    rows = []  # (backup, concurrency, perf_analyzer result, mean batch)
    probes: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for run, mode in enumerate(modes):
            repo = pathlib.Path(tmp) / f"repo-{run}-{mode}"
            model_file = build(repo, args.hidden, args.instances, {"on": "true", "off": "false"}.get(mode, mode))
            ports = (free_port(), free_port(), free_port())
            extra = ["--num-cpus", "16", "--instance-cpus", "0.5", *args.server_arg]
            proc = start_server(repo, ports, pathlib.Path(tmp) / f"server-{run}.log", extra)
            try:
                probes.append((mode, *probe(ports[1], args.hidden, 10, args.sequence_length)))
                for conc in (int(c) for c in args.concurrency.split(",") if c.strip()):
                    before = stats(ports[0])
                    res = perf_analyzer(
                        ports[1], conc, args.sequence_length, args.interval_ms, pathlib.Path(tmp) / "pa.csv"
                    )
                    after = stats(ports[0])
                    executions = after[1] - before[1]
                    mean_batch = (after[0] - before[0]) / executions if executions else float("nan")
                    rows.append((mode, conc, res, mean_batch))
            finally:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=60)
            time.sleep(2)
        raw1 = raw_onnxruntime(model_file, args.hidden, 1)
        raws = {
            b: raw_onnxruntime(model_file, args.hidden, b)
            for b in sorted({max(1, round(mb)) for _, _, res, mb in rows if "error" not in res})
        }
    print(f"\nseq_rnn: hidden {args.hidden}, {args.instances} instances x 8 slots, sequences of "
          f"{args.sequence_length} steps, gRPC streaming (perf_analyzer)")  # fmt: skip
    print(f"raw onnxruntime, one thread, batch 1: {raw1:,.0f} steps/s")
    print(
        "| state backup | concurrent sequences | steps/s | p50 ms | p99 ms | mean rows/execution "
        "| raw ORT steps/s at that batch | ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode, conc, res, mean_batch in rows:
        if "error" in res:
            print(f"| {mode} | {conc} | error: {res['error']} |")
            continue
        raw = raws[max(1, round(mean_batch))]
        print(f"| {mode} | {conc} | {res['steps_s']:,.0f} | {res['p50_ms']:.2f} | {res['p99_ms']:.2f} "
              f"| {mean_batch:.1f} | {raw:,.0f} | {res['steps_s'] / raw:.3f} |")  # fmt: skip
    for mode, start_ms, step_ms in probes:
        surplus = max(0.0, start_ms - step_ms)
        share = surplus / args.sequence_length / step_ms
        print(f"\nprobe (state backup {mode}), one sequence at a time: START step {start_ms:.2f} ms, other steps "
              f"{step_ms:.2f} ms; the router's round trip at START (~{surplus:.2f} ms, once per sequence) is "
              f"{100 * share:.1f}% of per-request latency over a {args.sequence_length}-step sequence")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
