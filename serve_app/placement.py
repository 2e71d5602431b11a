"""Map a model's ``instance_group`` onto Ray Serve replica groups.

Triton turns each instance group into model instances on devices; we turn it into
Ray Serve replicas with resource requests, following Triton's normalisation
(``NormalizeInstanceGroup``) and validation (``ValidateInstanceGroup``) so that a
config Triton accepts places the same number of instances here, and one Triton
rejects fails here with a similar message.  Pure: no Ray import, so the planner
and its tests run without a cluster.

Rules, per group (``count`` 0 means Triton's default of 1):

* ``KIND_CPU``: ``count`` replicas, no GPU; listing ``gpus`` is an error.
* ``KIND_GPU``: ``count`` replicas for each listed GPU, or for each GPU of the
  cluster when ``gpus`` is empty; each asks for ``1/count`` of a GPU so the
  ``count`` instances of one GPU share it (Triton runs them on the same device).
  An error when the cluster has no GPU or a listed index is not in it.
* ``KIND_AUTO``: ``KIND_GPU`` when the cluster has GPUs (and every listed GPU
  exists), else ``KIND_CPU``, as Triton resolves it.
* ``KIND_MODEL``: ``count`` replicas that ask Ray for no GPU: the model places
  itself on whatever devices it sees (Triton's meaning: the backend, not the
  server, picks devices).  A deployment that needs GPUs visible to such a model
  must arrange that itself; listing ``gpus`` is an error, as in Triton.

With no ``instance_group`` at all, Triton adds one group named after the model,
of kind ``KIND_AUTO`` and count 1: one GPU instance per GPU, or one CPU instance.

Not modelled: ``passive`` groups (Triton loads them but never schedules them),
``secondary_devices``, ``rate_limiter`` and ``host_policy``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from serve_app.errors import InvalidConfig
from serve_app.protos import model_config_pb2 as mc

KIND_CPU = "KIND_CPU"
KIND_GPU = "KIND_GPU"
KIND_MODEL = "KIND_MODEL"

# Ray accounts resources in units of 1/10000 (ray_constants.MIN_RESOURCE_GRANULARITY);
# a share is rounded down to that grid so ``count`` shares never exceed one GPU.
_GPU_GRANULARITY = 10_000


@dataclass(frozen=True)
class ClusterGpus:
    """What the cluster offers: the GPUs that instance groups may name."""

    total: int  # GPUs in the cluster (0 = CPU only); valid indices are 0..total-1


@dataclass(frozen=True)
class ReplicaGroup:
    """One instance group as Ray Serve replicas, with per-replica resources."""

    group_name: str  # the config's name, or "<model>_<index>" like Triton
    kind: str  # "KIND_CPU" | "KIND_GPU" | "KIND_MODEL" (KIND_AUTO resolved)
    num_replicas: int
    num_cpus: float  # per replica
    num_gpus: float  # per replica (fractional when several instances share a GPU)
    gpus: tuple[int, ...]  # GPU indices the config asked for (empty = any)


def plan_replicas(
    config: mc.ModelConfig, cluster: ClusterGpus, *, cpus_per_instance: float = 1.0
) -> list[ReplicaGroup]:
    """The replica groups that serve ``config``'s instance groups on ``cluster``.

    Raises :class:`InvalidConfig` naming the model and the offending field.
    """
    model = config.name
    if cluster.total < 0:
        raise ValueError(f"cluster GPU total must be >= 0, got {cluster.total}")
    if cpus_per_instance < 0:
        raise ValueError(f"cpus_per_instance must be >= 0, got {cpus_per_instance}")

    if not config.instance_group:
        # Triton's default group: named after the model, KIND_AUTO, count 1.
        default = mc.ModelInstanceGroup(name=model, kind=mc.ModelInstanceGroup.KIND_AUTO, count=1)
        return [_plan_group(model, 0, default, cluster, cpus_per_instance)]
    return [
        _plan_group(model, index, group, cluster, cpus_per_instance)
        for index, group in enumerate(config.instance_group)
    ]


def _plan_group(
    model: str, index: int, group: mc.ModelInstanceGroup, cluster: ClusterGpus, cpus: float
) -> ReplicaGroup:
    name = group.name or f"{model}_{index}"
    field = f"instance_group[{index}]"

    def fail(subfield: str, why: str) -> InvalidConfig:
        return InvalidConfig(f"model '{model}': {field}.{subfield}: instance group {name} {why}")

    if group.count < 0:
        raise fail("count", f"has count {group.count}; it must be >= 0 (0 means 1)")
    count = group.count or 1
    gpus = tuple(group.gpus)
    kind = _resolve_kind(group, cluster)

    if kind == KIND_CPU:
        if gpus and group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            raise fail(
                "gpus",
                f"has kind KIND_AUTO, which resolves to KIND_CPU on a cluster with {cluster.total} GPU(s), "
                f"but specifies GPUs {list(gpus)}",
            )
        if gpus:
            raise fail("gpus", f"has kind KIND_CPU but specifies one or more GPUs {list(gpus)}")
        return ReplicaGroup(name, KIND_CPU, count, cpus, 0.0, ())

    if kind == KIND_MODEL:
        if gpus:
            raise fail("gpus", f"has kind KIND_MODEL but specifies one or more GPUs {list(gpus)}")
        return ReplicaGroup(name, KIND_MODEL, count, cpus, 0.0, ())

    # KIND_GPU
    if cluster.total == 0:
        raise fail("kind", "has kind KIND_GPU but no GPUs are available")
    bad = [g for g in gpus if not 0 <= g < cluster.total]
    if bad:
        raise fail(
            "gpus",
            f"specifies invalid or unsupported gpu id {bad[0]}; "
            f"the cluster has {cluster.total} GPU(s), ids 0-{cluster.total - 1}",
        )
    if count > _GPU_GRANULARITY:
        raise fail("count", f"has count {count}; Ray cannot share one GPU among more than {_GPU_GRANULARITY}")
    devices = len(gpus) if gpus else cluster.total
    return ReplicaGroup(name, KIND_GPU, count * devices, cpus, _gpu_share(count), gpus)


def _resolve_kind(group: mc.ModelInstanceGroup, cluster: ClusterGpus) -> str:
    """The group's kind with KIND_AUTO decided as Triton does."""
    kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
    if kind != "KIND_AUTO":
        return kind
    if cluster.total > 0 and all(0 <= g < cluster.total for g in group.gpus):
        return KIND_GPU
    # Triton falls back to CPU here; a group that still lists GPUs then fails
    # validation as "KIND_CPU but specifies one or more GPUs".
    return KIND_CPU


def _gpu_share(count: int) -> float:
    """1/count of a GPU, rounded down to Ray's resource granularity."""
    if count == 1:
        return 1.0
    return math.floor(_GPU_GRANULARITY / count) / _GPU_GRANULARITY
