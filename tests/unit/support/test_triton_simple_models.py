"""tests/support/triton_simple_models.py: every config parses as our ModelConfig, and the ONNX models
compute what Triton's example clients expect of them."""

from __future__ import annotations

import pathlib

import numpy as np
import onnxruntime as ort
import pytest

from serve_app.config import parse_config
from tests.support import triton_simple_models as tsm


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tsm.build(tmp_path_factory.mktemp("triton_simple"))


def run(repo: pathlib.Path, model: str, **feeds: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def col(value: int, dtype: type = np.int32) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def test_every_model_is_written_and_its_config_parses(repo: pathlib.Path) -> None:
    assert sorted(p.name for p in repo.iterdir()) == sorted(tsm.ALL_MODELS)
    for name in tsm.ALL_MODELS:
        path = repo / name / "config.pbtxt"
        assert parse_config(path.read_text(), model=name, path=str(path)).name == name


def test_simple_string_adds_and_subtracts_decimal_strings(repo: pathlib.Path) -> None:
    a = np.array([[str(i) for i in range(16)]], dtype=object)
    b = np.array([["1"] * 16], dtype=object)
    out0, out1 = run(repo, tsm.SIMPLE_STRING, INPUT0=a, INPUT1=b)
    assert [int(v) for v in out0[0]] == [i + 1 for i in range(16)]
    assert [int(v) for v in out1[0]] == [i - 1 for i in range(16)]


def test_simple_sequence_is_input_plus_start_when_ready(repo: pathlib.Path) -> None:
    (out,) = run(repo, tsm.SIMPLE_SEQUENCE, INPUT=col(20), START=col(1), READY=col(1))
    assert out[0][0] == 21
    (out,) = run(repo, tsm.SIMPLE_SEQUENCE, INPUT=col(20), START=col(0), READY=col(0))
    assert out[0][0] == 0


def test_simple_dyna_sequence_adds_the_correlation_id_at_end(repo: pathlib.Path) -> None:
    feeds = {"INPUT": col(1), "START": col(0), "END": col(1), "READY": col(1), "CORRID": col(1000, np.uint64)}
    assert run(repo, tsm.SIMPLE_DYNA_SEQUENCE, **feeds)[0][0][0] == 1001


def test_simple_string_dyna_sequence_keeps_a_running_sum(repo: pathlib.Path) -> None:
    corrid = np.array([["1002"]], dtype=object)
    out, state = run(
        repo, tsm.SIMPLE_STRING_DYNA_SEQUENCE, INPUT=col(-7), INPUT_STATE=col(9), START=col(0), END=col(0),
        READY=col(1), CORRID=corrid,
    )  # fmt: skip
    assert (out[0][0], state[0][0]) == (2, 2)
    out, _ = run(
        repo, tsm.SIMPLE_STRING_DYNA_SEQUENCE, INPUT=col(-1), INPUT_STATE=col(2), START=col(0), END=col(1),
        READY=col(1), CORRID=corrid,
    )  # fmt: skip
    assert out[0][0] == 1 + 1002
