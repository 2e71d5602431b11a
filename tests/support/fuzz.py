"""Fuzz the HTTP and gRPC front ends with malformed requests; every one must get a client-error answer.

    python -m scripts.fuzz [--cases 10000] [--seed 0] [--time-limit-s 900] [--timeout-s 10] [--concurrency 8]
                           [--protocols http,grpc,parity] [--http HOST:PORT --grpc HOST:PORT] [--case N]

A case passes when it is answered, within ``--timeout-s``, with HTTP 200/4xx (501 and 503 where the
server may legitimately say so; any other 5xx fails) and a ``{"error": ...}`` body on errors, or a gRPC
status other than INTERNAL, UNKNOWN, DEADLINE_EXCEEDED, DATA_LOSS...; a stream must answer each of its
requests in-band as the same request answers alone; a ``parity`` case sends one request over both
protocols and needs the same status and message.  Every ``--check-every`` cases, and at the end, the
server must still be ready and serve a valid inference.  Exit status 1 when anything failed.

In process (the default) the integration tests' models, the sequence models, an ensemble, a dynamic
batcher with priorities and a classification model are served from a temporary repository by the
real service and front ends without Ray (HTTP through httpx's ASGI transport, gRPC on a free loopback
port), with small request limits so that limit cases stay cheap.  With ``--http``/``--grpc`` a running
server is fuzzed instead: its models come from its repository index, metadata and config, and cases
never load or unload a model it serves.  ``--cases`` is per protocol.  Case ``i`` of protocol ``p``
is generated from ``Random(f"{seed}:{p}:{i}")``: ``--case i --protocols p`` replays and prints it.
Needs the test extra (httpx, tritonclient, onnx).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import math
import pathlib
import random
import re
import struct
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import numpy as np

from serve_app.limits import RequestLimits
from serve_app.protos import grpc_service_pb2 as pb

SERVICE = "/inference.GRPCInferenceService/"
PROTOCOLS = ("http", "grpc", "parity")
# Small limits for the in-process server: limit cases stay cheap.
IN_PROCESS_LIMITS = RequestLimits(
    max_body_bytes=2 * 2**20, max_tensor_elements=2**18, max_json_depth=32, max_inputs=32, max_outputs=32
)
HTTP_OK = {200, 400, 404, 405, 413, 501}  # 503 only where the server may be unavailable
GRPC_OK = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "UNIMPLEMENTED", "RESOURCE_EXHAUSTED", "ALREADY_EXISTS"}
GRPC_TO_HTTP = {
    "OK": 200,
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "UNAVAILABLE": 503,
    "UNIMPLEMENTED": 501,
    "RESOURCE_EXHAUSTED": 413,
    "ALREADY_EXISTS": 400,
    "CANCELLED": 400,
}
INT_RANGES = {
    "INT8": (-(2**7), 2**7 - 1),
    "INT16": (-(2**15), 2**15 - 1),
    "INT32": (-(2**31), 2**31 - 1),
    "INT64": (-(2**63), 2**63 - 1),
    "UINT8": (0, 2**8 - 1),
    "UINT16": (0, 2**16 - 1),
    "UINT32": (0, 2**32 - 1),
    "UINT64": (0, 2**64 - 1),
}
NUMPY = {
    "BOOL": "bool",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
    "BF16": "<u2",
    **{k: ("<" + np.dtype(k.lower()).str[1:]) for k in INT_RANGES},
}
DATATYPES = (*NUMPY, "BYTES")
NUMPY_ITEMSIZE = {k: np.dtype(v).itemsize for k, v in NUMPY.items()} | {"BYTES": 4}  # BYTES: an empty element
SEQUENCE_KEYS = ("sequence_id", "sequence_start", "sequence_end")
REQUEST_KEYS = (*SEQUENCE_KEYS, "priority", "timeout", "binary_data_output", "triton_enable_empty_final_response")


# --------------------------------------------------------------------------- what the server serves


@dataclass(frozen=True)
class TensorInfo:
    name: str
    datatype: str
    shape: tuple[int, ...]  # as metadata reports it: -1 for a variable dimension, batch included


@dataclass(frozen=True)
class ModelInfo:
    name: str
    versions: tuple[str, ...]
    ready: bool
    max_batch_size: int = 0
    inputs: tuple[TensorInfo, ...] = ()
    outputs: tuple[TensorInfo, ...] = ()
    sequence: bool = False
    string_corrid: bool = False


async def discover(client: httpx.AsyncClient) -> list[ModelInfo]:
    """Models from the repository index, each with its metadata and config (as a client would learn them)."""
    resp = await client.post("/v2/repository/index", content=b"{}")
    resp.raise_for_status()
    names = sorted({e["name"] for e in resp.json()})
    models = []
    for name in names:
        quoted = urllib.parse.quote(name, safe="")
        md = await client.get(f"/v2/models/{quoted}")
        cfg = await client.get(f"/v2/models/{quoted}/config")
        if md.status_code != 200 or cfg.status_code != 200:
            models.append(ModelInfo(name, ("1",), ready=False))
            continue
        meta, config = md.json(), cfg.json()

        def tensors(items: list[dict[str, Any]]) -> tuple[TensorInfo, ...]:
            return tuple(TensorInfo(t["name"], t["datatype"], tuple(int(d) for d in t["shape"])) for t in items)

        seq = config.get("sequence_batching")
        corrid = [
            c
            for ci in (seq or {}).get("control_input", [])
            for c in ci.get("control", [])
            if c.get("kind") == "CONTROL_SEQUENCE_CORRID"
        ]
        ready = (await client.get(f"/v2/models/{quoted}/ready")).status_code == 200
        models.append(
            ModelInfo(
                name=name,
                versions=tuple(meta.get("versions") or ["1"]),
                ready=ready,
                max_batch_size=int(config.get("max_batch_size", 0)),
                inputs=tensors(meta.get("inputs", [])),
                outputs=tensors(meta.get("outputs", [])),
                sequence=seq is not None,
                string_corrid=any(c.get("data_type") == "TYPE_STRING" for c in corrid),
            )
        )
    return models


# --------------------------------------------------------------------------- cases


@dataclass
class HttpCase:
    kind: str
    method: str
    path: str
    body: bytes = b""
    headers: dict[str, str | bytes] = field(default_factory=dict)
    unavailable_ok: bool = False  # 503 is a right answer (a model that is not ready, model control off)
    chunked: bool = False  # send the body in chunks, without Content-Length


@dataclass
class GrpcCase:
    kind: str
    rpc: str
    payloads: list[bytes]  # one for a unary call, the stream's messages for ModelStreamInfer
    unavailable_ok: bool = False


@dataclass
class ParityCase:
    kind: str
    http: HttpCase
    grpc: GrpcCase


Case = HttpCase | GrpcCase | ParityCase


@dataclass
class Tensor:
    """A request input before encoding: values are a flat list (or raw bytes when ``raw`` is set)."""

    name: Any
    datatype: Any
    shape: list[Any]
    values: list[Any]
    raw: bytes | None = None


@dataclass
class Request:
    model: str
    version: str = ""
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)


def tensor_bytes(t: Tensor) -> bytes:
    """The binary (HTTP) / raw (gRPC) layout of ``t``'s values; junk values become junk bytes."""
    if t.raw is not None:
        return t.raw
    if t.datatype == "BYTES":
        out = []
        for v in t.values:
            b = v.encode("utf-8", "surrogatepass") if isinstance(v, str) else v if isinstance(v, bytes) else b"?"
            out.append(struct.pack("<I", len(b)) + b)
        return b"".join(out)
    dtype = NUMPY.get(t.datatype) if isinstance(t.datatype, str) else None
    if dtype is None:
        return bytes(4 * len(t.values))
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.array(t.values, dtype=dtype).tobytes()
    except (ValueError, TypeError, OverflowError):
        return bytes(np.dtype(dtype).itemsize * len(t.values))


