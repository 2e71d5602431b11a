"""plan_replicas: Triton instance_group semantics mapped onto Ray Serve replicas."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from serve_app.errors import InvalidConfig
from serve_app.placement import ClusterGpus, ReplicaGroup, plan_replicas
from serve_app.protos import model_config_pb2 as mc

CPU_ONLY = ClusterGpus(total=0)
TWO_GPUS = ClusterGpus(total=2)


def cfg(text: str = "", name: str = "m") -> mc.ModelConfig:
    config = text_format.Parse(text, mc.ModelConfig())
    config.name = name
    return config


def plan(text: str, cluster: ClusterGpus = CPU_ONLY, **kw: float) -> list[ReplicaGroup]:
    return plan_replicas(cfg(text), cluster, **kw)


# --- no instance_group: Triton's default group ------------------------------------------------


def test_default_cpu_only_cluster_is_one_cpu_instance() -> None:
    assert plan("", CPU_ONLY) == [ReplicaGroup("m", "KIND_CPU", 1, 1.0, 0.0, ())]


def test_default_with_gpus_is_one_gpu_instance_per_gpu() -> None:
    assert plan("", TWO_GPUS) == [ReplicaGroup("m", "KIND_GPU", 2, 1.0, 1.0, ())]


# --- KIND_CPU ---------------------------------------------------------------------------------


def test_cpu_count_is_replicas() -> None:
    (g,) = plan("instance_group { kind: KIND_CPU count: 3 }", TWO_GPUS)
    assert g == ReplicaGroup("m_0", "KIND_CPU", 3, 1.0, 0.0, ())


def test_cpus_per_instance_is_per_replica() -> None:
    (g,) = plan("instance_group { kind: KIND_CPU count: 2 }", cpus_per_instance=0.5)
    assert (g.num_replicas, g.num_cpus) == (2, 0.5)


def test_cpu_with_gpus_is_an_error() -> None:
    with pytest.raises(InvalidConfig, match=r"model 'm'.*instance_group\[0\]\.gpus.*KIND_CPU"):
        plan("instance_group { kind: KIND_CPU gpus: [0] }", TWO_GPUS)


# --- count ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["KIND_CPU", "KIND_GPU", "KIND_MODEL", "KIND_AUTO"])
def test_count_zero_means_one(kind: str) -> None:
    (g,) = plan(f"instance_group {{ kind: {kind} count: 0 gpus: [] }}", ClusterGpus(1))
    assert g.num_replicas == 1


def test_unset_count_means_one() -> None:
    (g,) = plan("instance_group { kind: KIND_CPU }")
    assert g.num_replicas == 1


def test_negative_count_is_an_error() -> None:
    with pytest.raises(InvalidConfig, match=r"model 'm'.*instance_group\[0\]\.count"):
        plan("instance_group { kind: KIND_CPU count: -1 }")


# --- KIND_GPU ---------------------------------------------------------------------------------


def test_gpu_count_one_per_listed_gpu_takes_a_whole_gpu() -> None:
    (g,) = plan("instance_group { kind: KIND_GPU count: 1 gpus: [1] }", TWO_GPUS)
    assert g == ReplicaGroup("m_0", "KIND_GPU", 1, 1.0, 1.0, (1,))


def test_gpu_count_n_shares_each_gpu() -> None:
    (g,) = plan("instance_group { kind: KIND_GPU count: 2 gpus: [0, 1] }", TWO_GPUS)
    assert g == ReplicaGroup("m_0", "KIND_GPU", 4, 1.0, 0.5, (0, 1))


def test_gpu_without_gpus_uses_every_gpu_of_the_cluster() -> None:
    (g,) = plan("instance_group { kind: KIND_GPU count: 2 }", ClusterGpus(4))
    assert (g.num_replicas, g.num_gpus, g.gpus) == (8, 0.5, ())


def test_gpu_share_never_oversubscribes_a_gpu() -> None:
    (g,) = plan("instance_group { kind: KIND_GPU count: 3 gpus: [0] }", TWO_GPUS)
    assert g.num_replicas == 3
    assert g.num_gpus == pytest.approx(1 / 3, abs=1e-4)
    assert g.num_gpus * 3 <= 1.0


def test_gpu_on_cpu_only_cluster_is_an_error() -> None:
    with pytest.raises(InvalidConfig, match=r"instance_group\[0\]\.kind.*no GPUs are available"):
        plan("instance_group { kind: KIND_GPU }", CPU_ONLY)


@pytest.mark.parametrize("gid", [2, 7, -1])
def test_gpu_index_outside_the_cluster_is_an_error(gid: int) -> None:
    with pytest.raises(InvalidConfig, match=rf"model 'm'.*instance_group\[0\]\.gpus.*gpu id {gid}"):
        plan(f"instance_group {{ kind: KIND_GPU gpus: [0, {gid}] }}", TWO_GPUS)


def test_gpu_count_beyond_ray_granularity_is_an_error() -> None:
    with pytest.raises(InvalidConfig, match=r"instance_group\[0\]\.count"):
        plan("instance_group { kind: KIND_GPU count: 20000 }", TWO_GPUS)


# --- KIND_AUTO --------------------------------------------------------------------------------


def test_auto_is_gpu_when_the_cluster_has_gpus() -> None:
    (g,) = plan("instance_group { kind: KIND_AUTO count: 2 }", TWO_GPUS)
    assert (g.kind, g.num_replicas, g.num_gpus) == ("KIND_GPU", 4, 0.5)


def test_auto_with_listed_gpus_is_gpu() -> None:
    (g,) = plan("instance_group { count: 1 gpus: [1] }", TWO_GPUS)  # kind defaults to KIND_AUTO
    assert (g.kind, g.num_replicas, g.gpus) == ("KIND_GPU", 1, (1,))


def test_auto_is_cpu_on_cpu_only_cluster() -> None:
    (g,) = plan("instance_group { kind: KIND_AUTO count: 2 }", CPU_ONLY)
    assert g == ReplicaGroup("m_0", "KIND_CPU", 2, 1.0, 0.0, ())


def test_auto_listing_missing_gpus_is_an_error() -> None:
    # Triton resolves this to KIND_CPU, which then rejects the GPU list.
    with pytest.raises(InvalidConfig, match=r"instance_group\[0\]\.gpus.*KIND_AUTO"):
        plan("instance_group { kind: KIND_AUTO gpus: [5] }", TWO_GPUS)


# --- KIND_MODEL -------------------------------------------------------------------------------


def test_model_kind_is_count_replicas_without_gpu_request() -> None:
    (g,) = plan("instance_group { kind: KIND_MODEL count: 3 }", TWO_GPUS)
    assert g == ReplicaGroup("m_0", "KIND_MODEL", 3, 1.0, 0.0, ())


def test_model_kind_with_gpus_is_an_error() -> None:
    with pytest.raises(InvalidConfig, match=r"instance_group\[0\]\.gpus.*KIND_MODEL"):
        plan("instance_group { kind: KIND_MODEL gpus: [0] }", TWO_GPUS)


# --- several groups, names --------------------------------------------------------------------


def test_several_groups_keep_order_and_names() -> None:
    groups = plan(
        """
        instance_group { kind: KIND_CPU count: 2 }
        instance_group { name: "fast" kind: KIND_GPU count: 1 gpus: [0] }
        instance_group { kind: KIND_GPU count: 4 gpus: [1] }
        """,
        TWO_GPUS,
    )
    assert groups == [
        ReplicaGroup("m_0", "KIND_CPU", 2, 1.0, 0.0, ()),
        ReplicaGroup("fast", "KIND_GPU", 1, 1.0, 1.0, (0,)),
        ReplicaGroup("m_2", "KIND_GPU", 4, 1.0, 0.25, (1,)),
    ]


def test_error_names_the_failing_group_index() -> None:
    text = "instance_group { kind: KIND_CPU } instance_group { kind: KIND_CPU count: -2 }"
    with pytest.raises(InvalidConfig, match=r"instance_group\[1\]\.count.*m_1"):
        plan(text)


def test_bad_arguments_are_programming_errors() -> None:
    with pytest.raises(ValueError):
        plan_replicas(cfg(), ClusterGpus(-1))
    with pytest.raises(ValueError):
        plan_replicas(cfg(), CPU_ONLY, cpus_per_instance=-1)


def test_no_ray_import() -> None:
    import subprocess
    import sys

    code = "import sys, serve_app.placement; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
