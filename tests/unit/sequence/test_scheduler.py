"""SequenceScheduler (the gateway's side of a sequence model) over a fake SequencePort: routing through the
router and the cached place, retries on "not here", lost instances, ordering, errors and statistics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from serve_app.errors import InternalError, InvalidArgument, NotFound, ServeError, Unavailable
from serve_app.inference.options import CorrId, RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, ParamValue, RequestedOutput
from serve_app.protos import model_config_pb2 as mc
from serve_app.sequence.messages import BACKLOG_TIMEOUT, Assignment, Recovery, SequenceStep, StateBackup, StepResult
from serve_app.sequence.scheduler import SequenceScheduler
from tests.support.clock import FakeClock

START_FLAG = (
    "inference request for sequence {} to model 'seq' must specify the START flag on the first request of the sequence"
)


async def send(scheduler: Any, req: InferRequest, batch_size: int, arrival_ns: int) -> InferResponse:
    """``req`` through the service's option parsing, then the scheduler (as the service does)."""
    options = RequestOptions.parse(req, scheduler.signature, batch_size=batch_size, sequence_model=True)
    return await scheduler.submit(req, options, arrival_ns)


def config(corrid: str = "TYPE_UINT64", max_batch_size: int = 4) -> mc.ModelConfig:
    text = f"""
        name: "seq"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "DOUBLE" data_type: TYPE_INT32 dims: [ 1 ] }},
                 {{ name: "NEG" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        sequence_batching {{
          direct {{ }}
          control_input [ {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }} ] }} ]
        }}
    """
    return text_format.Parse(text, mc.ModelConfig())


def place(slot: int, slot_token: int = 1, instance: str = "A") -> Assignment:
    return Assignment(instance, (instance.lower(), 1), slot, slot_token)


Handler = Callable[[Assignment, SequenceStep], "StepResult | Exception"]


def compute(assignment: Assignment, step: SequenceStep) -> StepResult:
    x = step.inputs["INPUT"]
    outputs = {"DOUBLE": x * 2, "NEG": -x}
    return StepResult(
        outputs={n: outputs[n] for n in step.outputs},
        queue_ns=100,
        compute_input_ns=1,
        compute_infer_ns=2,
        compute_output_ns=3,
        execution_batch=1,
    )


class FakePort:
    """Router and instances: ``table`` is the router's view; ``handler`` answers each dispatched step (an
    exception result is raised by the step's future); ``dispatch_raises`` makes the hand-over itself fail;
    ``backups`` are the states passed on (``on_backup`` is called with each as it is)."""

    def __init__(self) -> None:
        self.table: dict[CorrId, Assignment] = {}
        self.calls: list[tuple] = []
        self.backups: list[StateBackup] = []
        self.on_backup: Callable[[StateBackup], None] | None = None
        self.assign_gates: dict[CorrId, asyncio.Event] = {}
        self.assign_errors: dict[CorrId, Exception] = {}  # raised by assign (after its gate)
        self.timeouts: list[int] = []  # the timeout_us of each assign and lookup
        self.handler: Handler = compute
        self.dispatch_raises: Exception | None = None
        self.next_slot = 0

    async def assign(self, corr_id: CorrId, timeout_us: int = 0) -> Assignment:
        self.calls.append(("assign", corr_id))
        self.timeouts.append(timeout_us)
        gate = self.assign_gates.get(corr_id)
        if gate is not None:
            await gate.wait()
        error = self.assign_errors.pop(corr_id, None)
        if error is not None:
            raise error
        if corr_id not in self.table:
            self.table[corr_id] = place(self.next_slot, slot_token=100 + self.next_slot)
            self.next_slot += 1
        return self.table[corr_id]

    async def lookup(self, corr_id: CorrId, timeout_us: int = 0) -> Assignment:
        self.calls.append(("lookup", corr_id))
        self.timeouts.append(timeout_us)
        if corr_id not in self.table:
            raise InvalidArgument(START_FLAG.format(corr_id))
        return self.table[corr_id]

    async def dispatch(self, assignment: Assignment, step: SequenceStep) -> asyncio.Future[StepResult]:
        self.calls.append(("dispatch", step.corr_id, assignment.slot, step.slot, step.slot_token, step.start, step.end))
        if self.dispatch_raises is not None:
            raise self.dispatch_raises
        future: asyncio.Future[StepResult] = asyncio.get_running_loop().create_future()
        answer = self.handler(assignment, step)
        if isinstance(answer, Exception):
            future.set_exception(answer)
        else:
            future.set_result(answer)
        return future

    def backup(self, backup: StateBackup) -> None:
        self.backups.append(backup)
        if self.on_backup is not None:
            self.on_backup(backup)

    def backlog_deadline(self, corr_id: CorrId, timeout_us: int) -> None:
        self.calls.append(("deadline", corr_id, timeout_us))

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls]