_DEEP = re.compile(rb'"@@deep([0-9]+)@@"')


def _json(obj: Any) -> bytes:
    """Compact JSON; a ``"@@deep<N>@@"`` string becomes ``[[...[1]...]]`` nested N deep (json.dumps recurses)."""
    text = json.dumps(obj, separators=(",", ":")).encode("ascii")
    return _DEEP.sub(lambda m: b"[" * int(m[1]) + b"1" + b"]" * int(m[1]), text)


def infer_path(model: str, version: str) -> str:
    m = urllib.parse.quote(model, safe="")
    return (
        f"/v2/models/{m}/versions/{urllib.parse.quote(version, safe='')}/infer" if version else f"/v2/models/{m}/infer"
    )


def http_doc(req: Request, binary: set[int]) -> tuple[dict[str, Any], bytes]:
    """The JSON header of ``req`` and the binary bytes after it (inputs in ``binary`` go as binary data)."""
    doc: dict[str, Any] = {}
    if req.id:
        doc["id"] = req.id
    if req.parameters:
        doc["parameters"] = dict(req.parameters)
    inputs, tail = [], []
    for i, t in enumerate(req.inputs):
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if i in binary or t.raw is not None:
            data = tensor_bytes(t)
            entry["parameters"] = {"binary_data_size": len(data)}
            tail.append(data)
        else:
            entry["data"] = list(t.values)
        inputs.append(entry)
    doc["inputs"] = inputs
    if req.outputs:
        doc["outputs"] = [{"name": n, "parameters": dict(p)} if p else {"name": n} for n, p in req.outputs]
    return doc, b"".join(tail)


def http_case(kind: str, req: Request, doc: Any, tail: bytes, unavailable_ok: bool) -> HttpCase:
    header = _json(doc)
    headers = {"Inference-Header-Content-Length": str(len(header))} if tail else {}
    return HttpCase(kind, "POST", infer_path(req.model, req.version), header + tail, headers, unavailable_ok)


def set_param(target: Any, key: str, value: Any) -> None:
    """``target[key]`` (a protobuf map of InferParameter) from a Python value, in the field its type picks."""
    p = target[key]
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        if -(2**63) <= value < 2**63:
            p.int64_param = value
        else:
            p.uint64_param = value % 2**64
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = utf8(str(value))


def grpc_message(req: Request, raw: bool) -> pb.ModelInferRequest:
    """``req`` with raw contents, or typed ones (unless a tensor only has bytes)."""
    raw = raw or any(t.raw is not None for t in req.inputs)
    msg = pb.ModelInferRequest(model_name=req.model, model_version=req.version, id=req.id)
    for k, v in req.parameters.items():
        set_param(msg.parameters, k, v)
    for t in req.inputs:
        shape = [int(d) for d in t.shape if isinstance(d, int) and -(2**63) <= d < 2**63]
        io = msg.inputs.add(name=str(t.name), datatype=str(t.datatype), shape=shape)
        if raw:
            msg.raw_input_contents.append(tensor_bytes(t))
        else:
            _typed_contents(io, t)
    for name, params in req.outputs:
        out = msg.outputs.add(name=str(name))
        for k, v in params.items():
            set_param(out.parameters, k, v)
    return msg


def _typed_contents(io: Any, t: Tensor) -> None:
    dt, values = t.datatype, t.values
    try:
        if dt == "BOOL":
            io.contents.bool_contents.extend(bool(v) for v in values)
        elif dt in ("INT8", "INT16", "INT32"):
            io.contents.int_contents.extend(int(v) for v in values)
        elif dt == "INT64":
            io.contents.int64_contents.extend(int(v) for v in values)
        elif dt in ("UINT8", "UINT16", "UINT32"):
            io.contents.uint_contents.extend(int(v) for v in values)
        elif dt == "UINT64":
            io.contents.uint64_contents.extend(int(v) for v in values)
        elif dt == "FP32":
            io.contents.fp32_contents.extend(float(v) for v in values)
        elif dt == "FP64":
            io.contents.fp64_contents.extend(float(v) for v in values)
        elif dt == "BYTES":
            io.contents.bytes_contents.extend(v if isinstance(v, bytes) else str(v).encode() for v in values)
        else:
            io.contents.SetInParent()
    except (ValueError, TypeError, OverflowError):
        io.contents.bytes_contents.append(b"junk")


# --------------------------------------------------------------------------- generators


