"""A fuzz case is data: what to send, and whether 503 is a right answer.  Also the shared random
values (junk JSON, odd model names and versions) the per-protocol generators draw from."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serve_app.protos import grpc_service_pb2 as pb
from tests.support.fuzz.discovery import ModelInfo

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


def utf8(text: str) -> str:
    """``text`` as protobuf can carry it (lone surrogates replaced)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def junk_scalar(rng: random.Random) -> Any:
    value = junk(rng)
    return value if isinstance(value, (bool, int, float, str)) and not isinstance(value, list) else 1.5


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
