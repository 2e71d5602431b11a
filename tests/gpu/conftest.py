"""What the GPU tests share: the device they expect, one local server (``--local``) over the check's models,
and one ``python -m serve_app`` on a Ray of its own over the models that Ray places (``ray_server``).

Without a CUDA GPU the tests skip, naming why, except where ``nvidia-smi`` sees a GPU: there a PyTorch
that finds no CUDA fails them (a broken GPU machine must not pass as a skipped check). With
``SERVE_APP_GPU_DRY_RUN=1`` they run on the CPU instead (KIND_GPU TorchScript then runs there and reports
device -1): what ``scripts/gpu_check.sh --dry-run`` does, so the check's code runs where no GPU is. The
Ray there gets one pretend GPU (``RAY_OVERRIDE_RESOURCES``), so that Ray places the same groups.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from scripts.bench import start_server, stop_server
from tests.support import gpu_models
from tests.support.net import free_port

DRY_RUN = os.environ.get("SERVE_APP_GPU_DRY_RUN") == "1"
LOCAL_READY = b"serve_app (local, no Ray) ready"
RAY_READY = b"serve_app ready"
# The dry run's pretend GPU: Ray's GPU and the per-GPU resource a `gpus: [0]` group asks for.
DRY_RUN_RESOURCES = '{"GPU": 1, "gpu_idx_0": 1}'


def torch_cuda() -> str:
    """Why PyTorch can't run on a GPU here, or "" when it can."""
    try:
        import torch
    except ImportError as exc:
        return f"PyTorch is not installed ({exc})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA build {torch.version.cuda}) finds no CUDA GPU"
    return ""


def driver_gpus() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists (none where it is missing or fails)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in out.stdout.splitlines() if line.startswith("GPU ")] if out.returncode == 0 else []


@pytest.fixture(scope="session")
def device() -> int:
    """The CUDA ordinal the served models must report: 0, or -1 (the CPU) in a dry run."""
    if DRY_RUN:
        return -1
    reason = torch_cuda()
    if not reason:
        return 0
    gpus = driver_gpus()
    if gpus:
        pytest.fail(f"nvidia-smi lists {gpus} but {reason}")
    pytest.skip(f"no CUDA GPU: {reason} (SERVE_APP_GPU_DRY_RUN=1 runs these tests on the CPU)")


@dataclass(frozen=True)
class Server:
    http: int
    grpc: int
    metrics: int
    pid: int
    repo: pathlib.Path
    log: pathlib.Path


@pytest.fixture(scope="session")
def server(device: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``python -m serve_app --local`` over :func:`gpu_models.check_repository`, its log kept for the report."""
    tmp = tmp_path_factory.mktemp("gpu_check")
    repo = gpu_models.check_repository(tmp / "repo", on_cpu=device < 0)
    out = os.environ.get("SERVE_APP_GPU_LOGS")
    log = pathlib.Path(out) / "server-tests.log" if out else tmp / "server.log"
    ports = (free_port(), free_port(), free_port())
    proc = start_server(repo, ports, log, ["--local"], ready=LOCAL_READY)
    try:
        yield Server(*ports, proc.pid, repo, log)
    finally:
        stop_server(proc)


@pytest.fixture(scope="session")
def ray_server(device: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``python -m serve_app`` as users run it: it starts a Ray of its own (its processes in the server's
    session, ended with it) over :func:`gpu_models.ray_repository`."""
    tmp = tmp_path_factory.mktemp("gpu_ray")
    repo = gpu_models.ray_repository(tmp / "repo", on_cpu=device < 0)
    out = os.environ.get("SERVE_APP_GPU_LOGS")
    log = pathlib.Path(out) / "server-ray.log" if out else tmp / "server-ray.log"
    ports = (free_port(), free_port(), free_port())
    extra = ["--object-store-memory", str(256 * 2**20), "--instance-timeout-s", "10"]
    saved = os.environ.get("RAY_OVERRIDE_RESOURCES")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if DRY_RUN:
        os.environ["RAY_OVERRIDE_RESOURCES"] = DRY_RUN_RESOURCES
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # "" would hide Ray's pretend GPU
    try:
        proc = start_server(repo, ports, log, extra, ready=RAY_READY)
    finally:
        for name, value in (("RAY_OVERRIDE_RESOURCES", saved), ("CUDA_VISIBLE_DEVICES", visible)):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        yield Server(*ports, proc.pid, repo, log)
    finally:
        stop_server(proc)
