"""A small KServe v2 client over HTTP (binary tensors) and gRPC, with no tritonclient.

For the machines that have no tritonclient (the GPU check's) and for load loops that want a
persistent connection per thread: one request, its decoded outputs, nothing else.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from serve_app import datatypes
from serve_app.protos import grpc_service_pb2 as pb

GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


class HttpClient:
    """One keep-alive connection; tensors travel in the binary tensor data extension."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 120.0) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)

    def get_json(self, path: str) -> Any:
        try:
            self.conn.request("GET", path)
            response = self.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionError):  # the server closed an idle connection
            self.conn.close()
            self.conn.request("GET", path)
            response = self.conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {path}: {response.status} {body[:500]!r}")
        return json.loads(body)

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        binary: bool = True,
        parameters: Mapping[str, Any] | None = None,
    ) -> dict[str, np.ndarray]:
        """``parameters``: the request's own (``sequence_id``, ``sequence_start``, ...)."""
        header: dict[str, Any] = {"inputs": [], "outputs": [{"name": n, "parameters": {"binary_data": binary}}
                                                          for n in outputs]}  # fmt: skip
        if parameters:
            header["parameters"] = dict(parameters)
        raw = []
        for name, arr in inputs.items():
            arr = np.ascontiguousarray(arr)
            entry: dict[str, Any] = {"name": name, "shape": list(arr.shape),
                                     "datatype": datatypes.from_numpy(arr.dtype).wire_name}  # fmt: skip
            if binary:
                entry["parameters"] = {"binary_data_size": arr.nbytes}
                raw.append(arr.tobytes())
            else:
                entry["data"] = arr.ravel().tolist()
            header["inputs"].append(entry)
        head = json.dumps(header).encode()
        body = head + b"".join(raw)
        headers = {"Content-Type": "application/octet-stream"}
        if binary:
            headers["Inference-Header-Content-Length"] = str(len(head))
        self.conn.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers)
        response = self.conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"infer {model}: {response.status} {data[:500]!r}")
        length = response.getheader("Inference-Header-Content-Length")
        split = int(length) if length else len(data)
        return decode_http(json.loads(data[:split]), data[split:])

    def close(self) -> None:
        self.conn.close()


def decode_http(header: Mapping[str, Any], blob: bytes) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    offset = 0
    for o in header["outputs"]:
        dtype = datatypes.from_wire(o["datatype"]).numpy
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            out[o["name"]] = np.frombuffer(blob[offset : offset + size], dtype=dtype).reshape(o["shape"])
            offset += size
        else:
            out[o["name"]] = np.array(o["data"], dtype=dtype).reshape(o["shape"])
    return out


class GrpcClient:
    """One channel; tensors travel in ``raw_input_contents`` / ``raw_output_contents``."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 120.0) -> None:
        self.channel = grpc.insecure_channel(f"{host}:{port}")
        self.timeout = timeout
        self._infer = self.channel.unary_unary(
            GRPC_INFER,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        request = pb.ModelInferRequest(model_name=model)
        for name, arr in inputs.items():
            arr = np.ascontiguousarray(arr)
            request.inputs.add(name=name, datatype=datatypes.from_numpy(arr.dtype).wire_name, shape=list(arr.shape))
            request.raw_input_contents.append(arr.tobytes())
        for name in outputs:
            request.outputs.add(name=name)
        response = self._infer(request, timeout=self.timeout)
        return {
            o.name: np.frombuffer(raw, dtype=datatypes.from_wire(o.datatype).numpy).reshape(list(o.shape))
            for o, raw in zip(response.outputs, response.raw_output_contents, strict=True)
        }

    def close(self) -> None:
        self.channel.close()


def batch_counts(stats: Mapping[str, Any]) -> dict[int, int]:
    """batch size -> executions, from one model's entry of the statistics extension."""
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}
