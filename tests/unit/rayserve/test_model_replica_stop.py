"""A dedicated replica going away (unloaded, reloaded, scaled down, or the server shutting down) closes its
instance: a Python model's ``finalize`` runs, as Triton's stub runs it before exiting."""

from __future__ import annotations

import pathlib

from serve_app.config import parse_config
from serve_app.rayserve.model_replica import ModelReplica

CONFIG = """
name: "fin"
backend: "python"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "marker" value: { string_value: "%s" } }
"""

MODEL = """
import json
import pathlib


class TritonPythonModel:
    def initialize(self, args):
        self.marker = pathlib.Path(json.loads(args["model_config"])["parameters"]["marker"]["string_value"])

    def execute(self, requests):
        return []

    def finalize(self):
        self.marker.write_text("finalized")
"""


async def test_stopping_a_dedicated_replica_runs_finalize(tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "finalized"
    model_file = tmp_path / "fin" / "1" / "model.py"
    model_file.parent.mkdir(parents=True)
    model_file.write_text(MODEL)
    config = parse_config(CONFIG % marker, model="fin", path="config.pbtxt")
    replica = ModelReplica("fin", 1, config.SerializeToString(), str(model_file), "KIND_CPU")
    assert replica.load_error == ""
    assert not marker.exists()
    await replica.stop()
    assert marker.read_text() == "finalized"
