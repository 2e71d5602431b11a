"""Building blocks of ``scripts/soak``: the model mix, the sequence pool, per-interval figures and process RSS.

Kept apart from the script so that each piece is small and the script reads as the run's timeline.
Processes are read from ``/proc`` (psutil is not a dependency) and grouped by their Ray title, so a
replica that Serve replaces stays in the same row and a leak shows as that row's growth.
"""

from __future__ import annotations

import collections
import json
import math
import os
import pathlib
import queue
import random
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import numpy as np

# Request kinds reported separately: their latencies differ by protocol and sequences hold state.
HTTP, GRPC, SEQ = "http", "grpc", "seq"
KINDS = (HTTP, GRPC, SEQ)
KIND_TITLES = {HTTP: "unary HTTP", GRPC: "unary gRPC", SEQ: "sequence step (gRPC)"}

ADD_SUB, IDENTITY, MLP, ACCUM = "add_sub", "identity_fp32", "mlp", "seq_accum"
TIMEOUT_S = 30.0  # per request; a slower answer is an error


# --- the model repository a soak serves itself ---------------------------------------------------------


def build_repository(repo: pathlib.Path) -> None:
    """add_sub, identity_fp32, a small batched mlp and a 2 x 8-slot accumulator with implicit state.

    The mlp is shrunk (256 wide, 6 layers: well under a millisecond) so that no single model eats the
    two cores and the mix stays a mix; it batches dynamically, as a served MLP usually would.
    """
    from scripts import example_models as em

    em.add_sub(repo, name=ADD_SUB)
    em.identity(repo, "FP32", name=IDENTITY)
    em.mlp(repo, name=MLP, hidden=256, layers=6, dynamic_batching=True)
    accumulator(repo, ACCUM, max_batch_size=8, instances=2, idle_us=10_000_000)


