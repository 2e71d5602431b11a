"""A Python model's ``auto_complete_config``, run as Triton runs it: once, in a throwaway child process.

These start a real child interpreter (as the server does), so they take a moment each; a model whose
``model.py`` has no hook must not start one.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from serve_app.backends.python import autocomplete
from serve_app.backends.python.autocomplete import complete_python_config
from serve_app.config import parse_config
from serve_app.errors import InternalError
from serve_app.protos import model_config_pb2 as mc

FILLING_HOOK = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        print("the model's own output must not spoil the answer")
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_input({"name": "MASK", "data_type": "TYPE_BOOL", "dims": [-1], "optional": True})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_STRING", "dims": [1]})
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        auto_complete_model_config.set_model_transaction_policy({"decoupled": True})
        return auto_complete_model_config

    def execute(self, requests):
        return []
"""


def config(extra: str = "") -> mc.ModelConfig:
    return parse_config(f'name: "x"\nbackend: "python"\n{extra}', model="x", path="config.pbtxt")


def model_file(tmp_path: Path, code: str) -> Path:
    path = tmp_path / "x" / "1" / "model.py"
    path.parent.mkdir(parents=True)
    path.write_text(textwrap.dedent(code).lstrip())
    return path


def hook_error(tmp_path: Path, code: str, extra: str = "") -> str:
    with pytest.raises(InternalError) as err:
        complete_python_config(config(extra), "x", model_file(tmp_path, code))
    return err.value.message


def test_the_hook_fills_the_config(tmp_path: Path) -> None:
    cfg = config()
    complete_python_config(cfg, "x", model_file(tmp_path, FILLING_HOOK))
    assert [(i.name, mc.DataType.Name(i.data_type), list(i.dims), i.optional) for i in cfg.input] == [
        ("INPUT0", "TYPE_FP32", [4], False),
        ("MASK", "TYPE_BOOL", [-1], True),
    ]
    assert [(o.name, mc.DataType.Name(o.data_type), list(o.dims)) for o in cfg.output] == [
        ("OUTPUT0", "TYPE_STRING", [1])
    ]
    assert cfg.max_batch_size == 8
    assert cfg.HasField("dynamic_batching")
    assert cfg.model_transaction_policy.decoupled


def test_a_hook_that_raises_fails_with_its_text(tmp_path: Path) -> None:
    code = """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config):
            raise ValueError("cannot read the weights")
    """
    message = hook_error(tmp_path, code)
    assert message.startswith("ValueError: cannot read the weights")
    assert "auto_complete_config" in message


def test_a_setter_refusal_reaches_the_load_error(tmp_path: Path) -> None:
    """The config says 16; the hook may not lower it (Triton's message, through the child)."""
    message = hook_error(tmp_path, FILLING_HOOK, "max_batch_size: 16")
    assert message.startswith(
        "ValueError: configuration specified max_batch_size 16, but in auto-complete-config function for model 'x' "
        "specified max_batch_size 8"
    )


def test_a_hook_must_return_the_model_config(tmp_path: Path) -> None:
    code = """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config):
            auto_complete_model_config.set_max_batch_size(4)
    """
    assert hook_error(tmp_path, code) == (
        "auto_complete_config function in model 'x' must return a valid pb.ModelConfig object."
    )


def test_without_the_hook_no_process_is_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a child process was started")

    monkeypatch.setattr(autocomplete.subprocess, "run", refuse)
    cfg = config("max_batch_size: 2")
    before = cfg.SerializeToString()
    code = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    complete_python_config(cfg, "x", model_file(tmp_path, code))
    complete_python_config(cfg, "x", tmp_path / "missing" / "model.py")
    assert cfg.SerializeToString() == before