def scheduler(port: FakePort, cfg: mc.ModelConfig | None = None, clock: FakeClock | None = None) -> SequenceScheduler:
    cfg = cfg or config()
    return SequenceScheduler(cfg, ModelSignature.from_config(cfg, "1"), port, clock=clock or FakeClock(1_000_000))


def request(
    corr: ParamValue | None, value: int = 1, *, start: bool = False, end: bool = False, outputs: tuple[str, ...] = ()
) -> InferRequest:
    params: dict[str, ParamValue] = {}
    if corr is not None:
        params["sequence_id"] = corr
    if start:
        params["sequence_start"] = True
    if end:
        params["sequence_end"] = True
    return InferRequest(
        "seq",
        "1",
        id=f"r{value}",
        inputs=[InferTensor("INPUT", "INT32", (1, 1), np.array([[value]], dtype=np.int32))],
        outputs=[RequestedOutput(n) for n in outputs],
        parameters=params,
    )


async def submit(s: SequenceScheduler, req: InferRequest, batch_size: int = 1) -> dict[str, list[int]]:
    resp = await send(s, req, batch_size, 0)
    assert (resp.model_name, resp.model_version, resp.id) == ("seq", "1", req.id)
    return {t.name: t.data.ravel().tolist() for t in resp.outputs}


# --------------------------------------------------------------------------- routing


async def test_start_assigns_and_later_steps_use_the_cached_place() -> None:
    port = FakePort()
    s = scheduler(port)
    assert await submit(s, request(7, 1, start=True)) == {"DOUBLE": [2], "NEG": [-1]}
    assert await submit(s, request(7, 2)) == {"DOUBLE": [4], "NEG": [-2]}
    assert await submit(s, request(7, 3, end=True)) == {"DOUBLE": [6], "NEG": [-3]}
    assert port.calls == [
        ("assign", 7),
        ("dispatch", 7, 0, 0, 100, True, False),
        ("dispatch", 7, 0, 0, 100, False, False),
        ("dispatch", 7, 0, 0, 100, False, True),
    ]


async def test_after_end_the_place_is_forgotten() -> None:
    port = FakePort()
    s = scheduler(port)
    await submit(s, request(7, start=True, end=True))
    del port.table[7]  # the router dropped it when the slot was released
    with pytest.raises(InvalidArgument) as exc:
        await submit(s, request(7))
    assert exc.value.message == START_FLAG.format(7)
    assert port.kinds() == ["assign", "dispatch", "lookup"]


async def test_step_without_a_cached_place_asks_the_router() -> None:
    port = FakePort()
    port.table["abc"] = place(3, 42)  # started through another gateway
    s = scheduler(port, config(corrid="TYPE_STRING"))
    assert await submit(s, request("abc", 5)) == {"DOUBLE": [10], "NEG": [-5]}
    assert await submit(s, request("abc", 6, end=True)) == {"DOUBLE": [12], "NEG": [-6]}
    assert port.calls == [
        ("lookup", "abc"),
        ("dispatch", "abc", 3, 3, 42, False, False),
        ("dispatch", "abc", 3, 3, 42, False, True),
    ]


async def test_every_start_asks_the_router() -> None:
    port = FakePort()
    s = scheduler(port)
    await submit(s, request(7, start=True))
    await submit(s, request(7, start=True))
    assert port.kinds() == ["assign", "dispatch", "assign", "dispatch"]


async def test_requested_outputs_only() -> None:
    port = FakePort()
    s = scheduler(port)
    assert await submit(s, request(7, 4, start=True, outputs=("NEG",))) == {"NEG": [-4]}
    resp = await send(s, request(7, 4), 1, 0)
    assert [(t.name, t.datatype, t.shape) for t in resp.outputs] == [
        ("DOUBLE", "INT32", (1, 1)),
        ("NEG", "INT32", (1, 1)),
    ]


async def test_not_here_asks_the_router_once_and_retries_at_the_new_place() -> None:
    port = FakePort()
    s = scheduler(port)
    await submit(s, request(7, start=True))
    port.table[7] = place(2, 555, instance="B")  # moved (restarted elsewhere through another gateway)
    port.handler = lambda a, st: StepResult(not_here=True) if a.instance == "A" else compute(a, st)
    assert await submit(s, request(7, 3)) == {"DOUBLE": [6], "NEG": [-3]}
    assert port.calls[2:] == [
        ("dispatch", 7, 0, 0, 100, False, False),
        ("lookup", 7),
        ("dispatch", 7, 2, 2, 555, False, False),
    ]
    # The new place is cached.
    await submit(s, request(7, 4))
    assert port.calls[-1] == ("dispatch", 7, 2, 2, 555, False, False)
    assert port.kinds().count("lookup") == 1


