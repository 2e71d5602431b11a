"""TorchScript and ONNX models for a GPU (``KIND_GPU``, ``gpus: [0]``), built where they run (no downloads).

Every TorchScript model here also answers ``DEVICE__<n>`` (INT32 ``[1]`` per batch item): the CUDA
ordinal its input was on when ``forward`` ran, -1 on the CPU, so a client sees where the server ran it.
PyTorch is imported inside the builders: the module loads without it.

=============  ===  ==================================================================================
model          mbs  what it computes
=============  ===  ==================================================================================
ts_add_sub     8    OUTPUT__0 = INPUT__0 + INPUT__1, OUTPUT__1 = INPUT__0 - INPUT__1 (FP32 [16])
ts_mlp         64   OUTPUT__0 = an MLP of INPUT__0 (FP32 [MLP_IN] -> [MLP_OUT], ReLU between layers)
onnx_add_sub   8    ONNX add_sub (FP32 [16]) on ONNX Runtime's CUDA execution provider
=============  ===  ==================================================================================
"""

from __future__ import annotations

import itertools
import pathlib
import warnings
from typing import Any

GPU_GROUP = "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]\n"
CPU_GROUP = "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
MLP_IN, MLP_HIDDEN, MLP_OUT, MLP_LAYERS = 1024, 4096, 1024, 4


def batching(enabled: bool, max_queue_delay_us: int = 0) -> str:
    if not enabled:
        return ""
    delay = f" max_queue_delay_microseconds: {max_queue_delay_us}" if max_queue_delay_us else ""
    return f"dynamic_batching {{{delay} }}\n"


def _save(module: Any, repo: pathlib.Path, name: str, config: str) -> pathlib.Path:
    import torch

    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)  # "switch to torch.export"
        torch.jit.script(module).save(str(d / "1" / "model.pt"))
    (d / "config.pbtxt").write_text(config)
    return d


def _io(inputs: list[tuple[str, str, int]], outputs: list[tuple[str, str, int]]) -> str:
    def block(kind: str, tensors: list[tuple[str, str, int]]) -> str:
        rows = ",\n".join(f'  {{ name: "{n}" data_type: TYPE_{t} dims: [ {d} ] }}' for n, t, d in tensors)
        return f"{kind} [\n{rows}\n]\n"

    return block("input", inputs) + block("output", outputs)


def ts_add_sub(
    repo: pathlib.Path, name: str = "ts_add_sub", *, group: str = GPU_GROUP, extra: str = ""
) -> pathlib.Path:
    """Triton's ``simple`` as TorchScript, with the device it ran on."""
    import torch

    class AddSub(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            device = torch.full((a.shape[0], 1), a.get_device(), dtype=torch.int32, device=a.device)
            return a + b, a - b, device

    config = (
        f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        + _io(
            [("INPUT__0", "FP32", 16), ("INPUT__1", "FP32", 16)],
            [("OUTPUT__0", "FP32", 16), ("OUTPUT__1", "FP32", 16), ("DEVICE__2", "INT32", 1)],
        )
        + group
        + extra
    )
    return _save(AddSub(), repo, name, config)


def ts_mlp(
    repo: pathlib.Path,
    name: str = "ts_mlp",
    *,
    group: str = GPU_GROUP,
    extra: str = "",
    hidden: int = MLP_HIDDEN,
    layers: int = MLP_LAYERS,
    seed: int = 0,
) -> pathlib.Path:
    """An MLP big enough that a GPU batch costs about what one item does (weights seeded, saved on the CPU);
    ``hidden``/``layers`` smaller for a run on the CPU."""
    import torch

    torch.manual_seed(seed)
    widths = [MLP_IN] + [hidden] * (layers - 1) + [MLP_OUT]

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in itertools.pairwise(widths))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            device = torch.full((x.shape[0], 1), x.get_device(), dtype=torch.int32, device=x.device)
            n = len(self.layers)
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < n - 1:
                    x = torch.relu(x)
            return x, device

    config = (
        f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: 64\n'
        + _io([("INPUT__0", "FP32", MLP_IN)], [("OUTPUT__0", "FP32", MLP_OUT), ("DEVICE__1", "INT32", 1)])
        + group
        + extra
    )
    return _save(Mlp().eval(), repo, name, config)


def onnx_add_sub(repo: pathlib.Path, name: str = "onnx_add_sub") -> pathlib.Path:
    """ONNX add_sub on the GPU: ONNX Runtime's CUDA execution provider (the model fails to load without it)."""
    from scripts import example_models  # imports onnx: not for the benchmark's client processes

    return example_models.add_sub(repo, name=name, extra_config=GPU_GROUP)


def load_cpu(model_dir: pathlib.Path) -> Any:
    """The saved module on the CPU: what the served results are compared with."""
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        return torch.jit.load(str(model_dir / "1" / "model.pt"), map_location="cpu").eval()


# The check's repository: what tests/gpu serves (the batcher waits so that concurrent requests batch).
SERVED_MLP = "ts_mlp"
BATCHED_MLP = "ts_mlp_db"
CPU_MLP = {"hidden": 64, "layers": 2}  # the dry run's MLP: the same graph, small enough for a CPU


