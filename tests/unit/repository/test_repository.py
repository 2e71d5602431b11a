"""The model repository: directories on disk to validated ModelSources."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from serve_app.errors import ErrorCode, InvalidArgument, InvalidConfig, NotFound, ServeError
from serve_app.repository import ModelRepository, ModelSource

FP32 = TensorProto.FLOAT

ADD_SUB = """
name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def make_onnx(
    path: Path, names: Sequence[tuple[str, str]] = (("x", "y"),), shape: Sequence[int | str] = ("b", 4)
) -> Path:
    """An ONNX model with one Identity per (input, output) name pair."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [i], [o]) for i, o in names],
        "g",
        [helper.make_tensor_value_info(i, FP32, list(shape)) for i, _ in names],
        [helper.make_tensor_value_info(o, FP32, list(shape)) for _, o in names],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A repository with add_sub (config given) and ident (config generated)."""
    repo = tmp_path / "models"
    write(repo / "add_sub" / "config.pbtxt", ADD_SUB)
    make_onnx(repo / "add_sub" / "1" / "model.onnx", [("INPUT0", "OUTPUT0"), ("INPUT1", "OUTPUT1")])
    make_onnx(repo / "ident" / "1" / "model.onnx")
    return repo


def load_error(repo: Path, name: str, error: type[ServeError] = InvalidConfig) -> str:
    with pytest.raises(error) as info:
        ModelRepository(repo).load(name)
    return str(info.value)


def test_model_names_sorted_without_hidden_or_files(root: Path) -> None:
    (root / ".hidden").mkdir()
    (root / "README.md").write_text("not a model")
    (root / "aaa").mkdir()
    assert ModelRepository(root).model_names() == ["aaa", "add_sub", "ident"]
    assert ModelRepository(str(root)).root == root