def accumulator(
    repo: pathlib.Path, name: str, *, max_batch_size: int, instances: int, idle_us: int, parameters: str = ""
) -> None:
    """OUTPUT = OUTPUT_STATE = INPUT_STATE + INPUT: the running sum (from tests/e2e/sequence_models.py)."""
    import onnx
    from onnx import TensorProto, helper

    shape: list[str | int] = ["batch", 1] if max_batch_size > 0 else [1]
    nodes = [
        helper.make_node("Add", ["INPUT_STATE", "INPUT"], ["OUTPUT_STATE"]),
        helper.make_node("Identity", ["OUTPUT_STATE"], ["OUTPUT"]),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        name,
        [vi("INPUT", TensorProto.INT32, shape), vi("INPUT_STATE", TensorProto.INT32, shape)],
        [vi("OUTPUT", TensorProto.INT32, shape), vi("OUTPUT_STATE", TensorProto.INT32, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    d = repo / name
    (d / "1").mkdir(parents=True)
    onnx.save(model, str(d / "1" / "model.onnx"))
    (d / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }, '
        '{ name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        f"sequence_batching {{\n  max_sequence_idle_microseconds: {idle_us}\n  direct {{ }}\n"
        '  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ]\n'
        '            initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]\n'
        "}\n"
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
        'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n' + parameters
    )


# --- what a server offers ----------------------------------------------------------------------------------


def get_json(url: str, body: bytes | None = None, timeout: float = 10.0) -> object:
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def server_ready(http: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=10) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


@dataclass
class Served:
    """The models of the mix that the server has ready, and what the sequence model looks like."""

    models: set[str]
    seq_model: str | None = None
    seq_batched: bool = True  # max_batch_size > 0: a step's tensors are [1, 1], else [1]
    seq_slots: int = 0  # direct strategy: instances x max_batch_size (0: unknown)


def _is_accumulator(cfg: dict) -> bool:
    """INPUT/OUTPUT INT32 [1] with implicit state INPUT_STATE -> OUTPUT_STATE: the running-sum contract."""
    seq = cfg.get("sequence_batching") or {}
    ins = {i.get("name"): i for i in cfg.get("input", [])}
    outs = {o.get("name"): o for o in cfg.get("output", [])}
    states = {(s.get("input_name"), s.get("output_name")) for s in seq.get("state", [])}
    return (
        set(ins) == {"INPUT"}
        and "OUTPUT" in outs
        and ins["INPUT"].get("data_type") == "TYPE_INT32"
        and outs["OUTPUT"].get("data_type") == "TYPE_INT32"
        and [int(d) for d in ins["INPUT"].get("dims", [])] == [1]
        and ("INPUT_STATE", "OUTPUT_STATE") in states
        and not seq.get("control_input")
    )


def discover(http: str) -> Served:
    """Ready models of the mix on a running server; any READY accumulator-like model serves the sequences."""
    index = get_json(f"http://{http}/v2/repository/index", body=b"{}")
    ready = {m["name"] for m in index if m.get("state") == "READY"}  # type: ignore[union-attr]
    served = Served(models=ready & {ADD_SUB, IDENTITY, MLP})
    for name in sorted(ready, key=lambda n: (n != ACCUM, n)):
        try:
            cfg = get_json(f"http://{http}/v2/models/{name}/config")
        except (OSError, urllib.error.URLError):
            continue
        if isinstance(cfg, dict) and _is_accumulator(cfg):
            mbs = int(cfg.get("max_batch_size", 0))
            count = sum(int(g.get("count", 1)) for g in cfg.get("instance_group", [])) or 1
            served.seq_model, served.seq_batched = name, mbs > 0
            served.seq_slots = count * max(mbs, 1) if "direct" in cfg["sequence_batching"] else 0
            break
    return served


# --- the mix -------------------------------------------------------------------------------------------------


class WrongAnswer(Exception):
    """A response that arrived but is not what the model computes: counted as an error like a 500."""


@dataclass
class Op:
    name: str
    kind: str
    weight: float


# Ticket shares of the mix (renormalised over the models a server offers).
MIX = (
    Op("http add_sub", HTTP, 3.0),
    Op("http identity_fp32", HTTP, 1.0),
    Op("grpc add_sub", GRPC, 2.0),
    Op("grpc mlp", GRPC, 1.0),
    Op("seq step", SEQ, 3.0),
)
_OP_MODEL = {
    "http add_sub": ADD_SUB,
    "http identity_fp32": IDENTITY,
    "grpc add_sub": ADD_SUB,
    "grpc mlp": MLP,
}


def mix_for(served: Served) -> list[Op]:
    return [op for op in MIX if (op.kind == SEQ and served.seq_model) or _OP_MODEL.get(op.name) in served.models]


@dataclass
class Sequence:
    seq_id: int
    length: int
    step: int = 0
    total: int = 0


class SequencePool:
    """``n`` live sequences; a step ticket takes an idle one, so each sequence's steps go one at a time, in order."""

    def __init__(self, n: int, rng: random.Random, min_len: int = 5, max_len: int = 50) -> None:
        self._rng, self._min, self._max = rng, min_len, max_len
        self._lock = threading.Lock()
        self._next = rng.randrange(1 << 40, 1 << 50)  # far from ids other clients are likely to use
        self._idle: queue.Queue[Sequence] = queue.Queue()
        self.started = self.completed = self.broken = 0
        for _ in range(n):
            self._idle.put(self._new())

    def _new(self) -> Sequence:
        with self._lock:
            self._next += 1
            self.started += 1
            return Sequence(self._next, self._rng.randint(self._min, self._max))

    def take(self, timeout: float) -> Sequence | None:
        try:
            return self._idle.get(timeout=timeout)
        except queue.Empty:
            return None

    def give_back(self, seq: Sequence, *, ended: bool, broken: bool) -> None:
        with self._lock:
            self.completed += ended and not broken
            self.broken += broken
        self._idle.put(self._new() if ended or broken else seq)

    def drain(self) -> list[Sequence]:
        """Every idle sequence (all of them once the workers have stopped)."""
        out = []
        while True:
            try:
                out.append(self._idle.get_nowait())
            except queue.Empty:
                return out


class Client:
    """One worker thread's connections (tritonclient's HTTP client is not thread-safe) and its calls."""

    def __init__(self, http: str, grpc: str, served: Served, rng: random.Random) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        self.h, self.g = httpclient, grpcclient
        self.http = httpclient.InferenceServerClient(http, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S)
        self.grpc = grpcclient.InferenceServerClient(grpc)
        self.served, self.rng = served, rng
        self.a = np.arange(16, dtype=np.float32).reshape(1, 16)
        self.b = np.full((1, 16), 2.0, np.float32)
        self.mlp_in = np.linspace(-1, 1, 256, dtype=np.float32).reshape(1, 256)

    def close(self) -> None:
        for c in (self.http, self.grpc):
            try:
                c.close()
            except Exception:
                pass

    def _add_sub_inputs(self, mod: object) -> list:
        ins = [mod.InferInput("INPUT0", [1, 16], "FP32"), mod.InferInput("INPUT1", [1, 16], "FP32")]  # type: ignore[attr-defined]
        ins[0].set_data_from_numpy(self.a)
        ins[1].set_data_from_numpy(self.b)
        return ins

    def _check_add_sub(self, res: object) -> None:
        s, d = res.as_numpy("OUTPUT0"), res.as_numpy("OUTPUT1")  # type: ignore[attr-defined]
        if not (np.array_equal(s, self.a + self.b) and np.array_equal(d, self.a - self.b)):
            raise WrongAnswer("add_sub: wrong OUTPUT0/OUTPUT1")

    def call(self, op: str, mlp_ref: MlpReference) -> None:
        """Run one request of ``op``; raise on any failure or wrong answer."""
        if op == "http add_sub":
            self._check_add_sub(self.http.infer(ADD_SUB, self._add_sub_inputs(self.h)))
        elif op == "grpc add_sub":
            self._check_add_sub(self.grpc.infer(ADD_SUB, self._add_sub_inputs(self.g), client_timeout=TIMEOUT_S))
        elif op == "http identity_fp32":
            x = np.asarray(self.rng.sample(range(-1000, 1000), self.rng.randint(1, 64)), np.float32).reshape(1, -1)
            inp = self.h.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=self.rng.random() < 0.5)  # JSON and binary both
            out = self.http.infer(IDENTITY, [inp]).as_numpy("OUTPUT0")
            if not np.array_equal(out, x):
                raise WrongAnswer("identity_fp32: output differs from input")
        elif op == "grpc mlp":
            inp = self.g.InferInput("INPUT0", [1, 256], "FP32")
            inp.set_data_from_numpy(self.mlp_in)
            mlp_ref.check(self.grpc.infer(MLP, [inp], client_timeout=TIMEOUT_S).as_numpy("OUTPUT0"))
        else:
            raise ValueError(op)

    def seq_step(self, seq: Sequence) -> None:
        """One step of ``seq`` (START on its first, END on its last); the answer must be the running sum."""
        value = self.rng.randint(1, 100)
        shape = [1, 1] if self.served.seq_batched else [1]
        inp = self.g.InferInput("INPUT", shape, "INT32")
        inp.set_data_from_numpy(np.full(shape, value, np.int32))
        res = self.grpc.infer(
            self.served.seq_model,  # type: ignore[arg-type]
            [inp],
            sequence_id=seq.seq_id,
            sequence_start=seq.step == 0,
            sequence_end=seq.step == seq.length - 1,
            client_timeout=TIMEOUT_S,
        )
        seq.step += 1
        seq.total += value
        got = int(res.as_numpy("OUTPUT").reshape(-1)[0])
        if got != seq.total:
            raise WrongAnswer(f"sequence {seq.seq_id} step {seq.step}: sum {got}, expected {seq.total}")

    def abandon(self, seq: Sequence) -> None:
        """Best effort: END a broken or unfinished sequence so that its slot is freed now, not at idle timeout."""
        if seq.step == 0:
            return
        try:
            shape = [1, 1] if self.served.seq_batched else [1]
            inp = self.g.InferInput("INPUT", shape, "INT32")
            inp.set_data_from_numpy(np.zeros(shape, np.int32))
            self.grpc.infer(self.served.seq_model, [inp], sequence_id=seq.seq_id, sequence_end=True, client_timeout=10)  # type: ignore[arg-type]
        except Exception:
            pass


class MlpReference:
    """The mlp's answer to the fixed input: the first one seen, which every later one must match.

    Batching may change the summation order in Gemm, so the comparison allows float rounding.
    """

    def __init__(self) -> None:
        self._ref: np.ndarray | None = None
        self._lock = threading.Lock()

    def check(self, out: np.ndarray) -> None:
        with self._lock:
            if self._ref is None:
                if out.shape != (1, 16) or not np.all(np.isfinite(out)):
                    raise WrongAnswer(f"mlp: output shape {out.shape} or non-finite values")
                self._ref = out.copy()
                return
        if out.shape != self._ref.shape or not np.allclose(out, self._ref, rtol=1e-4, atol=1e-5):
            raise WrongAnswer("mlp: output differs from the first answer")


def status_of(exc: BaseException) -> str:
    """An HTTP status ('503'), a gRPC code ('StatusCode.UNAVAILABLE'), 'wrong answer' or the exception type."""
    if isinstance(exc, WrongAnswer):
        return "wrong answer"
    status = getattr(exc, "status", None)
    text = status() if callable(status) else None
    if text:
        return str(text)
    return type(exc).__name__


# --- figures per interval ------------------------------------------------------------------------------------


@dataclass
class Bucket:
    """One interval's outcomes."""

    start: float
    ok: collections.Counter[str] = field(default_factory=collections.Counter)  # kind -> count
    errors: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)  # (op, status)
    lat: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})  # seconds
    lag: list[float] = field(default_factory=list)  # start - scheduled time, open loop only
    samples: list[str] = field(default_factory=list)  # first few error messages

    @property
    def n_ok(self) -> int:
        return sum(self.ok.values())

    @property
    def n_err(self) -> int:
        return sum(self.errors.values())


