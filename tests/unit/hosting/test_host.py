"""InstanceHost: a process's instances by id, following its content; the channel's messages reach them."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from scripts import example_models
from serve_app.errors import Draining, Unavailable
from serve_app.hosting import ExecuteOn, InstanceHost, InstanceLoad
from serve_app.inference.execution import Execution
from serve_app.keys import ModelKey
from serve_app.placement import InstanceSpec
from serve_app.repository import ModelRepository
from serve_app.sequence.messages import PollEvents, SequenceStep
from tests.support.sequence_repository import accumulator


def load_of(repo: pathlib.Path, name: str, *, generation: int = 1, count: int = 1, group: int = 0) -> InstanceLoad:
    source = ModelRepository(repo).load(name)
    return InstanceLoad(
        ModelKey(name, 1, generation),
        source.config.SerializeToString(),
        str(source.versions[1]),
        "KIND_CPU",
        InstanceSpec(f"{name}_{group}", None, group),
        count,
    )


def add_sub_batch(value: float) -> Execution:
    a = np.full((1, 16), value, np.float32)
    return Execution({"INPUT0": a, "INPUT1": a}, ("OUTPUT0", "OUTPUT1"), 1)


@pytest.fixture
def repo(tmp_path: pathlib.Path) -> pathlib.Path:
    example_models.add_sub(tmp_path)
    example_models.identity(tmp_path, "FP32")
    return tmp_path


async def test_apply_loads_each_group_count_times_and_runs_batches_by_instance_id(repo: pathlib.Path) -> None:
    host = InstanceHost("h1")
    load = load_of(repo, "add_sub", count=2)
    statuses = await host.apply([load])
    assert statuses == {InstanceHost.group_id(load): ""}
    them = host.of(load.key)
    assert [i.name for i in them] == ["add_sub_0_0", "add_sub_0_1"]
    assert len({i.id for i in them}) == 2 and all(i.id.startswith("h1/") for i in them)
    (result,) = await host.on_channel(ExecuteOn(them[1].id, [add_sub_batch(2.0)]))  # type: ignore[misc]
    np.testing.assert_array_equal(result.outputs["OUTPUT0"], np.full((1, 16), 4.0, np.float32))
    await host.stop(unloading=True)


async def test_apply_keeps_what_stays_and_stops_what_goes(repo: pathlib.Path) -> None:
    host = InstanceHost("h1")
    a, b = load_of(repo, "add_sub"), load_of(repo, "identity_fp32")
    await host.apply([a, b])
    kept = host.of(a.key)[0]
    await host.apply([a])
    assert host.of(a.key) == [kept] and host.of(b.key) == []
    await host.apply([a, load_of(repo, "add_sub", generation=2)])  # a reload's new generation beside the old
    assert len(host.instances()) == 2
    await host.stop(unloading=True)


async def test_a_group_that_fails_to_load_reports_why_and_others_load(repo: pathlib.Path) -> None:
    broken = load_of(repo, "add_sub")
    broken = InstanceLoad(broken.key, broken.config_bytes, str(repo / "nowhere.onnx"), "KIND_CPU", broken.spec)
    good = load_of(repo, "identity_fp32")
    host = InstanceHost("h1")
    statuses = await host.apply([broken, good])
    assert statuses[InstanceHost.group_id(good)] == ""
    assert statuses[InstanceHost.group_id(broken)]
    (failed,) = host.of(broken.key)
    (answer,) = await host.on_channel(ExecuteOn(failed.id, [add_sub_batch(1.0)]))  # type: ignore[misc]
    assert isinstance(answer.error, Unavailable) and "failed to load" in answer.error.message
    await host.stop(unloading=True)


async def test_messages_for_an_instance_not_here_are_safe_to_send_elsewhere(repo: pathlib.Path) -> None:
    host = InstanceHost("h1")
    with pytest.raises(Draining):
        await host.on_channel(ExecuteOn("h0/add_sub:1.1.0.0", [add_sub_batch(1.0)]))
    step = SequenceStep(7, 0, 1, True, False, {}, (), 1, instance="h0/x")
    assert (await host.on_channel(step)).not_here  # type: ignore[union-attr]
    with pytest.raises(Unavailable):
        await host.on_channel(PollEvents(instance="h0/x"))
    with pytest.raises(TypeError):
        await host.on_channel("nonsense")


async def test_sequence_steps_and_polls_reach_the_instance_they_name(tmp_path: pathlib.Path) -> None:
    accumulator(tmp_path, "acc", "direct { }", max_batch_size=2)
    host = InstanceHost("h1")
    load = load_of(tmp_path, "acc", count=2)
    await host.apply([load])
    first, second = host.of(load.key)
    x = {"INPUT": np.array([[5]], np.int32)}
    step = SequenceStep(9, 0, 11, True, False, x, ("OUTPUT",), 1, instance=second.id)
    result = await host.on_channel(step)
    assert result.outputs["OUTPUT"].ravel().tolist() == [5]  # type: ignore[union-attr]
    events = await host.on_channel(PollEvents(snapshot=True, instance=second.id))
    assert events.instance == second.id and [e.corr_id for e in events.occupied] == [9]  # type: ignore[union-attr]
    events = await host.on_channel(PollEvents(snapshot=True, instance=first.id))
    assert events.occupied == ()  # type: ignore[union-attr]
    await host.stop(unloading=True)


async def test_a_short_execution_runs_on_the_event_loop_once_it_is_known_to_be_short(
    repo: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from serve_app.hosting import instance as instance_module

    # "Short" as this test's machine may measure it: under load, add_sub's wall time can pass 150 µs.
    monkeypatch.setattr(instance_module, "INLINE_MAX_NS", 10**10)
    host = InstanceHost("h1")
    load = load_of(repo, "add_sub")
    await host.apply([load])
    (held,) = host.of(load.key)
    assert held.instance is not None
    threads: list[str] = []
    run_all = held.instance.run_all

    def recording(executions: list[Execution], arrived_ns: int = 0) -> list[object]:
        threads.append(threading.current_thread().name)
        return run_all(executions, arrived_ns)  # type: ignore[return-value]

    held.instance.run_all = recording  # type: ignore[method-assign]
    for _ in range(12):
        await host.on_channel(ExecuteOn(held.id, [add_sub_batch(1.0)]))
    assert threads[0].startswith("add_sub-exec")  # unknown at first: the instance's thread
    assert threads[-1] == threading.current_thread().name  # known to be short: no hand-off
    await host.stop(unloading=True)


async def test_log_settings_a_gateway_passes_on_apply_in_the_host(repo: pathlib.Path) -> None:
    """/v2/logging changes reach the processes that host models with the next batch sent there."""
    import logging

    from serve_app.observability.log_settings import LogSettings
    from serve_app.observability.python_logging import LOGGER, LevelGate, apply

    host = InstanceHost("h1")
    load = load_of(repo, "add_sub")
    await host.apply([load])
    (instance,) = host.of(load.key)
    quiet = LogSettings(log_info=False, log_verbose_level=1)
    try:
        await host.on_channel(ExecuteOn(instance.id, [add_sub_batch(1.0)], quiet))
        gate = next(f for f in logging.getLogger(LOGGER).filters if isinstance(f, LevelGate))
        assert gate.settings == quiet
    finally:
        apply(LogSettings())
        await host.stop(unloading=True)
