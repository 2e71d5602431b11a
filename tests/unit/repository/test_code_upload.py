"""Loads that bring code the server would run: refused by default, naming the flag; allowed with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serve_app.errors import InvalidArgument
from serve_app.repository import ModelRepository
from serve_app.repository.code_upload import ALLOW_FLAG, code_in_load
from serve_app.repository.model_control import ControlMode, ModelControl
from serve_app.settings import ServerSettings
from tests.unit.repository.test_model_control import add_model, config_json

PYTHON = json.dumps({"backend": "python", "input": [], "output": []})


def onnx_with(**parameters: str) -> str:
    config = json.loads(config_json())
    config["parameters"] = {k: {"string_value": v} for k, v in parameters.items()}
    return json.dumps(config)


TRT_PLUGIN = json.dumps(
    {
        **json.loads(config_json()),
        "optimization": {
            "execution_accelerators": {
                "gpu_execution_accelerator": [
                    {"name": "tensorrt", "parameters": {"trt_extra_plugin_lib_paths": "/tmp/libplugin.so"}}
                ]
            }
        },
    }
)

# (config, files, what the refusal names)
CODE = [
    (PYTHON, {"1/model.py": b"import os"}, "Python model"),
    (PYTHON, {"1/weights.bin": b"..."}, "Python model"),  # default_model_filename may name any of its files
    (config_json(), {"1/model.onnx": b"x", "1/helper.py": b""}, "'file:1/helper.py'"),
    (config_json(), {"1/model.onnx": b"x", "requirements.txt": b"evil"}, "'file:requirements.txt'"),
    (config_json(), {"1/model.onnx": b"x", "1/libop.so": b""}, "'file:1/libop.so'"),
    (config_json(), {"1/model.onnx": b"x", "1/libop.so.2": b""}, "'file:1/libop.so.2'"),
    (config_json(), {"1/model.onnx": b"x", "env/x.PTH": b""}, "'file:env/x.PTH'"),
    (onnx_with(EXECUTION_ENV_PATH="/tmp/env"), {}, "EXECUTION_ENV_PATH"),
    (TRT_PLUGIN, {}, "trt_extra_plugin_lib_paths"),
]


def control(root: Path, staging: Path, allow: bool = False) -> ModelControl:
    return ModelControl(ModelRepository(root), ControlMode.EXPLICIT, staging_root=staging, allow_code_upload=allow)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    add_model(tmp_path / "models", "a")
    return tmp_path / "models"


@pytest.mark.parametrize(("config", "files", "names"), CODE)
def test_a_load_bringing_code_is_refused_naming_the_flag(
    root: Path, tmp_path: Path, config: str, files: dict[str, bytes], names: str
) -> None:
    staging = tmp_path / "staging"
    with pytest.raises(InvalidArgument) as err:
        control(root, staging).prepare_load("a", config, files)
    assert ALLOW_FLAG in err.value.message and names in err.value.message, err.value.message
    assert "failed to load 'a'" in err.value.message
    assert not staging.exists()  # refused before anything was written


def test_model_files_that_backends_only_read_stay_allowed(root: Path, tmp_path: Path) -> None:
    files = {"1/model.onnx": b"x", "labels.txt": b"cat\n", "1/model.pt": b"", "1/model.plan": b""}
    plan = control(root, tmp_path / "staging").prepare_load("a", config_json(), files)
    assert (plan.sources["a"].directory / "labels.txt").read_bytes() == b"cat\n"
    assert code_in_load(None, []) is None


def test_the_flag_allows_them(root: Path, tmp_path: Path) -> None:
    ctl = control(root, tmp_path / "staging", allow=True)
    plan = ctl.prepare_load("a", config_json(), {"1/model.onnx": b"x", "requirements.txt": b"numpy\n"})
    assert (plan.sources["a"].directory / "requirements.txt").exists()
    ctl.loaded("a", plan.sources["a"])
    assert ctl.prepare_load("a", onnx_with(EXECUTION_ENV_PATH="/tmp/env")).sources


def test_the_flag_is_a_setting_off_by_default() -> None:
    assert ServerSettings(model_repository="/m").allow_model_code_upload is False
    assert ServerSettings.from_args({"model_repository": "/m", "allow_model_code_upload": "on"}).allow_model_code_upload
    from serve_app.cli import build_parser

    assert build_parser().parse_args(["--model-repository", "/m", ALLOW_FLAG]).allow_model_code_upload is True
