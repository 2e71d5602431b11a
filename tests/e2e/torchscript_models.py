"""Test-only TorchScript models (``pytorch_libtorch``), scripted with ``torch.jit.script`` (no downloads).

PyTorch is imported inside the builders, so this module (and the e2e conftest that imports it) loads
without it; :func:`build_all` then adds nothing and ``test_torchscript.py`` skips.

==========  ===  ==================================  =====================================================
model       mbs  scheduling                          what it computes
==========  ===  ==================================  =====================================================
ts_add_sub  8    dynamic batching (preferred 4, 8;   OUTPUT__0 = INPUT__0 + INPUT__1,
                 waits up to 300 ms)                 OUTPUT__1 = INPUT__0 - INPUT__1 (FP32 [16])
ts_accum    4    sequence batching, direct, one      OUTPUT__0 = OUTPUT_STATE__1 = INPUT_STATE__1 + INPUT__0
                 instance (4 slots), idle 10 s       (INT32 [1]); START__2 (int32 control) zeroes the state
==========  ===  ==================================  =====================================================

Names follow Triton's ``<name>__<index>`` convention throughout (states and controls included), so the
same repository loads in Triton's pytorch backend.
"""

from __future__ import annotations

import importlib.util
import pathlib
import warnings
from typing import Any

THREADS = 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }\n'
CPU_INSTANCE = "instance_group [ { count: 1 kind: KIND_CPU } ]\n"


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def _save(module: Any, repo: pathlib.Path, name: str, config: str) -> pathlib.Path:
    import torch

    d = repo / name
    (d / "1").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)  # "switch to torch.export"
        torch.jit.script(module).save(str(d / "1" / "model.pt"))
    (d / "config.pbtxt").write_text(config)
    return d


def add_sub(repo: pathlib.Path, name: str = "ts_add_sub", extra_config: str = "") -> pathlib.Path:
    """Triton's ``simple`` as TorchScript: (a + b, a - b)."""
    import torch

    class AddSub(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a + b, a - b

    config = (
        f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        "input [\n"
        '  { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 16 ] },\n'
        '  { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 16 ] }\n'
        "]\n"
        "output [\n"
        '  { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 16 ] },\n'
        '  { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 16 ] }\n'
        "]\n" + CPU_INSTANCE + THREADS + extra_config
    )
    return _save(AddSub(), repo, name, config)


ADD_SUB_BATCHING = "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 300000 }\n"


def accumulator(repo: pathlib.Path, name: str = "ts_accum", *, idle_us: int = 10_000_000) -> pathlib.Path:
    """A running sum with implicit state; START (1 on a sequence's first request) drops the old state."""
    import torch

    class Accumulator(torch.nn.Module):
        def forward(
            self, value: torch.Tensor, state: torch.Tensor, start: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            new = state * (1 - start) + value
            return new, new

    config = (
        f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "sequence_batching {\n"
        f"  max_sequence_idle_microseconds: {idle_us}\n"
        "  direct { }\n"
        "  control_input [\n"
        '    { name: "START__2" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }\n'
        "  ]\n"
        "  state [\n"
        "    {\n"
        '      input_name: "INPUT_STATE__1"\n'
        '      output_name: "OUTPUT_STATE__1"\n'
        "      data_type: TYPE_INT32\n"
        "      dims: [ 1 ]\n"
        '      initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }\n'
        "    }\n"
        "  ]\n"
        "}\n" + CPU_INSTANCE + THREADS
    )
    return _save(Accumulator(), repo, name, config)


def build_all(repo: pathlib.Path) -> None:
    """The ts_* models of test_torchscript.py; nothing without PyTorch."""
    if not torch_available():
        return
    add_sub(repo, extra_config=ADD_SUB_BATCHING)
    accumulator(repo)
