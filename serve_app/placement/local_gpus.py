"""The per-GPU resources a Ray that serve_app starts on this machine declares, so that instance groups
listing ``gpus`` place there as they do on a cluster whose nodes declare them (``gpu_resource_prefix``).

Triton numbers GPUs as its process sees them: ``gpus: [0]`` is the first GPU ``CUDA_VISIBLE_DEVICES``
leaves visible. A Ray we start on one machine has nobody to declare ``<prefix><i>`` for it, and without
them such a group can't be placed; we declare one per GPU this machine shows.
"""

from __future__ import annotations


def visible_gpu_count(cuda_visible_devices: str | None, smi_lines: list[str]) -> int:
    """GPUs this process may use: those ``CUDA_VISIBLE_DEVICES`` names when it is set, else those the
    driver lists (``nvidia-smi -L``)."""
    if cuda_visible_devices is not None:
        return len([d for d in cuda_visible_devices.split(",") if d.strip()])
    return sum(1 for line in smi_lines if line.startswith("GPU "))


def gpu_resources(prefix: str, count: int) -> dict[str, float]:
    """``{"<prefix>0": 1, ...}``: one custom resource per GPU index."""
    return {f"{prefix}{i}": 1.0 for i in range(count)}
