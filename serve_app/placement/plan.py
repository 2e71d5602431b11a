"""Model versions → where their instances run: the pools of shared hosts, or Serve deployments of their own.

Most instance groups go to the pools of shared hosts (``pools.py``): the plan
says which groups each pool's hosts take.  A model Serve autoscales, or one
that asks for ``dedicated_process``, gets a deployment per instance group,
one replica per instance.  A Serve application can't gain or lose
deployments without restarting all of them, so each such deployment (and
each host pool) gets an application of its own (no route prefix; nothing
routes to it but our gateways).  Loading, reloading and unloading a model
then start and delete only its own applications.  A reload deploys a new
*generation* beside the old one, so traffic moves only once the new
instances are up.

Pure: the cluster's GPUs (what Ray reported) are an input, and the Ray layer
(``rayserve/model_apps.py``) turns the plan into Serve applications.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from serve_app.config import ENSEMBLE_PLATFORM
from serve_app.config.ensemble_deps import composing_models
from serve_app.config.hosting import dedicated_process
from serve_app.keys import ModelKey
from serve_app.placement.groups import KIND_GPU, ClusterGpus, ReplicaGroup, plan_replicas, share_gpus
from serve_app.placement.pools import HostPool, host_pool, hosted_instances
from serve_app.repository import ModelSource
from serve_app.settings import ServerSettings


class Scaling(Protocol):
    """What the plan reads of a model's autoscaling (``autoscale.AutoscalingSpec``)."""

    @property
    def min_replicas(self) -> int: ...

    @property
    def max_replicas(self) -> int: ...

    @property
    def initial_replicas(self) -> int | None: ...


@dataclass(frozen=True)
class PlacedGroup:
    """One instance group of one model version, and the Serve deployment that holds its instances."""

    group: ReplicaGroup
    app: str  # the Serve application
    deployment: str
    instances: int  # in the whole deployment (a dedicated one starts with this many replicas)
    pool: HostPool | None = None  # shared hosts: their pool (each host holds ``per_host`` instances)
    autoscaled: bool = False

    @property
    def per_host(self) -> int:
        return max(1, self.group.count)


@dataclass(frozen=True)
class VersionPlan:
    """Where one model version's instances go (no groups: an ensemble, whose steps run from the gateways)."""

    key: ModelKey
    model_file: Path
    groups: tuple[PlacedGroup, ...]
    sequence: bool

    def deployments(self) -> tuple[tuple[str, str, int], ...]:
        """(application, deployment, instances) of each deployment to ask for the version's instances: several
        groups in one pool are one deployment, their instances added up (what the sequence router needs)."""
        instances: dict[tuple[str, str], int] = {}
        for g in self.groups:
            instances[(g.app, g.deployment)] = instances.get((g.app, g.deployment), 0) + g.instances
        return tuple((app, dep, n) for (app, dep), n in instances.items())


@dataclass
class PlacementPlan:
    versions: list[VersionPlan] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # model -> why it can't be placed
    messages: list[str] = field(default_factory=list)


GPU_UNITS_PER_GPU = 10_000  # Ray's resource granularity
GPU_UNITS = 1 / GPU_UNITS_PER_GPU


def deployment_name(model: str, version: int, group: int, device: int | None = None) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model)
    suffix = "" if device is None else f".gpu{device}"
    return f"{safe}.v{version}.g{group}{suffix}"


def app_name(server_app: str, deployment: str, generation: int) -> str:
    return f"{server_app}--{deployment}--{generation}"


def gateway_pool(settings: ServerSettings) -> tuple[str, str, int] | None:
    """The gateways, when they hold the shared CPU instances themselves: (deployment, application, replicas)."""
    return ("gateway", settings.app_name, settings.gateway_replicas) if settings.cpu_instances_in_gateway else None


