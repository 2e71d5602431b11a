"""SequenceInstance with TYPE_STRING implicit state, driven by a fake model that appends each request's string
to its state: the state is carried step to step, empty direct rows get empty strings, a START starts again from
the initial (empty) state, each answer backs the string state up, and restore() takes it over elsewhere."""

from __future__ import annotations

import asyncio
import pathlib

import numpy as np
from google.protobuf import text_format

from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.protos import model_config_pb2 as mc
from serve_app.sequence.instance import SequenceInstance
from serve_app.sequence.messages import RestoreSequence, SequenceStep, StepResult
from tests.support.clock import FakeClock


def config(max_batch_size: int = 4) -> mc.ModelConfig:
    text = f"""
        name: "text"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
        sequence_batching {{
          direct {{ }}
          control_input [
            {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
          ]
          state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_STRING dims: [ 1 ] }} ]
        }}
    """
    return text_format.Parse(text, mc.ModelConfig())


class Concat:
    """OUTPUT_STATE = INPUT_STATE + INPUT (bytes, element by element); OUTPUT = the new state."""

    def __init__(self) -> None:
        self.executions: list[Execution] = []
        self.gate: asyncio.Event | None = None

    async def __call__(self, ex: Execution) -> ExecutionResult:
        self.executions.append(ex)
        if self.gate is not None:
            await self.gate.wait()
        joined = np.frompyfunc(lambda a, b: a + b, 2, 1)(ex.inputs["INPUT_STATE"], ex.inputs["INPUT"])
        new = np.asarray(joined, dtype=object)
        return ExecutionResult({n: a for n, a in {"OUTPUT_STATE": new, "OUTPUT": new}.items() if n in ex.outputs})


def make(backup: bool = False) -> tuple[SequenceInstance, Concat]:
    model = Concat()
    inst = SequenceInstance(
        config(), pathlib.Path("/nonexistent"), model, instance_id="i0", clock=FakeClock(1_000), backup=backup
    )
    return inst, model


def step(corr: int, slot: int, text: bytes, *, gen: int = 1, start: bool = False, end: bool = False) -> SequenceStep:
    data = np.empty((1, 1), dtype=object)
    data[0, 0] = text
    return SequenceStep(corr, slot, gen, start, end, {"INPUT": data}, ("OUTPUT",), 1)


def text(result: StepResult) -> bytes:
    assert result.error is None, result.error
    value = result.outputs["OUTPUT"].ravel()[0]
    assert isinstance(value, bytes)
    return value


async def test_string_state_is_carried_and_reset_by_start() -> None:
    inst, model = make()
    assert text(await inst.step(step(7, 0, b"ab", start=True))) == b"ab"
    assert text(await inst.step(step(7, 0, b"cd"))) == b"abcd"
    assert model.executions[0].inputs["INPUT_STATE"].ravel().tolist() == [b""]  # the initial state
    assert text(await inst.step(step(7, 0, b"x", gen=2, start=True))) == b"x"
    assert text(await inst.step(step(7, 0, b"y", gen=2, end=True))) == b"xy"


async def test_empty_direct_rows_get_empty_strings() -> None:
    inst, model = make()
    await inst.step(step(5, 2, b"z", gen=5, start=True))  # slot 2 in use: slots 0 and 1 are empty rows
    ex = model.executions[0]
    assert ex.inputs["INPUT"].ravel().tolist() == [b"", b"", b"z"]
    assert ex.inputs["INPUT_STATE"].ravel().tolist() == [b"", b"", b""]
    assert ex.inputs["READY"].ravel().tolist() == [0, 0, 1]


async def test_string_state_is_backed_up_and_restored_elsewhere() -> None:
    first, _ = make(backup=True)
    await first.step(step(7, 0, b"ab", start=True))
    result = await first.step(step(7, 0, b"cd"))
    assert result.backup is not None
    assert result.backup.no == 2
    assert result.backup.states["INPUT_STATE"].ravel().tolist() == [b"abcd"]
    second, _ = make(backup=True)
    assert second.restore(RestoreSequence(1, 7, 99, result.backup.states, result.backup.no, "i1"))
    assert text(await second.step(step(7, 1, b"ef", gen=99))) == b"abcdef"