async def test_not_here_at_the_same_place_is_the_start_flag_error() -> None:
    port = FakePort()
    s = scheduler(port)
    await submit(s, request(7, start=True))
    port.handler = lambda a, st: StepResult(not_here=True)
    with pytest.raises(InvalidArgument) as exc:
        await submit(s, request(7))
    assert exc.value.message == START_FLAG.format(7)
    assert port.kinds() == ["assign", "dispatch", "dispatch", "lookup"]


async def test_not_here_twice_is_the_start_flag_error() -> None:
    port = FakePort()
    s = scheduler(port)
    await submit(s, request(7, start=True))
    port.table[7] = place(1, 777)
    port.handler = lambda a, st: StepResult(not_here=True)
    with pytest.raises(InvalidArgument, match="must specify the START flag"):
        await submit(s, request(7))
    assert port.kinds() == ["assign", "dispatch", "dispatch", "lookup", "dispatch"]
    # Nothing cached: the next step asks the router again.
    port.handler = compute
    await submit(s, request(7))
    assert port.kinds()[-2:] == ["lookup", "dispatch"]


async def test_router_error_on_lookup_after_not_here() -> None:
    port = FakePort()
    s = scheduler(port)
    await submit(s, request(7, start=True))
    port.table.clear()  # the sequence ended or timed out: the router no longer knows it
    port.handler = lambda a, st: StepResult(not_here=True)
    with pytest.raises(InvalidArgument, match="must specify the START flag"):
        await submit(s, request(7))


async def test_start_answered_not_here_is_an_error() -> None:
    port = FakePort()
    port.handler = lambda a, st: StepResult(not_here=True)
    s = scheduler(port)
    with pytest.raises(ServeError):
        await send(s, request(7, start=True), 1, 0)


async def test_unavailable_from_dispatch_is_lost() -> None:
    port = FakePort()
    s = scheduler(port)
    await submit(s, request(7, start=True))
    port.dispatch_raises = Unavailable("the channel to instance A is closed")
    with pytest.raises(Unavailable) as exc:
        await submit(s, request(7))
    msg = exc.value.message
    assert msg == (
        "sequence 7 of model 'seq' was lost: the channel to instance A is closed; send its next request with the "
        "START flag to start it again"
    )
    # The place is forgotten: the next step asks the router (which may know it as lost).
    port.dispatch_raises = None
    await submit(s, request(7))
    assert port.kinds()[-2:] == ["lookup", "dispatch"]


async def test_unavailable_from_the_result_is_lost() -> None:
    port = FakePort()
    s = scheduler(port)
    await submit(s, request(7, start=True))
    port.handler = lambda a, st: Unavailable("replica died")
    with pytest.raises(Unavailable, match=r"sequence 7 of model 'seq' was lost: replica died; send its next"):
        await submit(s, request(7))


async def test_unavailable_when_retrying_at_the_new_place_is_lost() -> None:
    port = FakePort()
    s = scheduler(port)
    await submit(s, request(7, start=True))
    port.table[7] = place(1, 9, instance="B")
    port.handler = lambda a, st: StepResult(not_here=True) if a.instance == "A" else Unavailable("B died")
    with pytest.raises(Unavailable) as exc:
        await submit(s, request(7))
    assert "was lost: B died" in exc.value.message


async def test_dispatch_failure_when_retrying_is_reported_once() -> None:
    port = FakePort()
    s = scheduler(port)
    await submit(s, request(7, start=True))
    port.table[7] = place(1, 9, instance="B")
    port.handler = lambda a, st: StepResult(not_here=True)

    real_dispatch = port.dispatch

    async def dispatch(a: Assignment, st: SequenceStep) -> asyncio.Future[StepResult]:
        if a.instance == "B":
            raise Unavailable("B is gone")
        return await real_dispatch(a, st)

    port.dispatch = dispatch  # type: ignore[method-assign]
    with pytest.raises(Unavailable) as exc:
        await submit(s, request(7))
    assert exc.value.message == (
        "sequence 7 of model 'seq' was lost: B is gone; send its next request with the START flag to start it again"
    )


async def test_backend_error_in_the_result() -> None:
    port = FakePort()
    s = scheduler(port)
    await submit(s, request(7, start=True))
    port.handler = lambda a, st: StepResult(error=InternalError("onnxruntime failed"), execution_batch=2)
    with pytest.raises(InternalError, match="onnxruntime failed"):
        await submit(s, request(7))
    st = s.stats
    assert st.failures["BACKEND"] == 1 and st.failure_count == 1
    assert st.execution_count == 2  # the failed execution still counts


# --------------------------------------------------------------------------- request checks