class Recorder:
    """Thread-safe outcome sink; ``rotate`` closes the current interval and returns it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cur = Bucket(time.monotonic())

    def record(self, op: Op, latency: float, status: str | None, lag: float | None, msg: str = "") -> None:
        with self._lock:
            b = self._cur
            if status is None:
                b.ok[op.kind] += 1
                b.lat[op.kind].append(latency)
            else:
                b.errors[(op.name, status)] += 1
                if len(b.samples) < 3:
                    b.samples.append(f"{op.name}: {status}: {msg[:200]}")
            if lag is not None:
                b.lag.append(lag)

    def rotate(self) -> tuple[Bucket, float]:
        with self._lock:
            done, self._cur = self._cur, Bucket(time.monotonic())
        return done, self._cur.start - done.start


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3 if values else math.nan


def merge(buckets: list[Bucket]) -> Bucket:
    out = Bucket(buckets[0].start if buckets else 0.0)
    for b in buckets:
        out.ok.update(b.ok)
        out.errors.update(b.errors)
        for k in KINDS:
            out.lat[k].extend(b.lat[k])
        out.lag.extend(b.lag)
        out.samples.extend(b.samples[: max(0, 5 - len(out.samples))])
    return out


# --- processes and their memory ------------------------------------------------------------------------------


@dataclass
class ProcInfo:
    pid: int
    group: str
    rss_kib: int


def group_of(cmdline: bytes) -> str:
    """A stable name for a process: its Ray title's role, else its program (raylet, gcs_server, the CLI)."""
    argv = [a for a in cmdline.decode(errors="replace").split("\0") if a]
    if not argv:
        return "?"
    first = argv[0].strip()
    if first.startswith("ray::"):
        title = first.split()[0][len("ray::") :]
        if "ServeReplica:" in title:
            app, _, dep = title.rsplit("ServeReplica:", 1)[1].partition(":")
            parts = app.split("--")
            # model applications are "<app>--<deployment>--<generation>": the deployment names the row
            name = parts[1] if len(parts) == 3 else dep.split(".")[0]
            return f"ServeReplica:{name}"
        return title.split(".")[0]
    prog = os.path.basename(first)
    if prog.startswith("python"):
        if len(argv) > 2 and argv[1] == "-m":
            return "serve_app CLI" if argv[2] == "serve_app" else f"python -m {argv[2]}"
        script = next((a for a in argv[1:] if a.endswith(".py")), "")
        if script.endswith(("setup_worker.py", "default_worker.py")):
            return "worker (starting)"
        return os.path.basename(script)[:-3] if script else prog
    return prog


