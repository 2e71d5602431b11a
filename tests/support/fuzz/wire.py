"""How a ``Request`` goes on each wire: one request, encoded for HTTP and for gRPC, is what parity compares."""

from __future__ import annotations

import json
import re
import struct
import urllib.parse
from typing import Any

import numpy as np

from serve_app.protos import grpc_service_pb2 as pb
from tests.support.fuzz.cases import NUMPY, HttpCase, Request, Tensor, utf8


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


def compact_json(obj: Any) -> bytes:
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
    header = compact_json(doc)
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