async def test_batch_size_two_rejected() -> None:
    port = FakePort()
    s = scheduler(port)
    with pytest.raises(InvalidArgument) as exc:
        await send(s, request(7, start=True), 2, 0)
    assert exc.value.message == (
        "inference request to model 'seq' must specify batch-size 1 due to requirements of sequence batcher"
    )
    assert port.calls == []


@pytest.mark.parametrize("batch_size", [0, 1])
async def test_batch_size_zero_or_one_accepted(batch_size: int) -> None:
    port = FakePort()
    s = scheduler(port)
    await send(s, request(7, start=True), batch_size, 0)
    assert port.calls[-1][0] == "dispatch"


async def test_missing_correlation_id() -> None:
    port = FakePort()
    s = scheduler(port)
    with pytest.raises(InvalidArgument, match="must specify a non-zero or non-empty correlation ID"):
        await send(s, request(None, start=True), 1, 0)
    assert port.calls == []


async def test_string_id_for_a_numeric_corrid() -> None:
    port = FakePort()
    s = scheduler(port)
    with pytest.raises(InvalidArgument, match="expects a TYPE_UINT64 correlation ID"):
        await send(s, request("abc", start=True), 1, 0)
    assert port.calls == []


# --------------------------------------------------------------------------- ordering


async def test_steps_dispatched_in_order_while_the_start_waits_for_a_slot() -> None:
    port = FakePort()
    port.assign_gates[7] = asyncio.Event()
    s = scheduler(port)
    tasks = [asyncio.create_task(send(s, request(7, i + 1, start=i == 0, end=i == 3), 1, 0)) for i in range(4)]
    other = asyncio.create_task(send(s, request(8, 9, start=True, end=True), 1, 0))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not any(t.done() for t in tasks)
    assert other.done()  # another sequence does not wait behind 7
    assert s.queued == 4
    port.assign_gates[7].set()
    responses = await asyncio.gather(*tasks)
    assert [r.outputs[0].data.item() for r in responses] == [2, 4, 6, 8]
    sevens = [c for c in port.calls if c[1] == 7]
    assert [c[0] for c in sevens] == ["assign", "dispatch", "dispatch", "dispatch", "dispatch"]
    assert [(c[5], c[6]) for c in sevens[1:]] == [(True, False), (False, False), (False, False), (False, True)]
    assert len({(c[3], c[4]) for c in sevens[1:]}) == 1  # all at the START's place
    assert s.queued == 0


async def test_ordering_holds_when_a_step_fails() -> None:
    port = FakePort()
    port.assign_gates[7] = asyncio.Event()
    s = scheduler(port)
    first = asyncio.create_task(send(s, request(7, 1, start=True), 1, 0))
    bad = asyncio.create_task(send(s, request(7, 2), 2, 0))  # rejected before it is queued
    second = asyncio.create_task(send(s, request(7, 3, end=True), 1, 0))
    await asyncio.sleep(0)
    port.assign_gates[7].set()
    await first
    with pytest.raises(InvalidArgument):
        await bad
    assert (await second).outputs[0].data.item() == 6
    assert [c[0] for c in port.calls] == ["assign", "dispatch", "dispatch"]


# --------------------------------------------------------------------------- statistics


async def test_statistics() -> None:
    port = FakePort()
    clock = FakeClock(1_000_000)
    s = scheduler(port, clock=clock)
    clock.now = 5_000
    await send(s, request(7, start=True), 1, 1_000)  # arrived at 1000, sent at 5000, 100 ns in the instance
    port.handler = lambda a, st: StepResult(
        outputs=dict.fromkeys(st.outputs, st.inputs["INPUT"]), execution_batch=0, queue_ns=7
    )  # batched with another row: that other step carries the execution
    await send(s, request(7), 1, 5_000)
    with pytest.raises(InvalidArgument):
        await send(s, request(99), 1, 5_000)  # never started: the router's START-flag error
    st = s.stats
    assert st.inference_count == 2
    assert st.execution_count == 1
    assert st.batches[1]["compute_infer"].count == 1
    assert st.inference["success"].count == 2
    assert st.inference["queue"].ns == (5_000 - 1_000 + 100) + (0 + 7)
    assert st.inference["compute_infer"].ns == 2
    assert st.failures["OTHER"] == 1 and st.failure_count == 1
    assert st.pending == 0
    assert st.last_inference_ms > 0


# --------------------------------------------------------------------------- recovery with state backup


def backed_up_config() -> mc.ModelConfig:
    cfg = config()
    state = cfg.sequence_batching.state.add()
    state.input_name, state.output_name, state.data_type = "S_IN", "S_OUT", mc.TYPE_INT32
    state.dims.append(1)
    return cfg


