"""The device of the one instance a local server makes of a model: its first instance group's.

A local server runs every model in its own process, which sees every GPU, so a ``KIND_GPU`` group's
first listed GPU index (0 when it lists none) is the CUDA ordinal the instance uses, as in Triton.
``KIND_AUTO`` stays on the CPU here: the local server does not probe for GPUs (frameworks are the
backends' to import), so a model meant for a GPU names ``KIND_GPU``.
"""

from __future__ import annotations

from dataclasses import dataclass

from serve_app.protos import model_config_pb2 as mc


@dataclass(frozen=True)
class LocalDevice:
    kind: str  # KIND_CPU | KIND_GPU | KIND_MODEL
    gpu_ids: tuple[int, ...] = ()
    group_index: int | None = None  # the group's position in config.instance_group


def local_device(config: mc.ModelConfig) -> LocalDevice:
    if not config.instance_group:
        return LocalDevice("KIND_CPU")
    group = config.instance_group[0]
    kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
    if kind == "KIND_GPU":
        return LocalDevice(kind, (group.gpus[0] if group.gpus else 0,), 0)
    if kind == "KIND_MODEL":
        return LocalDevice(kind, (), 0)
    return LocalDevice("KIND_CPU", (), 0)
