"""The rate limiter: resources held while executing, the order waiting executions get them in (Triton's
executions x priority), its settings, and model schedulers that share it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from google.protobuf import text_format

from serve_app.errors import InvalidArgument
from serve_app.inference.signature import ModelSignature
from serve_app.protos import model_config_pb2 as mc
from serve_app.rate_limit_config import parse_resources
from serve_app.scheduling.model_scheduler import ModelScheduler
from serve_app.scheduling.rate_limiter import Needs, RateLimiter, check_resources
from tests.unit.scheduling.test_model_scheduler import FakeInstance, model_config, request, settle, start


class Owner:
    """A registered scheduler stand-in: records its grants."""

    def __init__(self, limiter: RateLimiter, name: str, resources: dict[str, int], priority: int = 1) -> None:
        self.name = name
        self.limiter = limiter
        self.granted = 0
        limiter.register(self, Needs(resources, priority))

    def grant(self, log: list[str]) -> Callable[[], None]:
        def granted() -> None:
            self.granted += 1
            log.append(self.name)

        return granted

    def ask(self, log: list[str]) -> None:
        self.limiter.request(self, self.grant(log))


# -- settings and config ----------------------------------------------------------------------------------------
def test_rate_limit_resources_parse_as_triton_takes_them() -> None:
    assert parse_resources([]) == {}
    assert parse_resources(["R1:4", "R2:1:0", "R1:2"]) == {"R1": 4, "R2": 1}
    for bad in ("R1", "R1:x", ":3", "R1:2:gpu", "R1:-1"):
        with pytest.raises(InvalidArgument, match="--rate-limit-resource"):
            parse_resources([bad])


def config(groups: str) -> mc.ModelConfig:
    return text_format.Parse(f'name: "m" {groups}', mc.ModelConfig())


def test_needs_come_from_the_instance_groups_rate_limiter() -> None:
    assert Needs.from_config(config("instance_group [ { count: 2 kind: KIND_CPU } ]")) is None
    needs = Needs.from_config(
        config(
            """instance_group [
              { kind: KIND_CPU
                rate_limiter { resources [ { name: "R1" count: 2 }, { name: "R2" count: 1 } ] priority: 3 } },
              { kind: KIND_CPU rate_limiter { resources [ { name: "R1" count: 4 } ] priority: 0 } }
            ]"""
        )
    )
    assert needs == Needs({"R1": 4, "R2": 1}, 1)  # the largest counts; priority 0 counts as 1


def test_an_explicit_count_below_what_a_model_needs_fails_its_load_with_tritons_message() -> None:
    check_resources("m", Needs({"R1": 2}), {})  # no explicit counts: every model can run alone
    check_resources("m", Needs({"R1": 2}), {"R1": 2})
    with pytest.raises(InvalidArgument) as info:
        check_resources("m", Needs({"R1": 2}), {"R1": 1})
    assert info.value.message == (
        "model 'm': Resource count for \"R1\" is limited to 1 which will prevent scheduling of one or more model "
        "instances, the minimum required count is 2"
    )


# -- the limiter -------------------------------------------------------------------------------------------------
def test_an_execution_waits_until_the_resource_it_shares_is_released() -> None:
    limiter = RateLimiter()
    log: list[str] = []
    a, b = Owner(limiter, "a", {"R": 1}), Owner(limiter, "b", {"R": 1})
    a.ask(log)
    b.ask(log)
    assert log == ["a"] and limiter.in_use("R") == 1 and limiter.waiting() == 1
    limiter.release(a)
    assert log == ["a", "b"] and limiter.in_use("R") == 1
    limiter.release(b)
    assert limiter.in_use("R") == 0


def test_the_default_count_is_the_largest_need_and_an_explicit_one_wins() -> None:
    limiter = RateLimiter()
    log: list[str] = []
    small, big = Owner(limiter, "small", {"R": 1}), Owner(limiter, "big", {"R": 3})
    assert limiter.available("R") == 3
    small.ask(log)
    small.ask(log)
    assert log == ["small", "small"]  # 2 of 3 units
    big.ask(log)
    assert log == ["small", "small"]
    limiter.release(small)
    limiter.release(small)
    assert log[-1] == "big"
    wide = RateLimiter(explicit={"R": 6})
    x, y = Owner(wide, "x", {"R": 3}), Owner(wide, "y", {"R": 3})
    x.ask(log)
    y.ask(log)
    assert log[-2:] == ["x", "y"]  # both at once


def test_waiting_executions_go_by_priority_then_arrival() -> None:
    limiter = RateLimiter()
    log: list[str] = []
    holder = Owner(limiter, "holder", {"R": 1})
    low, high = Owner(limiter, "low", {"R": 1}, priority=2), Owner(limiter, "high", {"R": 1}, priority=1)
    holder.ask(log)
    low.ask(log)
    high.ask(log)
    limiter.release(holder)
    assert log == ["holder", "high"]
    limiter.release(high)
    assert log == ["holder", "high", "low"]


def test_a_priority_two_instance_gets_half_the_turns() -> None:
    limiter = RateLimiter()
    log: list[str] = []
    one, two = Owner(limiter, "p1", {"R": 1}, priority=1), Owner(limiter, "p2", {"R": 1}, priority=2)
    one.ask(log)
    two.ask(log)
    for _ in range(11):  # both always have more to run: the one that ends asks again before the next grant
        last = one if log[-1] == "p1" else two
        limiter.release(last, again=last.grant(log))
    assert log == ["p1", "p2", "p1", "p1", "p2", "p1", "p1", "p2", "p1", "p1", "p2", "p1"]
    assert log.count("p1") == 2 * log.count("p2")


def test_the_head_of_the_line_is_not_overtaken_by_smaller_requests() -> None:
    limiter = RateLimiter(explicit={"R": 2})
    log: list[str] = []
    one = Owner(limiter, "one", {"R": 1})
    both = Owner(limiter, "both", {"R": 2})
    other = Owner(limiter, "other", {"R": 1})
    one.ask(log)
    both.ask(log)  # needs 2: waits for "one"
    other.ask(log)  # 1 unit is free, but "both" is first in line
    assert log == ["one"]
    limiter.release(one)
    assert log == ["one", "both"]
    limiter.release(both)
    assert log == ["one", "both", "other"]


def test_a_withdrawn_request_never_gets_its_grant() -> None:
    limiter = RateLimiter()
    log: list[str] = []
    a, b = Owner(limiter, "a", {"R": 1}), Owner(limiter, "b", {"R": 1})
    a.ask(log)
    b.ask(log)
    assert limiter.withdraw(b) == 1
    limiter.release(a)
    assert log == ["a"] and limiter.in_use("R") == 0


# -- model schedulers sharing it -----------------------------------------------------------------------------
def limited(resource: str, count: int, priority: int) -> mc.ModelConfig:
    cfg = model_config()
    group = cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    group.rate_limiter.resources.add(name=resource, count=count)
    group.rate_limiter.priority = priority
    return cfg


def scheduler(cfg: mc.ModelConfig, instance: FakeInstance, limiter: RateLimiter) -> ModelScheduler:
    return ModelScheduler(cfg, ModelSignature.from_config(cfg, "1"), instance, capacity=1, limiter=limiter)


async def test_two_models_sharing_a_resource_of_one_never_execute_at_once_and_priority_goes_first() -> None:
    limiter = RateLimiter()
    instances = {name: FakeInstance(blocked=True) for name in ("first", "low", "high")}
    scheds = {
        "first": scheduler(limited("R", 1, 1), instances["first"], limiter),
        "low": scheduler(limited("R", 1, 2), instances["low"], limiter),
        "high": scheduler(limited("R", 1, 1), instances["high"], limiter),
    }
    running = start(scheds["first"], request(1.0))
    await settle()
    waiting = [start(scheds["low"], request(2.0)), start(scheds["high"], request(3.0))]
    await settle()
    assert [len(i.calls) for i in instances.values()] == [1, 0, 0]  # the others wait for R
    order = []
    for _ in range(3):
        busy = [name for name, i in instances.items() if i.active]
        assert len(busy) == 1  # never two at once
        order.append(busy[0])
        instances[busy[0]].release_all()
        await settle()
    assert order == ["first", "high", "low"]  # the priority-1 model before the priority-2 one
    await asyncio.gather(running, *waiting)
    assert limiter.in_use("R") == 0 and limiter.waiting() == 0


async def test_a_cancelled_request_gives_its_turn_back() -> None:
    limiter = RateLimiter()
    holder_instance, gone_instance = FakeInstance(blocked=True), FakeInstance(blocked=True)
    holder = scheduler(limited("R", 1, 1), holder_instance, limiter)
    gone_sched = scheduler(limited("R", 1, 1), gone_instance, limiter)
    running = start(holder, request(1.0))
    await settle()
    gone = start(gone_sched, request(2.0))
    await settle()
    assert limiter.waiting() == 1
    gone.cancel()
    await settle()
    assert limiter.waiting() == 0  # its queue emptied: its request for R withdrawn
    holder_instance.release_all()
    await running
    assert gone_instance.calls == [] and limiter.in_use("R") == 0


async def test_models_without_a_rate_limiter_are_not_limited() -> None:
    limiter = RateLimiter()
    instance = FakeInstance(blocked=True)
    sched = ModelScheduler(
        model_config(), ModelSignature.from_config(model_config(), "1"), instance, capacity=2, limiter=limiter
    )
    a, b = start(sched, request(1.0)), start(sched, request(2.0))
    await settle()
    assert len(instance.calls) == 2
    instance.release_all()
    await asyncio.gather(a, b)


async def test_each_execution_of_a_limited_model_waits_its_own_turn() -> None:
    """The default scheduler sends several executions in one call; a limited model sends one per grant."""
    cfg = limited("R", 1, 1)
    cfg.ClearField("dynamic_batching")
    instance = FakeInstance(blocked=True)
    sched = scheduler(cfg, instance, RateLimiter())
    first = start(sched, request(1.0))
    await settle()
    rest = [start(sched, request(v)) for v in (2.0, 3.0, 4.0)]
    await settle()
    for _ in range(4):
        instance.release_all()
        await settle()
    await asyncio.gather(first, *rest)
    assert [len(call) for call in instance.calls] == [1, 1, 1, 1]