class RecoveringPort(FakePort):
    """The router after instance "A" died: ``moved`` is where each sequence was restored; ``answers`` are the
    outputs it kept per step id; ``recover_error`` is what a recover raises instead."""

    def __init__(self) -> None:
        super().__init__()
        self.moved: dict[CorrId, Assignment] = {}
        self.answers: dict[int, dict[str, np.ndarray]] = {}
        self.recover_error: ServeError | None = None
        self.step_ids: list[int] = []

    async def recover(self, corr_id: CorrId, failed_instance: str, step_id: int) -> Recovery:
        self.calls.append(("recover", corr_id, failed_instance))
        self.step_ids.append(step_id)
        if self.recover_error is not None:
            raise self.recover_error
        self.table[corr_id] = self.moved[corr_id]
        passed_on = [b.no for b in self.backups if b.corr_id == corr_id]
        return Recovery(self.moved[corr_id], self.answers.get(step_id), passed_on[-1] if passed_on else 0)


def die_on(instance: str) -> Handler:
    def handler(assignment: Assignment, step: SequenceStep) -> StepResult | Exception:
        if assignment.instance == instance:
            return Unavailable("the peer at a:1 is unavailable: connection lost")
        return compute(assignment, step)

    return handler


async def test_recovery_sends_the_failed_step_again_where_the_sequence_was_restored() -> None:
    port = RecoveringPort()
    s = scheduler(port, backed_up_config())
    await submit(s, request(7, 1, start=True))
    port.handler = die_on("A")
    port.moved[7] = place(1, 555, instance="B")
    assert await submit(s, request(7, 2)) == {"DOUBLE": [4], "NEG": [-2]}
    assert port.calls[2:] == [
        ("dispatch", 7, 0, 0, 100, False, False),
        ("recover", 7, "A"),
        ("dispatch", 7, 1, 1, 555, False, False),
    ]
    assert await submit(s, request(7, 3, end=True)) == {"DOUBLE": [6], "NEG": [-3]}  # the new place is cached
    assert port.calls[-1] == ("dispatch", 7, 1, 1, 555, False, True)


async def test_recovery_answers_from_the_backup_when_the_step_had_run() -> None:
    port = RecoveringPort()
    s = scheduler(port, backed_up_config())
    await submit(s, request(7, 1, start=True))
    port.handler = die_on("A")
    port.moved[7] = place(1, 555, instance="B")
    original = port.dispatch

    async def remember_id(assignment: Assignment, step: SequenceStep) -> asyncio.Future[StepResult]:
        port.answers[step.step_id] = {"DOUBLE": np.array([[40]], np.int32), "NEG": np.array([[-20]], np.int32)}
        return await original(assignment, step)

    port.dispatch = remember_id  # type: ignore[method-assign]
    assert await submit(s, request(7, 20)) == {"DOUBLE": [40], "NEG": [-20]}
    assert port.kinds()[-2:] == ["dispatch", "recover"]  # not run again
    assert port.step_ids[0] != 0


async def test_recovery_of_a_lost_sequence_is_the_routers_error() -> None:
    port = RecoveringPort()
    s = scheduler(port, backed_up_config())
    await submit(s, request(7, 1, start=True))
    port.handler = die_on("A")
    port.recover_error = Unavailable("sequence 7 of model 'seq' was lost: no backup; send its next request with START")
    with pytest.raises(Unavailable) as exc:
        await submit(s, request(7, 2))
    assert "was lost: no backup" in exc.value.message


async def test_recovery_after_an_unload_is_the_lost_error() -> None:
    port = RecoveringPort()
    s = scheduler(port, backed_up_config())
    await submit(s, request(7, 1, start=True))
    port.handler = die_on("A")
    port.recover_error = NotFound("no sequence model 'seq:1' is served")
    with pytest.raises(Unavailable) as exc:
        await submit(s, request(7, 2))
    assert "sequence 7 of model 'seq' was lost: no sequence model" in exc.value.message


async def test_a_failed_start_with_nothing_to_restore_starts_anew() -> None:
    port = RecoveringPort()
    s = scheduler(port, backed_up_config())
    port.table[7] = place(0, 100, instance="A")
    port.handler = die_on("A")
    port.recover_error = InvalidArgument(START_FLAG.format(7))

    async def assign(corr_id: CorrId, timeout_us: int = 0) -> Assignment:
        port.calls.append(("assign", corr_id))
        port.table[corr_id] = place(1, 777, instance="B") if port.kinds().count("assign") > 1 else port.table[corr_id]
        return port.table[corr_id]

    port.assign = assign  # type: ignore[method-assign]
    assert await submit(s, request(7, 3, start=True)) == {"DOUBLE": [6], "NEG": [-3]}
    assert port.kinds() == ["assign", "dispatch", "recover", "assign", "dispatch"]
    assert port.calls[-1] == ("dispatch", 7, 1, 1, 777, True, False)


