"""The response cache: its settings (--cache-config), its key, its size bound, and the scheduler that answers
repeated requests from it with Triton's statistics (a hit is a success, not an inference nor an execution)."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.cache_config import CacheConfig
from serve_app.errors import InvalidArgument
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, RequestedOutput
from serve_app.scheduling.model_scheduler import ModelScheduler
from serve_app.scheduling.response_cache import ENTRY_OVERHEAD, ResponseCache, cache_key, response_size
from serve_app.stats import ModelStats
from serve_app.stats.prometheus import ModelMetrics, render
from tests.support.clock import FakeClock
from tests.unit.scheduling.test_model_scheduler import WIDTH, FakeInstance, model_config, output, request, start


# -- settings --------------------------------------------------------------------------------------------------
def test_cache_config_parses_tritons_local_cache() -> None:
    assert CacheConfig.parse([]) == CacheConfig(0)
    assert not CacheConfig.parse([]).enabled
    assert CacheConfig.parse(["local,size=1048576"]) == CacheConfig(1_048_576)
    assert CacheConfig.parse(["local,size=1048576"]).enabled


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("local", "expected <cache>,<setting>=<value>"),
        ("redis,host=localhost", "cache 'redis' is not available"),
        ("local,capacity=5", "no setting 'capacity'"),
        ("local,size=-1", "expected a number of bytes"),
        ("local,size=1MB", "expected a number of bytes"),
    ],
)
def test_cache_config_refuses_what_it_cannot_serve(entry: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        CacheConfig.parse([entry])
    assert message in info.value.message


# -- the key ------------------------------------------------------------------------------------------------------
def two_inputs(a: object, b: object, *, swap: bool = False, outputs: tuple[str, ...] = ()) -> InferRequest:
    x = InferTensor("A", "FP32", (1, 2), np.asarray(a, dtype=np.float32).reshape(1, 2))
    y = InferTensor("B", "BYTES", (1,), np.array(b, dtype=object))
    return InferRequest("m", inputs=[y, x] if swap else [x, y], outputs=[RequestedOutput(n) for n in outputs])


def test_the_key_is_the_model_version_and_input_bytes_by_name() -> None:
    base = cache_key(two_inputs([1, 2], [b"x"]), "m", "1")
    assert cache_key(two_inputs([1, 2], [b"x"], swap=True), "m", "1") == base  # input order does not matter
    assert len({
        base,
        cache_key(two_inputs([1, 3], [b"x"]), "m", "1"),
        cache_key(two_inputs([1, 2], [b"y"]), "m", "1"),
        cache_key(two_inputs([1, 2], [b"x"]), "m", "2"),
        cache_key(two_inputs([1, 2], [b"x"]), "n", "1"),
        cache_key(two_inputs([1, 2], [b"x"], outputs=("OUT",)), "m", "1"),
    }) == 6  # fmt: skip


def test_the_key_tells_shapes_and_types_of_the_same_bytes_apart() -> None:
    flat = InferRequest("m", inputs=[InferTensor("A", "FP32", (2,), np.zeros(2, np.float32))])
    square = InferRequest("m", inputs=[InferTensor("A", "FP32", (1, 2), np.zeros((1, 2), np.float32))])
    ints = InferRequest("m", inputs=[InferTensor("A", "INT32", (2,), np.zeros(2, np.int32))])
    assert len({cache_key(r, "m", "1") for r in (flat, square, ints)}) == 3


# -- size and recency ---------------------------------------------------------------------------------------
def answer(value: float, floats: int = 4) -> InferResponse:
    data = np.full(floats, value, np.float32)
    return InferResponse("m", "1", "", [InferTensor("OUT", "FP32", (floats,), data)])


def test_least_recently_used_answers_make_room_and_oversized_ones_are_not_kept() -> None:
    entry = response_size(answer(0.0))
    assert entry == ENTRY_OVERHEAD + 16
    cache = ResponseCache(2 * entry)
    assert cache.insert(b"a", answer(1.0)) and cache.insert(b"b", answer(2.0))
    assert cache.lookup(b"a", "r") is not None  # a is now the most recent
    assert cache.insert(b"c", answer(3.0))
    assert (b"a" in cache, b"b" in cache, b"c" in cache) == (True, False, True)
    assert cache.used == 2 * entry and cache.evictions == 1
    assert not cache.insert(b"big", answer(4.0, floats=1000))  # larger than the whole cache
    assert not cache.insert(b"a", answer(9.0))  # already there
    assert len(cache) == 2


def test_a_hit_is_the_cached_answer_under_the_new_request_id_and_changing_it_changes_nothing() -> None:
    cache = ResponseCache(10_000)
    cache.insert(b"k", answer(1.0))
    hit = cache.lookup(b"k", "second")
    assert hit is not None and hit.id == "second"
    hit.outputs[0] = InferTensor("OUT", "BYTES", (1,), np.array([b"top-1"], dtype=object))  # as classification does
    again = cache.lookup(b"k", "third")
    assert again is not None and again.outputs[0].datatype == "FP32"


# -- the scheduler -------------------------------------------------------------------------------------------
def cached_scheduler(instance: FakeInstance, size: int = 1 << 20) -> ModelScheduler:
    config = model_config()
    config.response_cache.enable = True
    return ModelScheduler(
        config,
        ModelSignature.from_config(config, "1"),
        instance,
        capacity=1,
        clock=FakeClock(),
        cache=ResponseCache(size),
    )


async def test_a_repeated_request_is_answered_from_the_cache_without_executing() -> None:
    instance = FakeInstance()
    sched = cached_scheduler(instance)
    first = await start(sched, request(3.0, id="one"), arrival_ns=0)
    second = await start(sched, request(3.0, id="two"), arrival_ns=0)
    assert len(instance.calls) == 1
    assert second.id == "two"
    np.testing.assert_array_equal(output(second, "OUTPUT0"), output(first, "OUTPUT0"))
    stats = sched.stats
    assert (stats.inference["cache_hit"].count, stats.inference["cache_miss"].count) == (1, 1)
    assert stats.inference["success"].count == 2
    assert (stats.inference_count, stats.execution_count) == (1, 1)  # a hit is neither
    other = await start(sched, request(4.0), arrival_ns=0)
    np.testing.assert_array_equal(output(other, "OUTPUT0"), np.full((1, WIDTH), 5.0, np.float32))
    assert len(instance.calls) == 2
    assert stats.inference["cache_miss"].count == 2


async def test_a_cache_too_small_for_an_answer_never_hits() -> None:
    instance = FakeInstance()
    sched = cached_scheduler(instance, size=ENTRY_OVERHEAD)  # no answer fits
    for _ in range(2):
        await start(sched, request(3.0), arrival_ns=0)
    assert len(instance.calls) == 2
    assert sched.stats.inference["cache_hit"].count == 0
    assert sched.stats.inference["cache_miss"].count == 2  # Triton counts a miss whose insert failed


def test_cache_metrics_show_for_cached_models_only() -> None:
    cached, plain = ModelStats("cached", "1"), ModelStats("plain", "1")
    cached.record_cache_hit(5_000, 0, 2_000, now_ms=1)
    cached.record_cache_miss(3_000)
    text = render([ModelMetrics(cached, {}, cached=True), ModelMetrics(plain, {})]).decode()
    assert 'nv_cache_num_hits_per_model{model="cached",version="1"} 1' in text
    assert 'nv_cache_hit_duration_per_model{model="cached",version="1"} 2' in text
    assert 'nv_cache_num_misses_per_model{model="cached",version="1"} 1' in text
    assert 'nv_cache_miss_duration_per_model{model="cached",version="1"} 3' in text
    assert 'model="plain"' in text and 'nv_cache_num_hits_per_model{model="plain"' not in text
