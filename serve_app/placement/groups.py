"""Map a model's ``instance_group`` onto Ray Serve replica groups (the instances a group asks for, and where).

Triton turns each instance group into model instances on devices; we turn it into
Ray Serve deployments whose replicas (one replica = one instance) carry resource
requests, following Triton's normalisation (``NormalizeInstanceGroup``) and
validation (``ValidateInstanceGroup``) so that a config Triton accepts places the
same instances here, and one Triton rejects fails here with a similar message.
Pure: no Ray import, so the planner and its tests run without a cluster.

The cluster is one Triton server whose GPUs are every GPU of every node, each
known by its node-local CUDA index.  Ray alone picks which GPU a replica with
``num_gpus`` gets, so a GPU index can only be honoured when the nodes declare one
custom resource per GPU (``<prefix><i>``, default ``gpu_idx_<i>``, 1 on each node
that has GPU ``i``): a replica then asks for a share of ``gpu_idx_<i>`` (and no
Ray ``GPU``) and sets ``CUDA_VISIBLE_DEVICES=<i>`` itself.  Rules, per group
(``count`` 0 means Triton's default of 1):

* ``KIND_CPU``: ``count`` replicas in the cluster, no GPU (the replica hides every
  GPU: ``CUDA_VISIBLE_DEVICES=""``); listing ``gpus`` is an error.
* ``KIND_GPU``: ``count`` instances on each listed GPU index of every node that
  declares it, or on every GPU of the cluster when ``gpus`` is empty.

  - With per-GPU resources declared: one deployment per GPU index, ``count x``
    (nodes declaring it) replicas, at most ``count`` per node
    (``max_replicas_per_node``), each asking ``{"gpu_idx_<i>": share}``.
  - Without them: ``gpus`` must be empty (listing GPUs is an error that says how
    to declare the resources); one deployment of ``count x`` (cluster GPUs)
    replicas each asking ``num_gpus=share``, and Ray picks the GPUs.

  ``share`` is ``1/count`` for a GPU only this group uses.  Triton lets every
  instance on a GPU share it, so :func:`share_gpus` splits each GPU evenly among
  all the instances the repository places there (every group, model and version):
  ``1/N`` of the GPU each, so the instances Triton would co-locate fit in Ray too.
  An error when the cluster has no GPU or a listed index is not declared.
* ``KIND_AUTO``: ``KIND_GPU`` when the cluster has GPUs (and every listed GPU is
  declared), else ``KIND_CPU``, as Triton resolves it.
* ``KIND_MODEL``: ``count`` replicas that ask Ray for no GPU and keep whatever
  devices the node shows: the backend, not the server, picks devices (Triton's
  meaning); listing ``gpus`` is an error, as in Triton.

With no ``instance_group`` at all, Triton adds one group named after the model,
of kind ``KIND_AUTO`` and count 1: one GPU instance per GPU, or one CPU instance.
Instance names follow Triton (``TritonModel::PrepareInstances``): ``<group name>_<n>``
with ``n`` in ``0..count-1``; a GPU instance's device is reported beside its name.

Not modelled: ``passive`` groups (Triton loads them but never schedules them),
``secondary_devices``, ``rate_limiter`` and ``host_policy``; Triton's default
count of 2 for ``KIND_CPU`` ONNX Runtime / TensorFlow groups (we use 1).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from serve_app.errors import InvalidConfig
from serve_app.protos import model_config_pb2 as mc

KIND_CPU = "KIND_CPU"
KIND_GPU = "KIND_GPU"
KIND_MODEL = "KIND_MODEL"

DEFAULT_GPU_RESOURCE_PREFIX = "gpu_idx_"

# Ray accounts resources in units of 1/10000 (ray_constants.MIN_RESOURCE_GRANULARITY);
# a share is rounded down to that grid so N shares never exceed one GPU.
_GPU_GRANULARITY = 10_000
# Serve's limit on max_replicas_per_node (serve/_private/constants.py).
_MAX_REPLICAS_PER_NODE = 100


@dataclass(frozen=True)
class ClusterGpus:
    """What the cluster offers: its GPUs, and the per-GPU resources its nodes declare."""

    total: int = 0  # Ray "GPU" resource of the whole cluster (0 = no GPUs known to Ray)
    # GPU index -> number of nodes declaring the resource ``<prefix><index>`` (empty: none declared)
    indexed: Mapping[int, int] = field(default_factory=dict)
    prefix: str = DEFAULT_GPU_RESOURCE_PREFIX
    cpu_nodes: int = 1  # live nodes with CPUs (each gets a shared host for CPU instances)

    @property
    def has_gpus(self) -> bool:
        return self.total > 0 or bool(self.indexed)

    def resource(self, index: int) -> str:
        return f"{self.prefix}{index}"

    @classmethod
    def from_nodes(cls, nodes: Iterable[Mapping[str, float]], prefix: str = DEFAULT_GPU_RESOURCE_PREFIX) -> ClusterGpus:
        """From each live node's resource totals (``ray.nodes()[i]["Resources"]``)."""
        pattern = re.compile(re.escape(prefix) + r"(\d+)")
        total = 0.0
        cpu_nodes = 0
        indexed: dict[int, int] = defaultdict(int)
        for resources in nodes:
            total += resources.get("GPU", 0)
            cpu_nodes += resources.get("CPU", 0) > 0
            for key, amount in resources.items():
                match = pattern.fullmatch(key)
                if match and amount > 0:
                    indexed[int(match.group(1))] += 1
        return cls(total=int(total), indexed=dict(sorted(indexed.items())), prefix=prefix, cpu_nodes=max(1, cpu_nodes))