def process_rss_kib(pid: int) -> int:
    """A process's resident memory, KiB (0 when it has none, as a kernel thread; raises OSError once gone)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def session_processes(sid: int) -> list[ProcInfo]:
    """Live (non-zombie) processes of session ``sid``, with their resident memory."""
    out = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            state, _ppid, _pgrp, s = stat.rsplit(")", 1)[1].split()[:4]
            if state == "Z" or int(s) != sid:
                continue
            rss = process_rss_kib(int(entry.name))
            out.append(ProcInfo(int(entry.name), group_of((entry / "cmdline").read_bytes()), rss))
        except (OSError, ValueError, IndexError):
            continue
    return out


def rss_by_group(procs: list[ProcInfo]) -> dict[str, tuple[int, int]]:
    """group -> (processes, total RSS KiB)."""
    out: dict[str, tuple[int, int]] = {}
    for p in procs:
        n, kib = out.get(p.group, (0, 0))
        out[p.group] = (n + 1, kib + p.rss_kib)
    return dict(sorted(out.items()))


def own_rss_kib() -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def listener_session(port: int) -> int | None:
    """Session of the local process listening on TCP ``port`` (a serve_app gateway), or None."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = pathlib.Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return None
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    stat = (entry / "stat").read_text()
                    return int(stat.rsplit(")", 1)[1].split()[3])
        except OSError:
            continue
    return None


def short(group: str) -> str:
    return group.removeprefix("ServeReplica:")


def mib(kib: int) -> float:
    return kib / 1024


def fmt_rss(groups: dict[str, tuple[int, int]]) -> str:
    total = sum(kib for _, kib in groups.values())
    parts = [f"{short(g)} {mib(kib):.0f}" + (f"[{n}]" if n > 1 else "") for g, (n, kib) in groups.items()]
    return f"rss MiB {mib(total):.0f}: " + ", ".join(parts)