def junk(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value of any type, scalars weighted towards edge cases."""
    r = rng.random()
    if r < 0.15 and depth < 3:
        return [junk(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if r < 0.25 and depth < 3:
        return {rng.choice(["a", "name", "data", "", "x" * 10]): junk(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return rng.choice(
        [
            None,
            True,
            False,
            0,
            -1,
            1,
            7,
            2**31,
            2**32,
            2**63 - 1,
            2**63,
            2**64 - 1,
            2**64,
            -(2**63),
            -(2**63) - 1,
            10**40,
            -(10**40),
            0.5,
            -0.0,
            1e308,
            -1e308,
            float("nan"),
            float("inf"),
            "",
            "x",
            "1",
            "-1",
            "true",
            "FP32",
            "\x00",
            "\ud800",
            "é✓",
            "a" * 300,
        ]
    )


def odd_name(rng: random.Random, models: list[ModelInfo]) -> str:
    """A model name no one would serve (or, now and then, one that is served)."""
    return rng.choice(
        [
            "",
            " ",
            ".",
            "..",
            "no_such_model",
            "a/b",
            "a%2Fb",
            "\x00",
            "é✓",
            "x" * rng.choice([255, 4096]),
            "add_sub ",
            "ADD_SUB",
            "*",
            "%ZZ",
            "\ud7ff",
            rng.choice(models).name if models else "m",
        ]
    )


def odd_version(rng: random.Random) -> str:
    return rng.choice(
        ["-1", "0", "abc", "1.5", "99999999999999999999999", "9" * 5000, "٣", " 1", "+1", "1_0", "0x1", "", "1", "2"]
    )


class Generator:
    """Seeded case generators for one server's models."""

    def __init__(self, models: list[ModelInfo], limits: RequestLimits, *, remote: bool) -> None:
        self.models = models
        self.ready = [m for m in models if m.ready and m.inputs]
        self.limits = limits
        self.remote = remote
        self.served = {m.name for m in models}

    # -- valid requests, the starting point of every mutation
    def values(self, rng: random.Random, datatype: str, n: int) -> list[Any]:
        if datatype == "BOOL":
            return [rng.random() < 0.5 for _ in range(n)]
        if datatype in INT_RANGES:
            lo, hi = INT_RANGES[datatype]
            return [rng.randint(max(lo, -100), min(hi, 100)) for _ in range(n)]
        if datatype == "BYTES":
            return [rng.choice(["", "a", "héllo", "12", "x" * 20]) for _ in range(n)]
        return [round(rng.uniform(-10, 10), 3) for _ in range(n)]

    def valid(self, rng: random.Random, model: ModelInfo) -> Request:
        batch = 1 if model.sequence else rng.randint(1, max(1, min(model.max_batch_size, 4)))
        inputs = []
        for t in model.inputs:
            shape = [rng.randint(1, 3) if d < 0 else d for d in t.shape]
            if model.max_batch_size > 0 and shape:
                shape[0] = batch
            n = math.prod(shape)
            if n <= 4096:
                inputs.append(Tensor(t.name, t.datatype, shape, self.values(rng, t.datatype, n)))
            else:  # a big tensor (a served model's image, say) goes as bytes: lists would stall the event loop
                size = NUMPY_ITEMSIZE.get(t.datatype, 4) * n
                inputs.append(Tensor(t.name, t.datatype, shape, [], raw=bytes(size)))
        req = Request(model.name, id=rng.choice(["", "req-1", "ü"]), inputs=inputs)
        if model.outputs and rng.random() < 0.4:
            req.outputs = [(o.name, {}) for o in rng.sample(model.outputs, rng.randint(1, len(model.outputs)))]
        if model.sequence:
            corr: Any = f"s{rng.getrandbits(40)}" if model.string_corrid else rng.randint(1, 2**63)
            req.parameters.update(sequence_id=corr, sequence_start=True, sequence_end=True)
        return req

    def maybe_unavailable(self, req: Request) -> bool:
        """Whether 503 is a right answer: the request names a model that is not ready, or sets a queue
        timeout (one that expires is answered 503, as in Triton)."""
        return req.model not in {m.name for m in self.ready} or "timeout" in req.parameters

    def model(self, rng: random.Random) -> ModelInfo:
        if self.models and rng.random() < 0.05:
            return rng.choice(self.models)  # the not-ready ones too
        return rng.choice(self.ready)

    # -- mutations of a request, the same for both protocols
    def mutate(self, rng: random.Random, model: ModelInfo, req: Request) -> str:
        """Change ``req`` into a (most likely) invalid request; returns what was changed."""
        t = rng.choice(req.inputs) if req.inputs else None

        def datatype() -> None:
            if t:
                t.datatype = rng.choice([*DATATYPES, "FLOAT", "fp32", "", "TYPE_FP32", "STRING"])

        def shape() -> None:
            if not t:
                return
            choice = rng.randrange(7)
            if choice == 0:
                if t.shape:
                    t.shape[rng.randrange(len(t.shape))] = rng.choice([-1, -5, -(2**63)])
                else:
                    t.shape = [-1]
            elif choice == 1:
                t.shape = [rng.choice([2**31, 2**40, 2**62, 2**63 - 1]) for _ in range(rng.randint(1, 3))]
            elif choice == 2:
                t.shape = [*t.shape, rng.randint(0, 3)]
            elif choice == 3:
                t.shape = t.shape[:-1]
            elif choice == 4:
                t.shape = [0, *t.shape[1:]]
            elif choice == 5:
                t.shape = [1] * rng.choice([16, 70, 300])
            else:
                t.shape = [2**62, 0, 2**62]

        def count() -> None:
            if t:
                n = len(t.values)
                t.values = t.values[: max(0, n - rng.randint(1, 3))] if rng.random() < 0.5 else t.values * 2 + t.values

        def name() -> None:
            if not t:
                return
            r = rng.random()
            if r < 0.3:
                t.name = rng.choice(["", "INPUT9", "input0", "é", " INPUT0"])
            elif r < 0.6:
                req.inputs.append(dataclasses.replace(t, values=list(t.values), shape=list(t.shape)))
            else:
                req.inputs.remove(t)

        def params() -> None:
            key = rng.choice([*REQUEST_KEYS, "triton_x", "custom", "binary_data_size"])
            value = junk(rng)
            if isinstance(value, (list, dict)) or value is None:
                value = rng.choice([1.5, "x", -1, True])
            req.parameters[key] = value

        def sequence() -> None:
            key = rng.choice(SEQUENCE_KEYS)
            req.parameters[key] = rng.choice(
                [True, False, 0, -1, 1, 2**63, 2**64 - 1, 1.0, 0.5, "", "1", "true", "s1", -(2**63)]
            )
            if req.parameters.get("sequence_start") is True:
                req.parameters["sequence_end"] = True  # never leave a sequence holding a slot

        def outputs() -> None:
            names = [o.name for o in model.outputs] or ["OUTPUT0"]
            name_ = rng.choice([*names, "NOPE", ""])
            params_: dict[str, Any] = {}
            if rng.random() < 0.6:
                params_["classification"] = rng.choice([0, -1, 1, 3, 2**40, 2**63, 1.5, "2", True])
            req.outputs.append((name_, params_))
            if rng.random() < 0.3:
                req.outputs.append((name_, {}))

        def batch() -> None:
            if t and t.shape and model.max_batch_size > 0:
                t.shape[0] = rng.choice([model.max_batch_size + 1, 0, 2**20])
                n = math.prod(t.shape)
                if n <= 4096:  # else leave the data short: generating it would stall the event loop
                    t.values = self.values(rng, t.datatype if t.datatype in DATATYPES else "FP32", n)

        def scheduling() -> None:
            key = rng.choice(["priority", "timeout"])
            req.parameters[key] = rng.choice([0, 1, 2, 3, 100, 2**63 - 1, 2**64 - 1, -1, 1.5, "1", True])

        def where() -> None:
            if rng.random() < 0.5:
                req.model = odd_name(rng, self.models)
            else:
                req.version = odd_version(rng)

        def limits() -> None:
            lim = self.limits
            r = rng.random()
            if r < 0.4 and t:
                t.shape = [lim.max_tensor_elements + 1]
                t.values = []
                t.raw = b""
            elif r < 0.7:
                extra = lim.max_inputs + 1 - len(req.inputs)
                req.inputs += [Tensor(f"X{i}", "BOOL", [0], []) for i in range(extra)]
            else:
                req.outputs += [(f"O{i}", {}) for i in range(lim.max_outputs + 1)]

        def bad_values() -> None:
            if t and t.values:
                i = rng.randrange(len(t.values))
                if t.datatype in INT_RANGES:
                    lo, hi = INT_RANGES[t.datatype]
                    t.values[i] = rng.choice([lo - 1, hi + 1, 2**64, 1.5, True, "1", None])
                else:
                    t.values[i] = rng.choice([None, "x", [], {}, 10**400, 1e308, True, 2**70])

        ops: list[tuple[str, Callable[[], None]]] = [
            ("datatype", datatype),
            ("shape", shape),
            ("count", count),
            ("name", name),
            ("params", params),
            ("sequence", sequence),
            ("outputs", outputs),
            ("batch", batch),
            ("where", where),
            ("limits", limits),
            ("values", bad_values),
            ("scheduling", scheduling),
        ]
        weights = [3, 4, 3, 3, 3, 4 if model.sequence else 1, 3, 2, 2, 1, 3, 2]
        label, op = rng.choices(ops, weights)[0]
        op()
        return label

    # -- HTTP
    def http(self, rng: random.Random) -> HttpCase:
        r = rng.random()
        if r < 0.70:
            return self.http_infer(rng)
        if r < 0.85:
            return self.http_route(rng)
        return self.http_repository(rng)

    def http_infer(self, rng: random.Random) -> HttpCase:
        model = self.model(rng)
        if not model.inputs:
            return HttpCase("infer.not_ready", "POST", infer_path(model.name, ""), b"{}", unavailable_ok=True)
        req = self.valid(rng, model)
        labels = [self.mutate(rng, model, req) for _ in range(rng.choice([0, 1, 1, 1, 2]))]
        binary = {i for i in range(len(req.inputs)) if rng.random() < 0.4}
        doc, tail = http_doc(req, binary)
        r = rng.random()
        if r < 0.35:
            labels.append(self.json_field(rng, model, doc))
        case = http_case("infer." + "+".join(labels or ["valid"]), req, doc, tail, self.maybe_unavailable(req))
        if rng.random() < 0.3:
            case.kind += "+" + self.http_bytes(rng, case, model)
        if rng.random() < 0.1 and "Content-Length" not in case.headers:
            case.chunked = True
            case.kind += "+chunked"
        return case

    def json_field(self, rng: random.Random, model: ModelInfo, doc: dict[str, Any]) -> str:
        """A JSON value of the wrong type (or shape) at one field of the request."""
        inputs = doc.get("inputs") or []
        item = rng.choice(inputs) if inputs else None
        field_ = rng.choice(
            [
                *("inputs", "id", "parameters", "outputs", "name", "datatype", "shape", "data", "in_params", "out"),
                *("top", "binary_size", "binary_size", "deep_data"),
            ]
        )
        value = junk(rng)
        sized = [i for i in inputs if isinstance(i, dict) and "binary_data_size" in (i.get("parameters") or {})]
        if field_ == "binary_size" and sized:
            p = rng.choice(sized)["parameters"]
            p["binary_data_size"] = rng.choice([p["binary_data_size"] + rng.choice([-4, -1, 1, 8]), 2**40, 2**63])
        elif field_ == "deep_data" and item is not None:
            item["data"] = f"@@deep{rng.choice([self.limits.max_json_depth, 200, 5000])}@@"  # see _json
        elif field_ in ("inputs", "id", "parameters", "outputs", "binary_size", "deep_data"):
            doc[field_] = value
        elif field_ == "top":
            doc["unknown_" + rng.choice(["a", "b"])] = value
        elif item is None:
            doc["inputs"] = [value]
        elif field_ == "in_params":
            p = item.setdefault("parameters", {}) if isinstance(item.get("parameters"), dict) else {}
            key = rng.choice(["binary_data_size", "shared_memory_region", "x", "triton_y", "binary_data"])
            p[key] = value
            item["parameters"] = p if rng.random() < 0.8 else value
        elif field_ == "out":
            doc["outputs"] = [rng.choice([value, {"name": value}, {"name": "OUTPUT0", "parameters": value}])]
            if rng.random() < 0.5:
                doc["outputs"].append({"name": "OUTPUT0", "parameters": {"binary_data": value}})
        elif field_ == "data" and rng.random() < 0.5 and isinstance(item.get("data"), list) and item["data"]:
            data = item["data"]
            data[rng.randrange(len(data))] = value  # one element of the wrong type
        elif field_ == "data" and rng.random() < 0.3:
            item["data"] = [item.get("data")]  # nested one level more
        elif rng.random() < 0.1:
            item.pop(field_, None)
        else:
            item[field_] = value
        return "json." + field_

    def http_bytes(self, rng: random.Random, case: HttpCase, model: ModelInfo) -> str:
        """Break the body or its framing headers."""
        body = case.body
        r = rng.randrange(10)
        if r == 0:
            case.body = body[: rng.randrange(len(body) + 1)]
            return "truncated"
        if r == 1:
            case.body = body + rng.randbytes(rng.randint(1, 64))
            return "trailing"
        if r == 2 and body:
            b = bytearray(body)
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.choice([0x00, 0x80, 0xFF, 0xC3, ord("["), ord('"'), ord("\\")])
            case.body = bytes(b)
            return "flipped"
        if r == 3 and self.remote:  # values an HTTP client will send (no surrounding whitespace)
            case.headers["Inference-Header-Content-Length"] = rng.choice(
                ["-1", "abc", "1e3", "0x10", str(len(body) + 1), str(2**70), "0", "+5", "1 2"]
            )
            return "header_length"
        if r == 3:
            case.headers["Inference-Header-Content-Length"] = rng.choice(
                ["-1", "abc", "", " ", "1e3", "0x10", "\u0661", str(len(body) + 1), str(2**70), "0", "+5", " 7 "]
            ).encode("utf-8")  # bytes: httpx sends a non-ASCII value as is
            return "header_length"
        if r == 4:
            n = int(case.headers.get("Inference-Header-Content-Length", len(body)))  # ours: a number
            case.headers["Inference-Header-Content-Length"] = str(max(0, n + rng.choice([-2, -1, 1, 3])))
            return "header_length_off"
        if r == 5:
            case.body = rng.choice([b"", b" ", b"null", b"[]", b"{}", b'"x"', b"0", b"{", b"\xff\xfe", b"\x00" * 8])
            case.headers.pop("Inference-Header-Content-Length", None)
            return "tiny_body"
        if r == 6:
            depth = rng.choice([self.limits.max_json_depth + 1, 1000, 100_000])
            opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}"), (b'{"inputs":[', b"]}")])
            case.body = opener * depth + (closer * depth if rng.random() < 0.5 else b"")
            case.headers.pop("Inference-Header-Content-Length", None)
            return "deep"
        if r == 7:
            case.body = b"\xef\xbb\xbf" + body if rng.random() < 0.5 else body.replace(b'"', b'"\xff', 1)
            return "encoding"
        if r == 8 and not self.remote:
            # A Content-Length that lies (in process only: a real server would wait for the missing bytes).
            case.headers["Content-Length"] = rng.choice(
                ["-1", "abc", str(self.limits.max_body_bytes + 1), str(2**64), "1, 2"]
            )
            return "content_length"
        if self.limits.max_body_bytes <= 8 * 2**20:
            case.body = body + b" " * (self.limits.max_body_bytes + 1 - len(body))
            case.headers.pop("Inference-Header-Content-Length", None)
            return "over_max_body"
        case.body = body + b"\n\t "
        return "whitespace"

    def http_route(self, rng: random.Random) -> HttpCase:
        name = urllib.parse.quote(odd_name(rng, self.models), safe=rng.choice(["", "/%"]))
        version = urllib.parse.quote(odd_version(rng), safe="")
        prefix = f"/v2/models/{name}" + (f"/versions/{version}" if rng.random() < 0.5 else "")
        suffix = rng.choice(["", "/ready", "/config", "/stats", "/infer", "/nope"])
        method = rng.choice(["GET", "GET", "GET", "POST", "PUT", "DELETE"])
        if suffix == "/infer":
            model = rng.choice(self.ready)
            doc, _ = http_doc(self.valid(rng, model), set())
            return HttpCase("route.infer", "POST", prefix + suffix, _json(doc), unavailable_ok=True)
        path = rng.choice([prefix + suffix, "/v2/models/stats", "/v2", "/v2/health/ready", "/v2/nope", "/", "/v2//x"])
        return HttpCase("route." + (suffix.strip("/") or "metadata"), method, path, unavailable_ok=True)

    def http_repository(self, rng: random.Random) -> HttpCase:
        action = rng.choice(["index", "load", "unload"])
        r = rng.random()
        if r < 0.2:
            body = rng.choice([b"", b"{", b"\xff", b"[" * 5000, b"null", b"[]", b"{}", b'{"ready":true}'])
        elif r < 0.6:
            params = {rng.choice(["config", "file:1/model.onnx", "unload_dependents", "x", "ready"]): junk(rng)}
            if rng.random() < 0.3:
                params = {"file:a": base64.b64encode(rng.randbytes(16)).decode()}
            body = _json(rng.choice([{"parameters": params}, {"parameters": junk(rng)}, {"ready": junk(rng)}]))
        else:
            body = _json(junk(rng))
        if action == "index":
            path = rng.choice(["/v2/repository/index", "/v2/repository/other/index"])
        else:
            name = odd_name(rng, self.models)
            if self.remote and name in self.served:
                name += "_not_served"
            quoted = urllib.parse.quote(name, safe="")
            repo = rng.choice(["", "other/"])
            path = f"/v2/repository/{repo}models/{quoted}/{action}"
        return HttpCase(f"repository.{action}", "POST", path, body, unavailable_ok=True)

    # -- gRPC
    def grpc(self, rng: random.Random) -> GrpcCase:
        r = rng.random()
        if r < 0.6:
            return self.grpc_infer(rng)
        if r < 0.72:
            return self.grpc_stream(rng)
        if r < 0.87:
            return self.grpc_other(rng)
        return self.grpc_repository(rng)

    def infer_message(self, rng: random.Random) -> tuple[bytes, str, bool]:
        model = self.model(rng)
        if not model.inputs:
            return pb.ModelInferRequest(model_name=model.name).SerializeToString(), "not_ready", True
        req = self.valid(rng, model)
        labels = [self.mutate(rng, model, req) for _ in range(rng.choice([0, 1, 1, 1, 2]))]
        raw = rng.random() < 0.6
        msg = grpc_message(req, raw)
        if rng.random() < 0.4:
            labels.append(self.grpc_field(rng, msg))
        data = msg.SerializeToString()
        if rng.random() < 0.1:
            labels.append("corrupt")
            data = self.corrupt(rng, data)
        return data, "+".join(labels or ["valid"]), self.maybe_unavailable(req)

    def grpc_field(self, rng: random.Random, msg: pb.ModelInferRequest) -> str:
        """A protobuf-level mistake: raw contents of the wrong count or size, typed contents in the wrong
        field, parameters of the wrong type or with no value."""
        r = rng.randrange(8)
        io = rng.choice(msg.inputs) if msg.inputs else None
        if r == 0:
            if msg.raw_input_contents and rng.random() < 0.5:
                del msg.raw_input_contents[-1]
            else:
                msg.raw_input_contents.append(rng.randbytes(rng.randint(0, 8)))
            return "raw_count"
        if r == 1 and msg.raw_input_contents:
            i = rng.randrange(len(msg.raw_input_contents))
            b = msg.raw_input_contents[i]
            msg.raw_input_contents[i] = b[: -rng.randint(1, 4)] if b and rng.random() < 0.5 else b + b"\x01\x00\x00"
            return "raw_size"
        if r == 2 and io is not None:
            field_ = rng.choice(
                [
                    "bool_contents",
                    "int_contents",
                    "int64_contents",
                    "uint_contents",
                    "uint64_contents",
                    "fp32_contents",
                    "fp64_contents",
                    "bytes_contents",
                ]
            )
            values = {"bool_contents": [True], "bytes_contents": [b"\xff", b""], "fp32_contents": [1.5]}
            getattr(io.contents, field_).extend(values.get(field_, [1, 2]))
            return "typed_field"
        if r == 3:
            target = rng.choice([msg.parameters, io.parameters if io else msg.parameters])
            key = rng.choice([*REQUEST_KEYS, "shared_memory_region", "classification", "x"])
            p = target[key]
            which = rng.randrange(6)
            if which == 0:
                p.bool_param = rng.random() < 0.5
            elif which == 1:
                p.int64_param = rng.choice([-1, 0, 1, -(2**63), 2**63 - 1])
            elif which == 2:
                p.string_param = rng.choice(["", "1", "x", "true"])
            elif which == 3:
                p.double_param = rng.choice([0.5, -1.0, float("nan"), float("inf")])
            elif which == 4:
                p.uint64_param = rng.choice([0, 1, 2**64 - 1])
            else:
                p.Clear()  # no value at all
            return "param_type"
        if r == 4 and io is not None:
            io.ClearField(rng.choice(["name", "datatype", "shape"]))
            return "missing_field"
        if r == 5:
            msg.ClearField(rng.choice(["model_name", "inputs", "outputs", "raw_input_contents"]))
            return "missing_field"
        if r == 6 and msg.outputs:
            o = rng.choice(msg.outputs)
            set_param(o.parameters, rng.choice(["classification", "binary_data", "x"]), junk_scalar(rng))
            return "output_param"
        if io is not None:
            io.shape[:] = [rng.choice([-1, 0, 2**62, -(2**63), 2**63 - 1]) for _ in range(rng.randint(1, 4))]
        return "shape"

    def corrupt(self, rng: random.Random, data: bytes) -> bytes:
        r = rng.randrange(4)
        if r == 0:
            return data[: rng.randrange(len(data) + 1)]
        if r == 1:
            return rng.randbytes(rng.randint(1, 64))
        if r == 2 and data:
            b = bytearray(data)
            for _ in range(rng.randint(1, 6)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            return bytes(b)
        return b"\x0a\x02\xff\xfe" + data  # model_name holding invalid UTF-8

    def grpc_infer(self, rng: random.Random) -> GrpcCase:
        if rng.random() < 0.02 and self.limits.max_body_bytes <= 8 * 2**20:
            msg = pb.ModelInferRequest(model_name=rng.choice(self.ready).name)
            msg.raw_input_contents.append(bytes(self.limits.max_body_bytes + 1))
            return GrpcCase("infer.over_max_message", "ModelInfer", [msg.SerializeToString()])
        data, label, unavailable = self.infer_message(rng)
        return GrpcCase("infer." + label, "ModelInfer", [data], unavailable)

    def grpc_stream(self, rng: random.Random) -> GrpcCase:
        messages = [self.infer_message(rng) for _ in range(rng.randint(1, 4))]
        return GrpcCase(
            "stream." + "|".join(m[1] for m in messages),
            "ModelStreamInfer",
            [m[0] for m in messages],
            any(m[2] for m in messages),
        )

    def grpc_other(self, rng: random.Random) -> GrpcCase:
        name, version = odd_name(rng, self.models), odd_version(rng) if rng.random() < 0.5 else ""
        rpc, msg = rng.choice(
            [
                ("ModelMetadata", pb.ModelMetadataRequest(name=name, version=version)),
                ("ModelReady", pb.ModelReadyRequest(name=name, version=version)),
                ("ModelConfig", pb.ModelConfigRequest(name=name, version=version)),
                ("ModelStatistics", pb.ModelStatisticsRequest(name=name, version=version)),
                ("ServerReady", pb.ServerReadyRequest()),
                ("ServerMetadata", pb.ServerMetadataRequest()),
                ("SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(name=name, key="k", byte_size=8)),
                ("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest(name=name)),
                ("TraceSetting", pb.TraceSettingRequest(model_name=name)),
                ("LogSettings", pb.LogSettingsRequest()),
            ]
        )
        data = msg.SerializeToString()
        if rng.random() < 0.2:
            data = self.corrupt(rng, data)
        return GrpcCase(f"other.{rpc}", rpc, [data], unavailable_ok=True)

    def grpc_repository(self, rng: random.Random) -> GrpcCase:
        rpc = rng.choice(["RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"])
        repo_name = rng.choice(["", "", "", "other"])
        if rpc == "RepositoryIndex":
            msg: Any = pb.RepositoryIndexRequest(repository_name=repo_name, ready=rng.random() < 0.5)
        else:
            name = odd_name(rng, self.models)
            if self.remote and name in self.served:
                name += "_not_served"
            cls = pb.RepositoryModelLoadRequest if rpc == "RepositoryModelLoad" else pb.RepositoryModelUnloadRequest
            msg = cls(repository_name=repo_name, model_name=name)
            for _ in range(rng.randint(0, 2)):
                p = msg.parameters[rng.choice(["config", "file:1/model.onnx", "unload_dependents", "x"])]
                which = rng.randrange(5)
                if which == 0:
                    p.bool_param = True
                elif which == 1:
                    p.int64_param = -1
                elif which == 2:
                    p.string_param = rng.choice(["{", "{}", "", "x"])
                elif which == 3:
                    p.bytes_param = rng.randbytes(8)
                else:
                    p.Clear()
        data = msg.SerializeToString()
        if rng.random() < 0.15:
            data = self.corrupt(rng, data)
        return GrpcCase(f"repository.{rpc}", rpc, [data], unavailable_ok=True)

    # -- the same request over both protocols
    def parity(self, rng: random.Random) -> ParityCase:
        model = rng.choice(self.ready)
        req = self.valid(rng, model)
        label = self.mutate(rng, model, req)
        if not req.model or "/" in req.model or req.model in (".", ".."):  # no HTTP route can name these
            req.model = "no_such_model"
        for t in req.inputs:  # what both wires can carry: string names and types, int64 dims
            t.name, t.datatype = utf8(str(t.name)), utf8(str(t.datatype))
            t.shape = [d for d in t.shape if isinstance(d, int) and -(2**63) <= d < 2**63]
        req.outputs = [(utf8(str(n)), p) for n, p in req.outputs]
        req.parameters = {  # binary_data_output is HTTP's alone: gRPC ignores it, as Triton does
            k: utf8(v) if isinstance(v, str) else v
            for k, v in req.parameters.items()
            if isinstance(v, (bool, int, float, str)) and k != "binary_data_output" and representable(k, v)
        }
        doc, tail = http_doc(req, set(range(len(req.inputs))))
        http = http_case("parity." + label, req, doc, tail, self.maybe_unavailable(req))
        grpc_ = GrpcCase("parity." + label, "ModelInfer", [grpc_message(req, raw=True).SerializeToString()])
        grpc_.unavailable_ok = http.unavailable_ok
        return ParityCase("parity." + label, http, grpc_)

    def case(self, protocol: str, seed: int, index: int) -> Case:
        rng = random.Random(f"{seed}:{protocol}:{index}")
        return getattr(self, protocol)(rng)


def representable(key: str, value: Any) -> bool:
    """Whether both wires carry ``value`` alike: gRPC has 64-bit integers only, and reads a negative
    int64 ``sequence_id`` as the uint64 with the same bits (as Triton does), which HTTP refuses."""
    if type(value) is not int:
        return True
    return 0 <= value < 2**64 if key == "sequence_id" else -(2**63) <= value < 2**64


def utf8(text: str) -> str:
    """``text`` as protobuf can carry it (lone surrogates replaced)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def junk_scalar(rng: random.Random) -> Any:
    value = junk(rng)
    return value if isinstance(value, (bool, int, float, str)) and not isinstance(value, list) else 1.5


# --------------------------------------------------------------------------- running cases


@dataclass
class Outcome:
    status: str  # "200", "INVALID_ARGUMENT", "timeout", "exception:ValueError", ...
    seconds: float
    problem: str = ""  # empty when the answer is a right one


@dataclass
class Targets:
    http: httpx.AsyncClient
    channel: grpc.aio.Channel
    strict: bool  # in process every model is ready: 503 only where the case allows it
    timeout_s: float


def _grpc_code(exc: grpc.aio.AioRpcError) -> str:
    return exc.code().name


async def chunks(body: bytes, size: int = 65536) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


async def run_http(t: Targets, case: HttpCase) -> tuple[Outcome, httpx.Response | None]:
    start = time.perf_counter()
    try:
        content: bytes | AsyncIterator[bytes] = chunks(case.body) if case.chunked else case.body
        resp = await asyncio.wait_for(
            t.http.request(case.method, case.path, content=content, headers=case.headers), t.timeout_s
        )
    except asyncio.TimeoutError:
        return Outcome("timeout", time.perf_counter() - start, f"no answer in {t.timeout_s} s"), None
    except Exception as exc:
        return Outcome(f"exception:{type(exc).__name__}", time.perf_counter() - start, repr(exc)[:300]), None
    seconds = time.perf_counter() - start
    status = resp.status_code
    problem = ""
    if status == 503:
        if t.strict and not case.unavailable_ok:
            problem = "503 where every model is ready"
    elif status not in HTTP_OK:
        problem = f"HTTP {status}"
    bodyless = case.path.endswith("/ready") or case.path.startswith("/v2/health/")  # 400: not ready, no body
    if status >= 400 and not problem and not (bodyless and not resp.content):
        try:
            body = resp.json()
            if not (isinstance(body, dict) and isinstance(body.get("error"), str)):
                problem = "error body is not {'error': str}"
        except ValueError:
            problem = "error body is not JSON"
    if problem:
        problem += f": {resp.text[:300]!r}"
    return Outcome(str(status), seconds, problem), resp


def _grpc_ok(t: Targets, code: str, unavailable_ok: bool) -> str:
    if code == "UNAVAILABLE":
        return "UNAVAILABLE where every model is ready" if t.strict and not unavailable_ok else ""
    if code == "DEADLINE_EXCEEDED":
        return f"no answer in {t.timeout_s} s"
    return "" if code in GRPC_OK else code


async def grpc_unary(t: Targets, rpc: str, payload: bytes) -> tuple[str, str, bytes]:
    """(status name, details, response bytes) of one unary call, payload sent as is."""
    call = t.channel.unary_unary(SERVICE + rpc)
    try:
        resp = await call(payload, timeout=t.timeout_s)
        return "OK", "", resp
    except grpc.aio.AioRpcError as exc:
        return _grpc_code(exc), exc.details() or "", b""


async def run_grpc(t: Targets, case: GrpcCase) -> Outcome:
    start = time.perf_counter()
    try:
        if case.rpc != "ModelStreamInfer":
            code, details, _ = await grpc_unary(t, case.rpc, case.payloads[0])
            problem = _grpc_ok(t, code, case.unavailable_ok)
            return Outcome(code, time.perf_counter() - start, f"{problem}: {details[:300]!r}" if problem else "")
        return await run_stream(t, case, start)
    except Exception as exc:
        return Outcome(f"exception:{type(exc).__name__}", time.perf_counter() - start, repr(exc)[:300])


async def run_stream(t: Targets, case: GrpcCase, start: float) -> Outcome:
    """Each message alone (unary) and then all in one stream: the stream answers each in-band, alike."""
    alone = []
    for payload in case.payloads:
        code, details, _ = await grpc_unary(t, "ModelInfer", payload)
        if problem := _grpc_ok(t, code, case.unavailable_ok):
            return Outcome(code, time.perf_counter() - start, f"{problem} (alone): {details[:300]!r}")
        alone.append(details if code != "OK" else "")
    call = t.channel.stream_stream(SERVICE + "ModelStreamInfer")

    async def requests() -> AsyncIterator[bytes]:
        for payload in case.payloads:
            yield payload

    try:
        answers = [r async for r in call(requests(), timeout=t.timeout_s)]
    except grpc.aio.AioRpcError as exc:
        code = _grpc_code(exc)
        return Outcome(code, time.perf_counter() - start, f"stream ended with {code}: {exc.details()!r}")
    seconds = time.perf_counter() - start
    in_band = sorted(pb.ModelStreamInferResponse.FromString(a).error_message for a in answers)
    if len(answers) != len(case.payloads):
        return Outcome("STREAM", seconds, f"{len(answers)} answers to {len(case.payloads)} requests")
    if in_band != sorted(alone):
        return Outcome("STREAM", seconds, f"in-band {in_band!r} != alone {sorted(alone)!r}"[:600])
    return Outcome("STREAM_OK", seconds)


async def run_parity(t: Targets, case: ParityCase) -> Outcome:
    start = time.perf_counter()
    h, resp = await run_http(t, case.http)
    g = await run_grpc(t, case.grpc)
    seconds = time.perf_counter() - start
    status = f"{h.status}={g.status}"
    if h.problem or g.problem:
        return Outcome(status, seconds, h.problem or g.problem)
    if GRPC_TO_HTTP.get(g.status) != int(h.status):
        return Outcome(status, seconds, f"HTTP {h.status} but gRPC {g.status}")
    if resp is not None and resp.status_code >= 400 and resp.status_code != 413:  # gRPC's 413 is grpc's own
        _, details, _ = await grpc_unary(t, "ModelInfer", case.grpc.payloads[0])
        message = resp.json()["error"]
        if details != message:
            return Outcome(status, seconds, f"messages differ: HTTP {message!r} / gRPC {details!r}"[:600])
    return Outcome(status, seconds)


async def run_case(t: Targets, case: Case) -> Outcome:
    if isinstance(case, HttpCase):
        return (await run_http(t, case))[0]
    if isinstance(case, GrpcCase):
        return await run_grpc(t, case)
    return await run_parity(t, case)


async def health(t: Targets, gen: Generator) -> str:
    """Empty when the server is ready on both protocols and serves a valid request; else what is wrong."""
    try:
        resp = await asyncio.wait_for(t.http.get("/v2/health/ready"), t.timeout_s)
        if resp.status_code != 200:
            return f"HTTP ready answered {resp.status_code}"
        code, details, data = await grpc_unary(t, "ServerReady", pb.ServerReadyRequest().SerializeToString())
        if code != "OK" or not pb.ServerReadyResponse.FromString(data).ready:
            return f"gRPC ServerReady answered {code} {details}"
        candidates = [m for m in gen.ready if not m.sequence] or gen.ready
        model = min(candidates, key=lambda m: (m.name != "add_sub", m.name))
        req = gen.valid(random.Random(0), model)
        doc, _ = http_doc(req, set())
        resp = await asyncio.wait_for(t.http.post(infer_path(model.name, ""), content=_json(doc)), t.timeout_s)
        if resp.status_code != 200:
            return f"valid HTTP inference on {model.name} answered {resp.status_code}: {resp.text[:200]}"
        code, details, _ = await grpc_unary(t, "ModelInfer", grpc_message(req, raw=True).SerializeToString())
        if code != "OK":
            return f"valid gRPC inference on {model.name} answered {code}: {details[:200]}"
    except Exception as exc:
        return f"health check failed: {exc!r}"
    return ""


# --------------------------------------------------------------------------- report


@dataclass
class Report:
    statuses: dict[str, Counter[str]] = field(default_factory=dict)
    cases: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[str, int, str, Outcome]] = field(default_factory=list)  # protocol, index, kind, outcome
    slowest: dict[str, tuple[float, int, str]] = field(default_factory=dict)
    health: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    def add(self, protocol: str, index: int, case: Case, outcome: Outcome) -> None:
        self.cases[protocol] += 1
        self.statuses.setdefault(protocol, Counter())[outcome.status] += 1
        if outcome.problem:
            self.failures.append((protocol, index, case.kind, outcome))
        if outcome.seconds > self.slowest.get(protocol, (-1.0, 0, ""))[0]:
            self.slowest[protocol] = (outcome.seconds, index, case.kind)

    @property
    def ok(self) -> bool:
        return not self.failures and not self.health

    def print(self, seed: int, out: Any = sys.stdout, show: int = 20) -> None:
        for protocol, counts in self.statuses.items():
            line = "  ".join(f"{s}: {n}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
            print(f"{protocol:6} {line}", file=out)
        for protocol, (seconds, index, kind) in self.slowest.items():
            print(f"slowest {protocol}: case {index} ({kind[:80]}) {seconds * 1000:.1f} ms", file=out)
        for protocol, index, kind, outcome in self.failures[:show]:
            print(
                f"FAIL {protocol} case {index} [{kind[:80]}] -> {outcome.status}: {outcome.problem[:400]}\n"
                f"     replay: scripts/fuzz --seed {seed} --protocols {protocol} --case {index}",
                file=out,
            )
        if len(self.failures) > show:
            print(f"... and {len(self.failures) - show} more failures", file=out)
        for problem in self.health:
            print(f"NOT READY: {problem}", file=out)
        print(file=out)
        header = f"{'protocol':8} {'cases':>7} {'2xx/OK':>7} {'4xx/client':>10} {'failures':>8} {'slowest ms':>10}"
        print(header, file=out)
        print("-" * len(header), file=out)
        for protocol in self.statuses:
            counts = self.statuses[protocol]
            good = sum(n for s, n in counts.items() if s in ("200", "OK", "STREAM_OK") or s.startswith("200="))
            bad = sum(1 for f in self.failures if f[0] == protocol)
            client = self.cases[protocol] - good - bad
            slow = self.slowest[protocol][0] * 1000
            print(
                f"{protocol:8} {self.cases[protocol]:>7} {good:>7} {client:>10} {bad:>8} {slow:>10.1f}",
                file=out,
            )
        verdict = "PASS" if self.ok else "FAIL"
        total = sum(self.cases.values())
        print(
            f"{verdict}: {total} cases in {self.elapsed_s:.1f} s, server ready afterwards: {not self.health}", file=out
        )


async def fuzz(
    targets: Targets,
    gen: Generator,
    *,
    protocols: tuple[str, ...],
    cases: int,
    seed: int,
    concurrency: int = 8,
    time_limit_s: float = float("inf"),
    check_every: int = 1000,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Run ``cases`` cases of each protocol (interleaved), checking the server's health as it goes."""
    report = Report()
    start = time.monotonic()
    order: Iterator[tuple[str, int]] = ((p, i) for i in range(cases) for p in protocols)
    sem = asyncio.Semaphore(concurrency)
    pending: set[asyncio.Task[None]] = set()

    async def one(protocol: str, index: int) -> None:
        try:
            case = gen.case(protocol, seed, index)
            report.add(protocol, index, case, await run_case(targets, case))
        except Exception as exc:  # the fuzzer's own bug: counted, never silently lost
            report.add(protocol, index, HttpCase("generator", "", ""), Outcome("fuzzer-error", 0.0, repr(exc)))
        finally:
            sem.release()

    for done, (protocol, index) in enumerate(order, 1):
        if time.monotonic() - start > time_limit_s:
            break
        await sem.acquire()
        task = asyncio.create_task(one(protocol, index))
        pending.add(task)
        task.add_done_callback(pending.discard)
        if check_every and done % check_every == 0:
            await asyncio.gather(*pending)
            if problem := await health(targets, gen):
                report.health.append(f"after {done} cases: {problem}")
            if progress:
                progress(f"{done} cases, {len(report.failures)} failures, {time.monotonic() - start:.0f} s")
    await asyncio.gather(*pending)
    if problem := await health(targets, gen):
        report.health.append(f"at the end: {problem}")
    report.elapsed_s = time.monotonic() - start
    return report


# --------------------------------------------------------------------------- the server under test


def build_fuzz_repository(repo: pathlib.Path) -> pathlib.Path:
    """The integration tests' models, the sequence models, and a few more that reach other code paths."""
    from tests.support import example_models
    from tests.support.repos import build_repository
    from tests.support.sequence_repository import build_sequence_repository

    build_repository(repo)
    build_sequence_repository(repo)
    for datatype in ("BOOL", "INT8", "UINT64", "FP16", "INT64"):
        example_models.identity(repo, datatype)
    example_models.add_sub(
        repo,
        name="add_sub_queue",
        dynamic_batching=False,
        extra_config=(
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 max_queue_delay_microseconds: 100 "
            "default_queue_policy { allow_timeout_override: true max_queue_size: 64 } }"
        ),
    )
    example_models.add_sub_ensemble(repo)
    d = example_models.identity(repo, "FP32", name="scores")
    (d / "labels.txt").write_text("zero\none\ntwo\nthree\n")
    config = d / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "OUTPUT0"', 'name: "OUTPUT0" label_filename: "labels.txt"'))
    return repo


class AcceptingControl:
    """Model control that accepts every well-formed load and unload and changes nothing."""

    def __init__(self, service: Any) -> None:
        self._service = service

    async def index(self, ready_only: bool) -> list[Any]:
        return self._service.repository_index(ready_only)

    async def load(self, name: str, params: Any) -> None:
        return None

    async def unload(self, name: str, unload_dependents: bool) -> None:
        return None


@contextlib.asynccontextmanager
async def in_process(
    limits: RequestLimits = IN_PROCESS_LIMITS, timeout_s: float = 10.0, repo: pathlib.Path | None = None
) -> AsyncIterator[tuple[Targets, Any]]:
    """The real service and front ends over a temporary repository, without Ray; yields (targets, service)."""
    from serve_app.grpc_server import start_grpc_server
    from serve_app.http_server import build_http_app
    from serve_app.local.host import LocalHost
    from tests.support.net import free_port

    with contextlib.ExitStack() as stack:
        if repo is None:
            repo = build_fuzz_repository(pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory())))
        host = LocalHost.from_repository(repo)
        service = host.service
        service.repository = AcceptingControl(service)
        port = free_port()
        server = await start_grpc_server(service, "127.0.0.1", port, limits=limits)
        transport = httpx.ASGITransport(app=build_http_app(service, limits=limits))
        try:
            async with (
                httpx.AsyncClient(transport=transport, base_url="http://fuzz") as client,
                grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
            ):
                yield Targets(client, channel, strict=True, timeout_s=timeout_s), service
        finally:
            await server.stop(grace=None)
            host.close()


@contextlib.asynccontextmanager
async def remote(http: str, grpc_address: str, timeout_s: float) -> AsyncIterator[tuple[Targets, None]]:
    async with (
        httpx.AsyncClient(base_url=f"http://{http}", timeout=timeout_s) as client,
        grpc.aio.insecure_channel(grpc_address) as channel,
    ):
        yield Targets(client, channel, strict=False, timeout_s=timeout_s), None


def describe(case: Case) -> str:
    if isinstance(case, ParityCase):
        return f"{case.kind}\n--- HTTP\n{describe(case.http)}\n--- gRPC\n{describe(case.grpc)}"
    if isinstance(case, HttpCase):
        return f"{case.kind}\n{case.method} {case.path}\nheaders: {case.headers}\nbody: {case.body[:2000]!r}"
    parts = [case.kind, f"rpc: {case.rpc}"]
    for payload in case.payloads:
        try:
            text = str(pb.ModelInferRequest.FromString(payload)) if "Infer" in case.rpc else repr(payload[:2000])
        except Exception:
            text = repr(payload[:2000])
        parts.append(f"message ({len(payload)} bytes):\n{text[:4000]}")
    return "\n".join(parts)