@dataclass(frozen=True)
class ReplicaGroup:
    """One Serve deployment of an instance group: its replicas and per-replica resources."""

    group_name: str  # the config's name, or "<model>_<index>" like Triton
    kind: str  # "KIND_CPU" | "KIND_GPU" | "KIND_MODEL" (KIND_AUTO resolved)
    num_replicas: int
    num_cpus: float  # per replica
    num_gpus: float  # per replica, Ray's GPU resource (0 when placed by a per-GPU resource)
    gpus: tuple[int, ...]  # GPU indices the config listed (empty = all)
    group_index: int = 0  # position in the config's instance_group list
    device: int | None = None  # the GPU index every replica uses (CUDA_VISIBLE_DEVICES), when pinned
    resources: tuple[tuple[str, float], ...] = ()  # per replica custom resources, e.g. (("gpu_idx_1", 0.5),)
    max_per_node: int = 0  # Serve's max_replicas_per_node (0 = no limit)
    count: int = 1  # instances per GPU (per node) for KIND_GPU; in all otherwise

    @property
    def instances_per_gpu(self) -> int:
        return self.count if self.kind == KIND_GPU else 0


@dataclass(frozen=True)
class InstanceSpec:
    """What a replica needs to know about its place (passed to ``ModelReplica``)."""

    group_name: str
    device: int | None = None  # pinned GPU index: the replica sets CUDA_VISIBLE_DEVICES to it
    group_index: int | None = None  # position in the config's instance_group (e.g. for TensorRT profiles)

    def instance_name(self, number: int) -> str:
        """Triton's instance name: ``<group name>_<n>`` (the device is reported separately)."""
        return f"{self.group_name}_{number}"


def instance_spec(group: ReplicaGroup) -> InstanceSpec:
    return InstanceSpec(group.group_name, group.device, group.group_index)


def plan_replicas(
    config: mc.ModelConfig, cluster: ClusterGpus, *, cpus_per_instance: float = 1.0
) -> list[ReplicaGroup]:
    """The deployments that serve ``config``'s instance groups on ``cluster``, in config order.

    GPU shares are those of this model alone (one version); :func:`share_gpus` redoes
    them for a whole repository.  Raises :class:`InvalidConfig` naming the model and
    the offending field.
    """
    model = config.name
    if cluster.total < 0:
        raise ValueError(f"cluster GPU total must be >= 0, got {cluster.total}")
    if cpus_per_instance < 0:
        raise ValueError(f"cpus_per_instance must be >= 0, got {cpus_per_instance}")

    if not config.instance_group:
        # Triton's default group: named after the model, KIND_AUTO, count 1.
        default = mc.ModelInstanceGroup(name=model, kind=mc.ModelInstanceGroup.KIND_AUTO, count=1)
        groups = _plan_group(model, 0, default, cluster, cpus_per_instance)
    else:
        groups = [
            g
            for index, group in enumerate(config.instance_group)
            for g in _plan_group(model, index, group, cluster, cpus_per_instance)
        ]
    return share_gpus({model: groups})[model]


def share_gpus(
    plans: Mapping[str, Sequence[ReplicaGroup]], versions: Mapping[str, int] | None = None
) -> dict[str, list[ReplicaGroup]]:
    """Split each GPU evenly among every instance the repository puts on it.

    ``plans`` maps a model to its replica groups, ``versions`` a model to how many of
    its versions are served (default 1; each version has its own instances).  A GPU
    with ``N`` instances gives each ``1/N`` (rounded down to Ray's granularity): a
    pinned group's share of ``gpu_idx_<i>``, or, for groups Ray places (``num_gpus``),
    of whichever GPU Ray picks, ``N`` counting every such group since each spans all
    GPUs.
    """
    versions = versions or {}
    per_device: dict[int | None, int] = defaultdict(int)  # None: the groups Ray places
    for model, groups in plans.items():
        for g in groups:
            per_device[g.device] += g.instances_per_gpu * versions.get(model, 1)
    out: dict[str, list[ReplicaGroup]] = {}
    for model, groups in plans.items():
        shared = []
        for g in groups:
            if g.kind != KIND_GPU:
                shared.append(g)
                continue
            share = _gpu_share(per_device[g.device])
            if g.device is None:
                shared.append(replace(g, num_gpus=share))
            else:
                shared.append(replace(g, resources=tuple((k, share) for k, _ in g.resources)))
        out[model] = shared
    return out