def check_repository(repo: pathlib.Path, *, on_cpu: bool = False) -> pathlib.Path:
    """ts_add_sub, ts_mlp, ts_mlp_db (dynamic batching, waits up to 20 ms) and onnx_add_sub, all KIND_GPU
    (``on_cpu``: the MLPs small; a GPU group without CUDA runs TorchScript on the CPU, so the dry run
    serves the same configs)."""
    sizes: dict[str, int] = dict(CPU_MLP) if on_cpu else {}
    ts_add_sub(repo)
    ts_mlp(repo, SERVED_MLP, **sizes)
    ts_mlp(repo, BATCHED_MLP, extra=batching(True, max_queue_delay_us=20_000), **sizes)
    onnx_add_sub(repo)
    return repo


# ---------------------------------------------------------------------------------------------------
# Under Ray: what `python -m serve_app` places on the GPU through Ray's resources (tests/gpu/test_ray_gpu.py)

TWO_ON_GPU0 = "instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]\n"
DEDICATED = 'parameters { key: "dedicated_process" value: { string_value: "true" } }\n'
ACCUMULATOR = "ts_accum"
PY_TORCH = "py_torch"
ONNX_CPU = "onnx_cpu"  # a KIND_CPU ONNX model: its instances live in the gateways (their CUDA_VISIBLE_DEVICES)

# A Python model that runs torch on the device its instance was given (Triton's ``model_instance_kind`` and
# ``model_instance_device_id``), the same file for Triton's python backend and for serve_app.
PY_TORCH_MODEL = """\
import json
import os

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        gpu = args["model_instance_kind"] == "GPU" and torch.cuda.is_available()
        self.device = torch.device(f"cuda:{args['model_instance_device_id']}" if gpu else "cpu")
        here = os.path.join(args["model_repository"], args["model_version"], "model.pt")
        self.module = torch.jit.load(here, map_location=self.device).eval()
        self.pid = os.getpid()

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT__0").as_numpy() for r in requests]
        sizes = [len(x) for x in xs]
        with torch.inference_mode():
            out, device = self.module(torch.from_numpy(np.concatenate(xs)).to(self.device))
            out, device = out.cpu().numpy(), device.cpu().numpy()
        responses, start = [], 0
        for n in sizes:
            pid = np.full((n, 1), self.pid, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT__0", out[start:start + n]),
                pb_utils.Tensor("DEVICE__1", device[start:start + n]),
                pb_utils.Tensor("PID__2", pid),
            ]))
            start += n
        return responses
"""


def py_torch(
    repo: pathlib.Path, name: str = PY_TORCH, *, group: str = TWO_ON_GPU0, extra: str = "", **sizes: int
) -> pathlib.Path:
    """The MLP run by PyTorch inside a Python model (``model.py`` loads ``model.pt`` beside it), answering
    the CUDA ordinal and the process of the instance that ran it."""
    mlp = ts_mlp(repo / ".build", name, **sizes)
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (mlp / "1" / "model.pt").rename(d / "1" / "model.pt")
    (d / "1" / "model.py").write_text(PY_TORCH_MODEL)
    config = (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 64\n'
        + _io(
            [("INPUT__0", "FP32", MLP_IN)],
            [("OUTPUT__0", "FP32", MLP_OUT), ("DEVICE__1", "INT32", 1), ("PID__2", "INT32", 1)],
        )
        + group
        + extra
    )
    (d / "config.pbtxt").write_text(config)
    import shutil

    shutil.rmtree(repo / ".build")
    return d


def ts_accumulator(repo: pathlib.Path, name: str = ACCUMULATOR) -> pathlib.Path:
    """A running sum in implicit state, on the GPU (``OUTPUT_STATE = INPUT_STATE + INPUT``), in a process of
    its own with its state backed up (serve_app's default), so a killed instance's sequences go on."""
    import torch

    class Accumulate(torch.nn.Module):
        def forward(self, value: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            total = state + value
            device = torch.full((value.shape[0], 1), value.get_device(), dtype=torch.int32, device=value.device)
            return total, total, device

    config = (
        f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: 2\n'
        + _io([("INPUT__0", "INT32", 1)], [("OUTPUT__0", "INT32", 1), ("DEVICE__2", "INT32", 1)])
        + "sequence_batching {\n  max_sequence_idle_microseconds: 60000000\n  direct { }\n"
        + '  state [ { input_name: "INPUT_STATE__1" output_name: "OUTPUT_STATE__1" data_type: TYPE_INT32'
        + ' dims: [ 1 ]\n    initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]\n}\n'
        + "instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]\n"
        + DEDICATED
    )
    return _save(Accumulate(), repo, name, config)


def ray_repository(repo: pathlib.Path, *, on_cpu: bool = False) -> pathlib.Path:
    """What the check serves on Ray: ts_add_sub, ts_mlp_db (batched), py_torch (two instances sharing GPU
    0, torch inside a Python model), ts_accum (sequences with implicit state), onnx_add_sub (CUDA
    provider) and onnx_cpu (KIND_CPU, in the gateways)."""
    from scripts import example_models

    sizes: dict[str, int] = dict(CPU_MLP) if on_cpu else {}
    ts_add_sub(repo)
    ts_mlp(repo, BATCHED_MLP, extra=batching(True, max_queue_delay_us=20_000), **sizes)
    py_torch(repo, extra=batching(True, max_queue_delay_us=20_000), **sizes)
    ts_accumulator(repo)
    onnx_add_sub(repo)
    example_models.add_sub(repo, name=ONNX_CPU, extra_config=CPU_GROUP)
    return repo
