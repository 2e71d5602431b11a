"""A host whose service shares its process (the local server's): loaded before serving, called directly, its
sequence router told of freed slots without polls."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from serve_app.errors import InternalError
from serve_app.hosting import InProcessExecutor, InstanceHost, InstanceLoad
from serve_app.keys import ModelKey
from serve_app.placement import InstanceSpec
from serve_app.sequence.messages import SequenceStep
from serve_app.sequence.router import SequenceRouter
from tests.support.sequence_repository import accumulator
from tests.unit.hosting.test_host import add_sub_batch, load_of


@pytest.fixture
def repo(tmp_path: pathlib.Path) -> pathlib.Path:
    from scripts import example_models

    example_models.add_sub(tmp_path)
    return tmp_path


def test_add_blocking_loads_a_group_without_an_event_loop_and_discard_closes_it(repo: pathlib.Path) -> None:
    host = InstanceHost("local", None)
    load = load_of(repo, "add_sub", generation=0)
    assert host.add_blocking(load) == ""
    (held,) = host.of(load.key)
    assert held.instance is not None and held.name == "add_sub_0_0"
    host.discard(load)
    assert host.instances() == [] and host.get(held.id) is None
    host.discard(load)  # already gone: nothing to do


def test_a_group_that_fails_to_load_says_why(repo: pathlib.Path) -> None:
    host = InstanceHost("local", None)
    good = load_of(repo, "add_sub")
    broken = InstanceLoad(good.key, good.config_bytes, str(repo / "nowhere.onnx"), "KIND_CPU", good.spec)
    assert host.add_blocking(broken)
    host.discard(broken)


def test_a_host_that_sees_every_gpu_gives_a_gpu_instance_its_groups_device(repo: pathlib.Path) -> None:
    good = load_of(repo, "add_sub")
    # A model file that is not there: the load fails at once, and the instance still shows its device.
    gpu = InstanceLoad(good.key, good.config_bytes, str(repo / "nowhere.onnx"), "KIND_GPU", InstanceSpec("g", 2, 0))
    every = InstanceHost("local", None)
    every.add_blocking(gpu)
    assert [i.ctx.gpu_ids for i in every.of(gpu.key)] == [(2,)]
    pinned = InstanceHost("h1", (0,))  # CUDA_VISIBLE_DEVICES already narrowed to the pool's GPU
    pinned.add_blocking(gpu)
    assert [i.ctx.gpu_ids for i in pinned.of(gpu.key)] == [(0,)]
    every.discard(gpu)
    pinned.discard(gpu)


async def test_the_executor_runs_batches_on_the_loaded_instances_of_a_version(repo: pathlib.Path) -> None:
    host = InstanceHost("local", None)
    load = load_of(repo, "add_sub", generation=0)
    host.add_blocking(load)
    executor = InProcessExecutor(host, SequenceRouter())
    assert executor.instances(load.key) == 1 and executor.capacity(load.key) == 1
    (result,) = await executor.execute(load.key, [add_sub_batch(2.0)])
    np.testing.assert_array_equal(result.outputs["OUTPUT0"], np.full((1, 16), 4.0, np.float32))
    missing = ModelKey("add_sub", 9)
    assert executor.instances(missing) == 0
    with pytest.raises(InternalError, match="not loaded here"):
        await executor.execute(missing, [add_sub_batch(1.0)])
    await host.stop(unloading=True)


async def test_a_sequence_ends_and_its_slot_returns_to_the_router_without_a_poll(tmp_path: pathlib.Path) -> None:
    accumulator(tmp_path, "acc", "direct { }", max_batch_size=2)
    router = SequenceRouter()
    host = InstanceHost("local", None, on_release=router.released)
    load = load_of(tmp_path, "acc", generation=0)
    host.add_blocking(load)
    port = InProcessExecutor(host, router).sequence_port(load.key)
    x = {"INPUT": np.array([[5]], np.int32)}
    place = await port.assign(9)

    def step(start: bool, end: bool) -> SequenceStep:
        return SequenceStep(9, place.slot, place.slot_token, start, end, x, ("OUTPUT",), 1, instance=place.instance)

    first = await (await port.dispatch(place, step(True, False)))
    last = await (await port.dispatch(place, step(False, True)))
    assert first.outputs["OUTPUT"].ravel().tolist() == [5] and last.outputs["OUTPUT"].ravel().tolist() == [10]
    assert router.assigner(load.key.label).active == {}
    await host.stop(unloading=True)
