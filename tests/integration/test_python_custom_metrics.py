"""Triton's custom metrics from a Python model (``pb_utils.MetricFamily``), in process: what the model counts
shows on the metrics port after Triton's own metrics, as Triton's custom_metrics example expects it."""

from __future__ import annotations

import pathlib
import textwrap

import httpx
import numpy as np

from serve_app.http_server import build_metrics_app
from serve_app.inference.types import InferRequest, InferTensor
from serve_app.local.host import LocalHost

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
        family = pb_utils.MetricFamily(
            name="py_counting_elements", description="Elements seen", kind=pb_utils.MetricFamily.COUNTER
        )
        self.elements = family.Metric(labels={"model": "py_counting", "version": "1"})
        self.last = pb_utils.MetricFamily(
            name="py_counting_last_sum", description="Sum of the last request", kind=pb_utils.MetricFamily.GAUGE
        ).Metric()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.elements.increment(x.size)
            self.last.set(float(x.sum()))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""


async def test_a_models_own_metrics_reach_the_metrics_port(tmp_path: pathlib.Path) -> None:
    (tmp_path / "py_counting" / "1").mkdir(parents=True)
    (tmp_path / "py_counting" / "config.pbtxt").write_text(textwrap.dedent(CONFIG))
    (tmp_path / "py_counting" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    host = LocalHost.from_repository(tmp_path)
    try:
        service = host.service
        for value in (1.0, 2.0):
            data = np.full(4, value, np.float32)
            request = InferRequest("py_counting", inputs=[InferTensor("INPUT0", "FP32", (4,), data)])
            await service.infer(service.model("py_counting"), request)
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
