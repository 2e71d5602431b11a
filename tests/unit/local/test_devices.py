"""The local server puts a model's one instance on its first instance group's device."""

from __future__ import annotations

from serve_app.local.devices import LocalDevice, local_device
from serve_app.protos import model_config_pb2 as mc

Group = mc.ModelInstanceGroup


def config(*groups: mc.ModelInstanceGroup) -> mc.ModelConfig:
    c = mc.ModelConfig(name="m")
    c.instance_group.extend(groups)
    return c


def test_no_group_is_the_cpu() -> None:
    assert local_device(config()) == LocalDevice("KIND_CPU")


def test_a_gpu_group_uses_its_first_listed_gpu() -> None:
    got = local_device(config(Group(kind=Group.KIND_GPU, gpus=[2, 3]), Group(kind=Group.KIND_CPU)))
    assert got == LocalDevice("KIND_GPU", (2,), 0)


def test_a_gpu_group_listing_no_gpu_uses_gpu_0() -> None:
    assert local_device(config(Group(kind=Group.KIND_GPU))) == LocalDevice("KIND_GPU", (0,), 0)


def test_auto_stays_on_the_cpu_and_model_keeps_its_devices() -> None:
    assert local_device(config(Group(kind=Group.KIND_AUTO))) == LocalDevice("KIND_CPU", (), 0)
    assert local_device(config(Group(kind=Group.KIND_MODEL))) == LocalDevice("KIND_MODEL", (), 0)