async def test_without_backup_no_recovery_is_tried() -> None:
    port = RecoveringPort()
    s = scheduler(port)
    await submit(s, request(7, 1, start=True))
    port.handler = die_on("A")
    with pytest.raises(Unavailable) as exc:
        await submit(s, request(7, 2))
    assert "was lost" in exc.value.message
    assert "recover" not in port.kinds()


# --------------------------------------------------------------------------- state backups passed on


def with_backup(handler: Handler) -> Handler:
    """Answers as ``handler`` does; each successful step but an END carries its state after the step, numbered
    per instance and sequence (as an instance with state backup answers)."""
    numbers: dict[tuple[str, CorrId], int] = {}

    def answer(assignment: Assignment, step: SequenceStep) -> StepResult | Exception:
        result = handler(assignment, step)
        if isinstance(result, StepResult) and result.error is None and not result.not_here and not step.end:
            key = (assignment.instance, step.corr_id)
            numbers[key] = 1 if step.start else numbers.get(key, 0) + 1
            states = {"S_IN": step.inputs["INPUT"].reshape(-1)}
            result.backup = StateBackup(
                step.corr_id, assignment.slot, step.slot_token, states, instance=assignment.instance, no=numbers[key]
            )
        return result

    return answer


def summary(b: StateBackup) -> tuple:
    return (b.corr_id, b.instance, b.slot, b.slot_token, b.no, b.states["S_IN"].tolist())


async def test_a_successful_steps_backup_is_passed_on_before_its_answer() -> None:
    port = FakePort()
    port.handler = with_backup(compute)
    s = scheduler(port, backed_up_config())
    seen: list[tuple[int, int]] = []  # (its number, answers completed when it was passed on)
    port.on_backup = lambda b: seen.append((b.no, s.stats.inference_count))
    assert await submit(s, request(7, 1, start=True)) == {"DOUBLE": [2], "NEG": [-1]}
    assert [summary(b) for b in port.backups] == [(7, "A", 0, 100, 1, [1])]  # before submit returned
    await submit(s, request(7, 2))
    await submit(s, request(7, 3, end=True))  # an END carries none
    assert [summary(b) for b in port.backups] == [(7, "A", 0, 100, 1, [1]), (7, "A", 0, 100, 2, [2])]
    assert seen == [(1, 0), (2, 1)]  # each before its own answer was completed
    assert s.stats.inference_count == 3


async def test_the_backup_passed_on_is_the_one_the_answer_carried() -> None:
    port = FakePort()
    carried = StateBackup(7, 0, 100, {"S_IN": np.array([5], np.int32)}, instance="A", no=1)

    def handler(assignment: Assignment, step: SequenceStep) -> StepResult:
        result = compute(assignment, step)
        result.backup = carried
        return result

    port.handler = handler
    s = scheduler(port, backed_up_config())
    await submit(s, request(7, 1, start=True))
    assert len(port.backups) == 1 and port.backups[0] is carried


async def test_answers_without_backup_pass_nothing_on() -> None:
    port = FakePort()
    s = scheduler(port, backed_up_config())
    await submit(s, request(7, 1, start=True))
    await submit(s, request(7, 2, end=True))
    assert port.backups == []


async def test_an_error_results_backup_is_not_passed_on() -> None:
    port = FakePort()
    s = scheduler(port, backed_up_config())
    await submit(s, request(7, 1, start=True))
    backup = StateBackup(7, 0, 100, {"S_IN": np.array([1], np.int32)}, instance="A", no=2)
    port.handler = lambda a, st: StepResult(error=InternalError("onnxruntime failed"), backup=backup)
    with pytest.raises(InternalError, match="onnxruntime failed"):
        await submit(s, request(7, 2))
    assert port.backups == []


async def test_failed_requests_pass_nothing_on() -> None:
    port = FakePort()
    port.handler = with_backup(compute)
    s = scheduler(port, backed_up_config())
    with pytest.raises(InvalidArgument):
        await submit(s, request(99, 1))  # never started
    plain = scheduler(port)  # a model without state backup: a step lost with its instance is not recovered
    await submit(plain, request(8, 1, start=True))
    port.handler = with_backup(die_on("A"))
    with pytest.raises(Unavailable, match="was lost"):
        await submit(plain, request(8, 2))
    assert [(b.corr_id, b.no) for b in port.backups] == [(8, 1)]  # the START's only


async def test_a_retried_steps_backup_from_the_new_place_is_passed_on() -> None:
    port = FakePort()
    port.handler = with_backup(compute)
    s = scheduler(port, backed_up_config())
    await submit(s, request(7, 1, start=True))
    port.table[7] = place(2, 555, instance="B")  # moved
    answer = with_backup(compute)
    port.handler = lambda a, st: StepResult(not_here=True) if a.instance == "A" else answer(a, st)
    await submit(s, request(7, 3))
    assert [summary(b) for b in port.backups] == [(7, "A", 0, 100, 1, [1]), (7, "B", 2, 555, 1, [3])]