def test_missing_root(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist or is not a directory"):
        ModelRepository(tmp_path / "nope")


def test_load_with_config(root: Path) -> None:
    source = ModelRepository(root).load("add_sub")
    assert isinstance(source, ModelSource)
    assert source.name == "add_sub"
    assert source.directory == root / "add_sub"
    assert source.versions == {1: root / "add_sub" / "1" / "model.onnx"}
    config = source.config
    assert (config.platform, config.backend) == ("onnxruntime_onnx", "onnxruntime")
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert config.default_model_filename == "model.onnx"
    assert config.version_policy.latest.num_versions == 1


def test_load_without_config(root: Path) -> None:
    source = ModelRepository(root).load("ident")
    config = source.config
    assert config.name == "ident"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 4
    assert [(i.name, list(i.dims)) for i in config.input] == [("x", [4])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("y", [4])]
    assert config.HasField("dynamic_batching")


def test_config_with_empty_name_gets_directory_name(root: Path) -> None:
    write(root / "add_sub" / "config.pbtxt", ADD_SUB.replace('name: "add_sub"', ""))
    assert ModelRepository(root).load("add_sub").config.name == "add_sub"


def test_version_policy_and_highest_version_completes(root: Path) -> None:
    model = root / "multi"
    write(model / "config.pbtxt", "version_policy { all { } }")
    make_onnx(model / "1" / "model.onnx", [("old_in", "old_out")])
    make_onnx(model / "3" / "model.onnx", [("new_in", "new_out")])
    make_onnx(model / "20" / "model.onnx", [("newest_in", "newest_out")])
    (model / "0").mkdir()  # not a version
    (model / "v2").mkdir()  # not a version
    (model / "5").write_text("a file, not a version directory")
    source = ModelRepository(root).load("multi")
    assert source.versions == {v: model / str(v) / "model.onnx" for v in (1, 3, 20)}
    assert [i.name for i in source.config.input] == ["newest_in"]  # numeric order: 20 > 3


def test_default_policy_serves_latest_only(root: Path) -> None:
    make_onnx(root / "add_sub" / "2" / "model.onnx", [("INPUT0", "OUTPUT0"), ("INPUT1", "OUTPUT1")])
    assert list(ModelRepository(root).load("add_sub").versions) == [2]


def test_unserved_versions_need_no_file(root: Path) -> None:
    (root / "ident" / "7").mkdir()
    make_onnx(root / "ident" / "9" / "model.onnx")
    assert list(ModelRepository(root).load("ident").versions) == [9]


def test_served_version_missing_its_file(root: Path) -> None:
    write(root / "add_sub" / "config.pbtxt", ADD_SUB + "version_policy { all { } }")
    (root / "add_sub" / "2").mkdir()
    missing = root / "add_sub" / "2" / "model.onnx"
    message = load_error(root, "add_sub")
    assert message == f"model 'add_sub', file '{missing}': version 2: model file not found"


def test_no_version_directories(root: Path) -> None:
    write(root / "empty" / "config.pbtxt", 'platform: "onnxruntime_onnx"')
    message = load_error(root, "empty")
    assert message.startswith(f"model 'empty', file '{root / 'empty'}': no version directories")


def test_specific_policy_with_no_available_version(root: Path) -> None:
    write(root / "add_sub" / "config.pbtxt", ADD_SUB + "version_policy { specific { versions: [ 4 ] } }")
    message = load_error(root, "add_sub")
    assert "version_policy: no available version is served" in message
    assert "(available: [1])" in message


def test_custom_model_filename(root: Path) -> None:
    model = root / "custom"
    write(model / "config.pbtxt", 'default_model_filename: "net.onnx"')
    make_onnx(model / "1" / "net.onnx")
    source = ModelRepository(root).load("custom")
    assert source.versions == {1: model / "1" / "net.onnx"}
    assert source.config.platform == "onnxruntime_onnx"


def test_model_filename_cannot_escape(root: Path) -> None:
    write(root / "add_sub" / "config.pbtxt", ADD_SUB + 'default_model_filename: "../../ident/1/model.onnx"')
    assert "default_model_filename: must be a plain file name" in load_error(root, "add_sub")


def test_pytorch_model_is_not_opened(root: Path) -> None:
    model = root / "torch"
    write(
        model / "config.pbtxt",
        """
        backend: "pytorch"
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        """,
    )
    write(model / "1" / "model.pt", "opaque")
    source = ModelRepository(root).load("torch")
    assert source.config.platform == "pytorch_libtorch"
    assert source.versions == {1: model / "1" / "model.pt"}


def test_platform_found_by_file_name(root: Path) -> None:
    write(root / "plan" / "1" / "model.plan", "opaque")
    source = ModelRepository(root).load("plan")
    assert (source.config.platform, source.config.backend) == ("tensorrt_plan", "tensorrt")


def test_a_model_py_completes_to_the_python_backend(root: Path) -> None:
    """As Triton's core does: a version directory holding model.py, with no config or one without a backend."""
    write(root / "py_only" / "1" / "model.py", "class TritonPythonModel:\n    pass\n")
    write(root / "py_cfg" / "1" / "model.py", "class TritonPythonModel:\n    pass\n")
    write(root / "py_cfg" / "config.pbtxt", ADD_SUB.replace('name: "add_sub"\nplatform: "onnxruntime_onnx"\n', ""))
    repository = ModelRepository(root)
    for name in ("py_only", "py_cfg"):
        source = repository.load(name)
        assert (source.config.platform, source.config.backend) == ("", "python")
        assert source.config.default_model_filename == "model.py"
        assert source.versions == {1: root / name / "1" / "model.py"}
    assert [i.name for i in repository.load("py_cfg").config.input] == ["INPUT0", "INPUT1"]


def test_no_platform_and_no_known_file(root: Path) -> None:
    write(root / "what" / "1" / "model.bin", "opaque")
    message = load_error(root, "what")
    assert message.startswith(f"model 'what', file '{root / 'what' / '1'}': platform: ")
    assert "model.onnx, model.pt, model.plan" in message


def test_unsupported_backend(root: Path) -> None:
    write(root / "tf" / "config.pbtxt", 'backend: "tensorflow"')
    write(root / "tf" / "1" / "model.savedmodel", "")
    message = load_error(root, "tf")
    assert message.startswith(f"model 'tf', file '{root / 'tf' / 'config.pbtxt'}': backend: unsupported backend")


def test_ensemble_versions_are_directories(root: Path) -> None:
    write(
        root / "ens" / "config.pbtxt",
        """
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [ { model_name: "ident" model_version: -1
          input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } } ] }
        """,
    )
    (root / "ens" / "1").mkdir()
    source = ModelRepository(root).load("ens")
    assert source.versions == {1: root / "ens" / "1"}
    assert source.config.default_model_filename == ""


def test_parse_error_names_the_file(root: Path) -> None:
    write(root / "add_sub" / "config.pbtxt", ADD_SUB + "bogus: 1\n")
    message = load_error(root, "add_sub")
    assert message.startswith(f"model 'add_sub', file '{root / 'add_sub' / 'config.pbtxt'}': 9:1 : ")


def test_config_not_utf8(root: Path) -> None:
    (root / "add_sub" / "config.pbtxt").write_bytes(b'name: "\xff"')
    assert "not UTF-8 text" in load_error(root, "add_sub")


def test_validation_error_names_the_file(root: Path) -> None:
    write(root / "add_sub" / "config.pbtxt", ADD_SUB.replace("dims: [ 4 ] }", "dims: [ 0 ] }", 1))
    message = load_error(root, "add_sub")
    assert message.startswith(f"model 'add_sub', file '{root / 'add_sub' / 'config.pbtxt'}': input[0].dims: ")


def test_name_mismatch(root: Path) -> None:
    write(root / "add_sub" / "config.pbtxt", ADD_SUB.replace('"add_sub"', '"other"'))
    assert "name: must match the model directory name 'add_sub' (got 'other')" in load_error(root, "add_sub")


def test_generated_config_errors_name_the_model_file(root: Path) -> None:
    model_file = make_onnx(root / "scalar" / "1" / "model.onnx", shape=[])  # scalar, no batching
    message = load_error(root, "scalar")
    assert message.startswith(f"model 'scalar', file '{model_file}': input[0].reshape: ")


def test_unknown_model(root: Path) -> None:
    message = load_error(root, "nope", NotFound)
    assert "model 'nope'" in message
    assert "failed to poll from model repository" in message


def test_hidden_directory_is_not_a_model(root: Path) -> None:
    make_onnx(root / ".hidden" / "1" / "model.onnx")
    load_error(root, ".hidden", NotFound)


@pytest.mark.parametrize("name", ["", ".", "..", "../models", "a/b", "/etc", "a\\b", "a\x00b"])
def test_names_must_stay_inside_the_root(root: Path, name: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid model name") as info:
        ModelRepository(root).load(name)
    assert info.value.code is ErrorCode.INVALID_ARG


def test_load_all_isolates_failures(root: Path) -> None:
    write(root / "broken" / "config.pbtxt", "bogus: 1")
    results = ModelRepository(root).load_all()
    assert list(results) == ["add_sub", "broken", "ident"]
    assert isinstance(results["add_sub"], ModelSource)
    assert isinstance(results["ident"], ModelSource)
    assert isinstance(results["broken"], InvalidConfig)
    assert "model 'broken'" in str(results["broken"])


def test_model_source_pickles(root: Path) -> None:
    source = ModelRepository(root).load("add_sub")
    clone = pickle.loads(pickle.dumps(source))
    assert clone.config == source.config
    assert clone.versions == source.versions


def test_strict_model_config_completes_no_inputs_or_outputs(root: Path) -> None:
    """Triton's --strict-model-config: the model file is not read for the config; its platform still is."""
    strict = ModelRepository(root, complete=False)
    source = strict.load("add_sub")
    assert [i.name for i in source.config.input] == ["INPUT0", "INPUT1"]
    assert source.config.backend == "onnxruntime"
    ident = strict.load("ident").config
    assert (ident.platform, len(ident.input), len(ident.output), ident.max_batch_size) == ("onnxruntime_onnx", 0, 0, 0)
    assert [i.name for i in ModelRepository(root).load("ident").config.input] == ["x"]


# -- --model-config-name ----------------------------------------------------------------------------------------
def test_a_config_name_picks_the_models_alternate_config_where_it_exists(root: Path) -> None:
    write(root / "add_sub" / "configs" / "small.pbtxt", ADD_SUB.replace("max_batch_size: 8", "max_batch_size: 2"))
    repo = ModelRepository(root, "small")
    assert repo.load("add_sub").config.max_batch_size == 2
    assert repo.config_file(root / "add_sub") == "configs/small.pbtxt"
    assert repo.load("ident").config.max_batch_size == 4  # no configs/small.pbtxt: generated as before
    assert ModelRepository(root).load("add_sub").config.max_batch_size == 8  # without a name: config.pbtxt
    assert ModelRepository(root, "other").load("add_sub").config.max_batch_size == 8  # no such file: config.pbtxt


def test_errors_in_an_alternate_config_name_its_file(root: Path) -> None:
    write(root / "add_sub" / "configs" / "broken.pbtxt", "max_batch_size: -1")
    with pytest.raises(InvalidConfig) as info:
        ModelRepository(root, "broken").load("add_sub")
    assert "configs/broken.pbtxt" in str(info.value)


@pytest.mark.parametrize("bad", ["../x", "a/b", ".hidden", ".."])
def test_a_config_name_must_be_a_plain_file_name(root: Path, bad: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid model config name"):
        ModelRepository(root, bad)
