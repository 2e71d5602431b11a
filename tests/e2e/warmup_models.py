"""Test-only models for model warmup (``model_warmup`` in config.pbtxt), built on example_models.add_sub.

=============  ==========================================================================================
model          warmup
=============  ==========================================================================================
warmup_ok      'zeros' (batch 4, count 2), 'random' (batch 1), 'from file' (batch 8, INPUT0 from
               warmup/input0.bin): 3 samples, 4 executions per instance, then READY
warmup_bad     'fine' (zeros), then 'missing INPUT1' (gives INPUT0 only): onnxruntime fails the second
               sample, so the model is UNAVAILABLE with "failed to run warmup sample 'missing INPUT1'"
=============  ==========================================================================================
"""

from __future__ import annotations

import pathlib

import numpy as np

from scripts import example_models

ZEROS = "data_type: TYPE_FP32 dims: [ 16 ] zero_data: true"
RANDOM = "data_type: TYPE_FP32 dims: [ 16 ] random_data: true"
FROM_FILE = 'data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "input0.bin"'


def _sample(name: str, inputs: dict[str, str], batch_size: int, count: int = 0) -> str:
    body = "\n".join(f'  inputs {{ key: "{k}" value: {{ {v} }} }}' for k, v in inputs.items())
    return f'model_warmup {{\n  name: "{name}"\n  batch_size: {batch_size}\n  count: {count}\n{body}\n}}\n'


OK_WARMUP = (
    _sample("zeros", {"INPUT0": ZEROS, "INPUT1": ZEROS}, batch_size=4, count=2)
    + _sample("random", {"INPUT0": RANDOM, "INPUT1": RANDOM}, batch_size=1)
    + _sample("from file", {"INPUT0": FROM_FILE, "INPUT1": ZEROS}, batch_size=8)
)
BAD_WARMUP = _sample("fine", {"INPUT0": ZEROS, "INPUT1": ZEROS}, batch_size=1) + _sample(
    "missing INPUT1", {"INPUT0": ZEROS}, batch_size=2
)


def build(repo: pathlib.Path) -> None:
    ok = example_models.add_sub(repo, name="warmup_ok", extra_config=OK_WARMUP)
    (ok / "warmup").mkdir()
    (ok / "warmup" / "input0.bin").write_bytes(np.arange(16, dtype="<f4").tobytes())
    example_models.add_sub(repo, name="warmup_bad", extra_config=BAD_WARMUP)