def _plan_group(
    model: str, index: int, group: mc.ModelInstanceGroup, cluster: ClusterGpus, cpus: float
) -> list[ReplicaGroup]:
    name = group.name or f"{model}_{index}"
    field_name = f"instance_group[{index}]"

    def fail(subfield: str, why: str) -> InvalidConfig:
        return InvalidConfig(f"model '{model}': {field_name}.{subfield}: instance group {name} {why}")

    if group.count < 0:
        raise fail("count", f"has count {group.count}; it must be >= 0 (0 means 1)")
    count = group.count or 1
    gpus = tuple(group.gpus)
    kind = _resolve_kind(group, cluster)

    if kind == KIND_CPU:
        if gpus and group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            why = (
                f"the cluster lacks GPU(s) {[g for g in gpus if g not in cluster.indexed]} (its GPUs are "
                f"{_declared(cluster)})"
                if cluster.has_gpus
                else "the cluster has no GPUs"
            )
            raise fail("gpus", f"has kind KIND_AUTO, which resolves to KIND_CPU because {why}, but specifies GPUs")
        if gpus:
            raise fail("gpus", f"has kind KIND_CPU but specifies one or more GPUs {list(gpus)}")
        return [ReplicaGroup(name, KIND_CPU, count, cpus, 0.0, (), index, count=count)]

    if kind == KIND_MODEL:
        if gpus:
            raise fail("gpus", f"has kind KIND_MODEL but specifies one or more GPUs {list(gpus)}")
        return [ReplicaGroup(name, KIND_MODEL, count, cpus, 0.0, (), index, count=count)]

    # KIND_GPU
    if not cluster.has_gpus:
        raise fail("kind", "has kind KIND_GPU but no GPUs are available")
    if count > _GPU_GRANULARITY:
        raise fail("count", f"has count {count}; Ray cannot share one GPU among more than {_GPU_GRANULARITY}")
    if not cluster.indexed:
        if gpus:
            raise fail(
                "gpus",
                f"specifies GPUs {list(gpus)}, but the cluster's nodes declare no per-GPU resources "
                f"('{cluster.prefix}<index>'), and without them Ray alone picks a replica's GPU; declare one per "
                f"GPU on every GPU node (e.g. ray start --resources='{{\"{cluster.resource(0)}\": 1, ...}}') "
                "or leave 'gpus' empty",
            )
        share = _gpu_share(count)
        return [ReplicaGroup(name, KIND_GPU, count * cluster.total, cpus, share, (), index, count=count)]
    bad = [g for g in gpus if g not in cluster.indexed]
    if bad:
        raise fail(
            "gpus",
            f"specifies invalid or unsupported gpu id {bad[0]}; the cluster's GPUs are {_declared(cluster)}",
        )
    # Triton creates ``count`` instances per entry of ``gpus``, so a GPU listed twice gets twice as many.
    per_gpu = Counter(gpus or tuple(cluster.indexed))
    return [
        ReplicaGroup(
            name,
            KIND_GPU,
            count * times * cluster.indexed[d],
            cpus,
            0.0,
            gpus,
            index,
            device=d,
            resources=((cluster.resource(d), _gpu_share(count * times)),),
            max_per_node=count * times if count * times <= _MAX_REPLICAS_PER_NODE else 0,
            count=count * times,
        )
        for d, times in per_gpu.items()
    ]


def _resolve_kind(group: mc.ModelInstanceGroup, cluster: ClusterGpus) -> str:
    """The group's kind with KIND_AUTO decided as Triton does."""
    kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
    if kind != "KIND_AUTO":
        return kind
    if not cluster.has_gpus:
        return KIND_CPU
    if cluster.indexed and any(g not in cluster.indexed for g in group.gpus):
        # Triton falls back to CPU here; a group that still lists GPUs then fails
        # validation as "KIND_CPU but specifies one or more GPUs".
        return KIND_CPU
    # Without per-GPU resources we cannot tell whether a listed GPU exists: resolve to
    # GPU so that the group fails with the reason (no per-GPU resources), not as CPU.
    return KIND_GPU


def _declared(cluster: ClusterGpus) -> str:
    if not cluster.indexed:
        return f"none declared as '{cluster.prefix}<index>'"
    return "ids " + ", ".join(str(i) for i in cluster.indexed) + f" (resources '{cluster.prefix}<index>')"


def _gpu_share(instances: int) -> float:
    """1/instances of a GPU, rounded down to Ray's resource granularity (at least one unit)."""
    if instances <= 1:
        return 1.0
    return max(1, math.floor(_GPU_GRANULARITY / instances)) / _GPU_GRANULARITY
