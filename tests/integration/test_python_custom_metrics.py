"""Triton's custom metrics from a Python model (``pb_utils.MetricFamily``), in process: what the model counts
shows on the metrics port after Triton's own metrics, as Triton's custom_metrics example expects it."""

from __future__ import annotations

import pathlib
import textwrap

import httpx
import numpy as np

from serve_app.http_server import build_metrics_app
from serve_app.inference.types import InferRequest, InferTensor
from serve_app.local.service import LocalService

CONFIG = """
name: "py_counting"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # As in Triton, a family outlives its metrics: they refuse to work once it is deleted.
        self.elements_family = pb_utils.MetricFamily(
            name="py_counting_elements", description="Elements seen", kind=pb_utils.MetricFamily.COUNTER
        )
        self.elements = self.elements_family.Metric(labels={"model": "py_counting", "version": "1"})
        self.last_family = pb_utils.MetricFamily(
            name="py_counting_last_sum", description="Sum of the last request", kind=pb_utils.MetricFamily.GAUGE
        )
        self.last = self.last_family.Metric()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.elements.increment(x.size)
            self.last.set(float(x.sum()))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""


STREAMING_CONFIG = """
name: "py_counting_stream"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

STREAMING_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(
            name="py_counting_stream_responses", description="Responses sent", kind=pb_utils.MetricFamily.COUNTER
        )
        self.sent = self.family.Metric()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            for i in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
                self.sent.increment(1)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def write(repo: pathlib.Path, name: str, config: str, model: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(model))


async def test_a_models_own_metrics_reach_the_metrics_port(tmp_path: pathlib.Path) -> None:
    write(tmp_path, "py_counting", CONFIG, MODEL)
    write(tmp_path, "py_counting_stream", STREAMING_CONFIG, STREAMING_MODEL)
    host = LocalService.from_repository(tmp_path)
    try:
        service = host.service
        for value in (1.0, 2.0):
            data = np.full(4, value, np.float32)
            request = InferRequest("py_counting", inputs=[InferTensor("INPUT0", "FP32", (4,), data)])
            await service.infer(service.model("py_counting"), request)
        streamed = InferRequest(
            "py_counting_stream", inputs=[InferTensor("IN", "INT32", (1,), np.array([3], np.int32))]
        )
        async for _ in service.infer_stream(service.model("py_counting_stream"), streamed):
            pass
        transport = httpx.ASGITransport(app=build_metrics_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            text = (await client.get("/metrics")).text
    finally:
        host.close()
    lines = text.splitlines()
    assert "# HELP py_counting_elements Elements seen" in lines
    assert "# TYPE py_counting_elements counter" in lines
    assert 'py_counting_elements{model="py_counting",version="1"} 8' in lines
    assert "# TYPE py_counting_last_sum gauge" in lines
    assert "py_counting_last_sum 8" in lines
    triton_first = lines.index("# TYPE nv_inference_request_success counter")
    assert lines.index("# TYPE py_counting_elements counter") > triton_first
    assert "py_counting_stream_responses 3" in lines  # a decoupled model's too, with its final responses
