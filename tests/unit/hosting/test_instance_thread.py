"""An instance's thread: a one-worker executor that also serves the instance's lane (no Ray)."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from collections.abc import Iterator

import pytest

from serve_app.errors import Draining, InvalidArgument
from serve_app.hosting.instance_thread import InstanceThread
from serve_app.transport.channel import ChannelBroken, ChannelClient

TOKEN = b"k" * 32


@pytest.fixture
def thread() -> Iterator[InstanceThread]:
    t = InstanceThread("test-exec")
    yield t
    t.shutdown(wait=True)


def test_runs_tasks_in_order_on_one_thread(thread: InstanceThread) -> None:
    seen: list[tuple[int, str]] = []
    futures = [thread.submit(lambda n=n: seen.append((n, threading.current_thread().name))) for n in range(20)]
    for f in futures:
        f.result(timeout=5)
    assert [n for n, _ in seen] == list(range(20))
    assert {name for _, name in seen} == {"test-exec"}


def test_task_errors_reach_the_caller_even_system_exit(thread: InstanceThread) -> None:
    def fail() -> None:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        thread.submit(fail).result(timeout=5)
    assert thread.submit(lambda x, y=0: x + y, 1, y=2).result(timeout=5) == 3  # still serving


def test_run_in_executor_uses_it(thread: InstanceThread) -> None:
    async def main() -> str:
        return await asyncio.get_running_loop().run_in_executor(thread, lambda: threading.current_thread().name)

    assert asyncio.run(main()) == "test-exec"


def test_no_work_after_shutdown() -> None:
    t = InstanceThread("x")
    t.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        t.submit(lambda: None)


def _lane(thread: InstanceThread, handler: object) -> str:
    path = thread.open_lane(handler, TOKEN, "instance-1")  # type: ignore[arg-type]
    assert path
    return path


def test_lane_calls_run_on_the_instance_thread_between_tasks(thread: InstanceThread) -> None:
    names: list[str] = []

    def handler(payload: object) -> object:
        names.append(threading.current_thread().name)
        if payload == "draining":
            raise Draining("stopping")
        if payload == "bad":
            raise ValueError("boom")
        return ("echo", payload)

    path = _lane(thread, handler)
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700  # only this user reaches the socket

    async def main() -> None:
        client = ChannelClient(path)
        await client.connect(TOKEN)
        answers = await asyncio.gather(*(client.call(n) for n in range(10)))
        assert answers == [("echo", n) for n in range(10)]
        # tasks submitted meanwhile still run, on the same thread
        task = asyncio.get_running_loop().run_in_executor(thread, lambda: threading.current_thread().name)
        assert await asyncio.gather(client.call("x"), task) == [("echo", "x"), "test-exec"]
        with pytest.raises(Draining):  # a typed error crosses as itself
            await client.call("draining")
        with pytest.raises(Exception, match="boom"):
            await client.call("bad")
        assert await client.call(1) == ("echo", 1)  # the connection stays up
        client.close()

    asyncio.run(main())
    assert set(names) == {"test-exec"}


def test_lane_refuses_a_client_without_the_key(thread: InstanceThread) -> None:
    path = _lane(thread, lambda p: p)

    async def main() -> None:
        client = ChannelClient(path)
        with pytest.raises(ChannelBroken):
            await client.connect(b"wrong" * 8)
        good = ChannelClient(path)
        await good.connect(TOKEN)
        assert await good.call("still serving") == "still serving"
        good.close()

    asyncio.run(main())


def test_lane_goes_away_with_the_thread() -> None:
    t = InstanceThread("x")
    path = _lane(t, lambda p: p)

    async def main() -> None:
        client = ChannelClient(path)
        await client.connect(TOKEN)
        t.shutdown(wait=True)
        with pytest.raises(ChannelBroken):
            await asyncio.wait_for(client.call("late"), 5)

    asyncio.run(main())
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))


def test_a_broken_frame_closes_only_its_connection(thread: InstanceThread) -> None:
    path = _lane(thread, lambda p: p)

    async def main() -> None:
        client = ChannelClient(path)
        await client.connect(TOKEN)
        assert client._writer is not None
        client._writer.write(b"\xff" * 8 + b"junk")  # announces an impossible frame
        await asyncio.sleep(0)
        with pytest.raises(ChannelBroken):
            await asyncio.wait_for(client.call("after"), 5)
        other = ChannelClient(path)
        await other.connect(TOKEN)
        assert await other.call("ok") == "ok"
        other.close()

    asyncio.run(main())


def test_invalid_argument_is_typed(thread: InstanceThread) -> None:
    def handler(payload: object) -> object:
        raise InvalidArgument("bad input")

    path = _lane(thread, handler)

    async def main() -> None:
        client = ChannelClient(path)
        await client.connect(TOKEN)
        with pytest.raises(InvalidArgument, match="bad input"):
            await client.call(0)
        client.close()

    asyncio.run(main())


def test_a_system_exit_in_a_lane_call_fails_only_that_call(thread: InstanceThread) -> None:
    def handler(payload: object) -> object:
        if payload == "exit":
            raise SystemExit(1)
        return payload

    path = _lane(thread, handler)

    async def main() -> None:
        client = ChannelClient(path)
        await client.connect(TOKEN)
        with pytest.raises(Exception, match="SystemExit"):
            await client.call("exit")
        assert await client.call("after") == "after"  # the thread still serves its lane
        client.close()

    asyncio.run(main())
    assert thread.submit(lambda: "tasks too").result(timeout=5) == "tasks too"


def test_large_calls_and_answers_cross_whole(thread: InstanceThread) -> None:
    import numpy as np

    path = _lane(thread, lambda p: {"doubled": p["x"] * 2})
    x = np.arange(4 << 20, dtype=np.float32)  # 16 MiB each way: far more than a socket buffer holds

    async def main() -> None:
        client = ChannelClient(path)
        await client.connect(TOKEN)
        answers = await asyncio.gather(*(client.call({"x": x + n}) for n in range(3)))
        for n, answer in enumerate(answers):
            np.testing.assert_array_equal(answer["doubled"], (x + n) * 2)
        client.close()

    asyncio.run(main())


def test_an_answer_that_does_not_pickle_fails_only_its_call(thread: InstanceThread) -> None:
    path = _lane(thread, lambda p: (lambda: None) if p == "unpicklable" else p)

    async def main() -> None:
        client = ChannelClient(path)
        await client.connect(TOKEN)
        with pytest.raises(Exception, match="pickle"):
            await asyncio.wait_for(client.call("unpicklable"), 5)
        assert await client.call("after") == "after"
        client.close()

    asyncio.run(main())