async def test_a_recovered_steps_new_backup_is_passed_on() -> None:
    port = RecoveringPort()
    port.handler = with_backup(compute)
    s = scheduler(port, backed_up_config())
    await submit(s, request(7, 1, start=True))
    port.handler = with_backup(die_on("A"))
    port.moved[7] = place(1, 555, instance="C")
    kinds_then: list[list[str]] = []
    port.on_backup = lambda b: kinds_then.append(port.kinds())
    assert await submit(s, request(7, 2)) == {"DOUBLE": [4], "NEG": [-2]}
    assert [summary(b) for b in port.backups] == [(7, "A", 0, 100, 1, [1]), (7, "C", 1, 555, 1, [2])]
    assert kinds_then == [["assign", "dispatch", "dispatch", "recover", "dispatch"]]  # once it ran again
    assert await submit(s, request(7, 3)) == {"DOUBLE": [6], "NEG": [-3]}  # goes on at C
    assert summary(port.backups[-1]) == (7, "C", 1, 555, 2, [3])


async def test_a_step_answered_from_the_router_passes_nothing_on() -> None:
    port = RecoveringPort()
    port.handler = with_backup(compute)
    s = scheduler(port, backed_up_config())
    await submit(s, request(7, 1, start=True))
    port.handler = with_backup(die_on("A"))
    port.moved[7] = place(1, 555, instance="B")
    original = port.dispatch

    async def remember_id(assignment: Assignment, step: SequenceStep) -> asyncio.Future[StepResult]:
        port.answers[step.step_id] = {"DOUBLE": np.array([[40]], np.int32), "NEG": np.array([[-20]], np.int32)}
        return await original(assignment, step)

    port.dispatch = remember_id  # type: ignore[method-assign]
    assert await submit(s, request(7, 20)) == {"DOUBLE": [40], "NEG": [-20]}
    assert port.kinds()[-2:] == ["dispatch", "recover"]
    assert [b.no for b in port.backups] == [1]  # the START's: the router holds the state that includes this step


async def test_recovery_onto_a_state_older_than_the_last_answer_is_the_lost_error() -> None:
    """The state of the last answered step never reached the router (it was passed on after the router had
    restored the sequence): running the step on the older state would skip a step, so the sequence is lost."""
    port = RecoveringPort()
    s = scheduler(port, backed_up_config())
    numbers = iter(range(1, 100))

    def with_backup(assignment: Assignment, step: SequenceStep) -> StepResult | Exception:
        result = compute(assignment, step)
        assert isinstance(result, StepResult)
        result.backup = StateBackup(step.corr_id, step.slot, step.slot_token, {}, assignment.instance, next(numbers))
        return result

    port.handler = with_backup
    await submit(s, request(7, 1, start=True))
    await submit(s, request(7, 2))
    assert [b.no for b in port.backups] == [1, 2]
    port.backups.pop()  # the router never got step 2's state
    port.handler = die_on("A")
    port.moved[7] = place(1, 555, instance="B")
    with pytest.raises(Unavailable) as exc:
        await submit(s, request(7, 3))
    assert "was lost: its restored state is from step 1, its last answer from 2" in exc.value.message
    assert port.kinds()[-1] == "recover"  # not run on the older state


async def test_steps_in_flight_together_go_on_where_the_first_of_them_was_restored() -> None:
    """Two steps sent together fail with their instance: the first is restored and answered at the new place,
    and the second goes on there, though the router may not have the first one's new state yet (its backup
    travels on its own)."""
    port = RecoveringPort()
    s = scheduler(port, backed_up_config())
    numbers = iter(range(1, 100))

    def numbered(handler: Handler) -> Handler:
        def run(assignment: Assignment, step: SequenceStep) -> StepResult | Exception:
            result = handler(assignment, step)
            if isinstance(result, StepResult):
                no = next(numbers)
                result.backup = StateBackup(step.corr_id, step.slot, step.slot_token, {}, assignment.instance, no)
            return result

        return run

    port.handler = numbered(compute)
    await submit(s, request(7, 1, start=True))
    port.handler = numbered(compute)
    port.moved[7] = place(1, 555, instance="B")
    port.backup = lambda backup: None  # type: ignore[method-assign]  # the router has not had B's backups yet
    at_a: list[asyncio.Future[StepResult]] = []
    original = port.dispatch

    async def a_dies_with_both_in_flight(assignment: Assignment, step: SequenceStep) -> asyncio.Future[StepResult]:
        if assignment.instance != "A":
            return await original(assignment, step)
        at_a.append(asyncio.get_running_loop().create_future())
        if len(at_a) == 2:
            for future in at_a:
                future.set_exception(Unavailable("the channel's peer is unavailable: connection lost"))
        return at_a[-1]

    port.dispatch = a_dies_with_both_in_flight  # type: ignore[method-assign]
    second, third = await asyncio.gather(submit(s, request(7, 2)), submit(s, request(7, 3)))
    assert len(at_a) == 2
    assert (second, third) == ({"DOUBLE": [4], "NEG": [-2]}, {"DOUBLE": [6], "NEG": [-3]})
    assert port.kinds().count("recover") == 1
    assert port.calls[-1] == ("dispatch", 7, 1, 1, 555, False, False)


