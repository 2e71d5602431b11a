"""The per-GPU resources a Ray started on one machine declares: one per GPU the process may use."""

from __future__ import annotations

from serve_app.placement.local_gpus import gpu_resources, visible_gpu_count

SMI = ["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)", "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)"]


def test_the_driver_s_gpus_when_cuda_visible_devices_is_unset() -> None:
    assert visible_gpu_count(None, SMI) == 2
    assert visible_gpu_count(None, ["No devices were found"]) == 0


def test_cuda_visible_devices_decides_when_set() -> None:
    assert visible_gpu_count("1", SMI) == 1
    assert visible_gpu_count("", SMI) == 0
    assert visible_gpu_count("0, 1,", []) == 2


def test_one_resource_per_index() -> None:
    assert gpu_resources("gpu_idx_", 2) == {"gpu_idx_0": 1.0, "gpu_idx_1": 1.0}
    assert gpu_resources("gpu_idx_", 0) == {}