def plan_placement(
    sources: Mapping[str, ModelSource],
    generations: Mapping[str, int],
    settings: ServerSettings,
    gpus: ClusterGpus,
    autoscaling: Mapping[str, Scaling | None],
    pool_app: Callable[[HostPool], str] = lambda pool: pool.deployment,
) -> PlacementPlan:
    """Where the instances of ``sources`` (each at its generation) go on a cluster with ``gpus``.  GPU shares
    are split evenly among the dedicated instances planned here that Triton would put on a GPU.
    ``pool_app``: the Serve application of a host pool."""
    out = PlacementPlan()
    plans: dict[str, list[ReplicaGroup]] = {}
    for name, source in sources.items():
        if source.config.platform == ENSEMBLE_PLATFORM:
            continue
        try:
            plans[name] = plan_replicas(source.config, gpus, cpus_per_instance=settings.instance_cpus)
        except Exception as exc:
            out.failed[name] = getattr(exc, "message", str(exc))
    plans = share_gpus(plans, {n: len(sources[n].versions) for n in plans})

    def is_shared(name: str) -> bool:
        config = sources[name].config
        shared = settings.shared_hosts and settings.direct_channel and autoscaling.get(name) is None
        return shared and not dedicated_process(config)

    gpu_left = host_gpu_shares(plans, {n: len(sources[n].versions) for n in plans}, {n for n in plans if is_shared(n)})
    for name, source in sources.items():
        if name in out.failed:
            continue
        gen = generations[name]
        if name not in plans:  # an ensemble: its steps run from the gateway, it has no instances
            for version, directory in source.versions.items():
                out.versions.append(VersionPlan(ModelKey(name, version, gen), directory, (), False))
                out.messages.append(
                    f"model '{name}' version {version}: ensemble of {', '.join(composing_models(source.config))}"
                )
            continue
        scaling = autoscaling.get(name)
        sequence = source.config.HasField("sequence_batching")
        shared = is_shared(name)
        for version, model_file in source.versions.items():
            placed = tuple(
                _hosted(group, gpus, settings, pool_app, gpu_left)
                if shared
                else _dedicated(ModelKey(name, version, gen), group, settings, scaling)
                for group in plans[name]
            )
            out.versions.append(VersionPlan(ModelKey(name, version, gen), model_file, placed, sequence))
            where = ", ".join(_where(p) for p in placed)
            scaled = f", autoscaling {scaling.min_replicas}..{scaling.max_replicas}" if scaling else ""
            out.messages.append(f"model '{name}' version {version}: deploying ({where}{scaled})")
    return out


def host_gpu_shares(
    plans: Mapping[str, list[ReplicaGroup]], versions: Mapping[str, int], hosted: Collection[str]
) -> dict[int | None, float]:
    """The share of its GPU a host asks for, by GPU index (None: the GPUs Ray picks), where dedicated
    instances share that GPU with it: the shares of the hosted instances, so that the dedicated ones fit
    beside it. A GPU that only hosted instances use is the host's whole (absent here)."""
    held: dict[int | None, float] = defaultdict(float)
    dedicated: set[int | None] = set()
    for model, groups in plans.items():
        for g in groups:
            if g.kind != KIND_GPU:
                continue
            if model not in hosted:
                dedicated.add(g.device)
                continue
            share = g.num_gpus if g.device is None else g.resources[0][1]
            held[g.device] += share * g.instances_per_gpu * versions.get(model, 1)
    # floored to Ray's granularity: the shares are its multiples already, less float error
    return {d: max(1, math.floor(held[d] / GPU_UNITS + 1e-6)) / GPU_UNITS_PER_GPU for d in dedicated if d in held}


def _hosted(
    group: ReplicaGroup,
    gpus: ClusterGpus,
    settings: ServerSettings,
    pool_app: Callable[[HostPool], str],
    gpu_left: Mapping[int | None, float],
) -> PlacedGroup:
    pool = host_pool(group, gpus, settings.instance_cpus, gateway_pool(settings), gpu_left.get(group.device, 1.0))
    return PlacedGroup(group, pool_app(pool), pool.deployment, hosted_instances(group, pool), pool)


def _dedicated(key: ModelKey, group: ReplicaGroup, settings: ServerSettings, scaling: Scaling | None) -> PlacedGroup:
    deployment = deployment_name(key.name, key.version, group.group_index, group.device)
    start = scaling.initial_replicas or scaling.min_replicas if scaling else group.num_replicas
    app = app_name(settings.app_name, deployment, key.generation)
    return PlacedGroup(group, app, deployment, max(1, start or 1), autoscaled=scaling is not None)


def _where(placed: PlacedGroup) -> str:
    group, pool = placed.group, placed.pool
    if pool is not None:
        return f"{placed.per_host}x {group.kind} in each of {pool.replicas} {pool.deployment}(s)"
    if group.device is not None:
        return f"{group.num_replicas}x {group.kind} on GPU {group.device} ({group.count} per node)"
    if group.num_gpus:
        return f"{group.num_replicas}x {group.kind} ({group.num_gpus:g} GPU each)"
    return f"{group.num_replicas}x {group.kind}"