# --------------------------------------------------------------------------- backlog timeouts


async def test_the_request_timeout_goes_with_the_start_and_lookups() -> None:
    port = FakePort()
    s = scheduler(port)
    port.table[9] = place(3)
    req = request(7, 1, start=True)
    req.parameters["timeout"] = 250_000
    await submit(s, req)
    lookup = request(9, 1)
    lookup.parameters["timeout"] = 40
    await submit(s, lookup)
    assert port.timeouts == [250_000, 40]


async def test_steps_queued_behind_a_start_that_timed_out_in_the_backlog_fail_with_it() -> None:
    """Triton rejects every request in the expired backlog; later ones need a START; a new START works."""
    port = FakePort()
    port.assign_gates[7] = asyncio.Event()
    port.assign_errors[7] = Unavailable(BACKLOG_TIMEOUT)
    s = scheduler(port)
    tasks = [asyncio.create_task(send(s, request(7, i + 1, start=i == 0), 1, 0)) for i in range(3)]
    await asyncio.sleep(0)
    port.assign_gates[7].set()
    for task in tasks:
        with pytest.raises(Unavailable, match=BACKLOG_TIMEOUT):
            await task
    assert port.kinds() == ["assign"]
    st = s.stats
    assert st.failures["REJECTED"] == 3 and st.failure_count == 3
    with pytest.raises(InvalidArgument, match="must specify the START flag"):
        await submit(s, request(7, 4))
    assert await submit(s, request(7, 5, start=True, end=True)) == {"DOUBLE": [10], "NEG": [-5]}


async def test_a_step_held_behind_a_waiting_start_tells_the_router_its_timeout() -> None:
    port = FakePort()
    port.assign_gates[7] = asyncio.Event()
    s = scheduler(port)
    start = asyncio.create_task(send(s, request(7, 1, start=True), 1, 0))
    later = request(7, 2)
    later.parameters["timeout"] = 5_000
    held = asyncio.create_task(send(s, later, 1, 0))
    untimed = asyncio.create_task(send(s, request(7, 3), 1, 0))
    await asyncio.sleep(0)
    assert [c for c in port.calls if c[0] == "deadline"] == [("deadline", 7, 5_000)]
    port.assign_gates[7].set()
    await asyncio.gather(start, held, untimed)
    # Once placed, a step's timeout is not the router's business (Triton applies none in a slot).
    await submit(s, later)
    assert [c for c in port.calls if c[0] == "deadline"] == [("deadline", 7, 5_000)]


async def test_a_request_cancelled_in_the_backlog_never_runs_and_counts_canceled() -> None:
    port = FakePort()
    port.assign_gates[7] = asyncio.Event()
    clock = FakeClock(1_000_000)
    s = scheduler(port, clock=clock)
    start = asyncio.create_task(send(s, request(7, 1, start=True), 1, 1_000_000))
    behind = asyncio.create_task(send(s, request(7, 2), 1, 1_000_000))
    for _ in range(5):
        await asyncio.sleep(0)
    clock.now = 1_500_000
    start.cancel()
    behind.cancel()
    for task in (start, behind):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert "dispatch" not in port.kinds()
    assert s.stats.failures["CANCELED"] == 2
    assert s.stats.inference["fail"].count == 2 and s.stats.inference["fail"].ns == 2 * 500_000
    assert s.stats.pending == 0


async def test_a_request_cancelled_once_sent_runs_and_is_not_counted_canceled() -> None:
    port = FakePort()
    answered = asyncio.Event()
    s = scheduler(port)
    gate: asyncio.Future[StepResult] = asyncio.get_running_loop().create_future()

    async def slow_dispatch(assignment: Assignment, step: SequenceStep) -> asyncio.Future[StepResult]:
        port.calls.append(("dispatch", step.corr_id))
        answered.set()
        return gate

    port.dispatch = slow_dispatch  # type: ignore[method-assign]
    task = asyncio.create_task(send(s, request(7, 1, start=True, end=True), 1, 0))
    await answered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert s.stats.failures["CANCELED"] == 0  # it ran in its instance; its answer goes nowhere
