"""Paths can't leave the model repository: the shared helper and every field that names a file of a model."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper

from serve_app.errors import InvalidArgument, InvalidConfig, ServeError
from serve_app.protos import model_config_pb2 as mc
from serve_app.repository import ModelRepository, ModelSource
from serve_app.repository.repository import validate_model_name
from serve_app.repository.staging import stage_files
from serve_app.runtime.warmup import warmup_file
from serve_app.security.paths import confined, is_plain_name
from serve_app.sequence.implicit_state import ImplicitState

# The ways out that every field must refuse: (value, what the message says).
ESCAPES = [
    ("../secret", "must not contain '..'"),
    ("sub/../../secret", "must not contain '..'"),
    ("/etc/passwd", "must be a path relative to"),
    ("a\x00b", "must not contain a NUL byte"),
    ("link_out", "leads outside"),
    ("dir_link_out/secret", "leads outside"),
]

CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def make_onnx(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


def plant_escapes(directory: Path, outside: Path) -> None:
    """``directory/link_out`` -> a file outside, ``directory/dir_link_out`` -> the outside directory."""
    directory.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "secret").write_text("secret\n")
    os.symlink(outside / "secret", directory / "link_out")
    os.symlink(outside, directory / "dir_link_out")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with model ``m`` (config and model file) and a directory ``outside`` next to it."""
    root = tmp_path / "models"
    (root / "m").mkdir(parents=True)
    (root / "m" / "config.pbtxt").write_text(CONFIG)
    make_onnx(root / "m" / "1" / "model.onnx")
    plant_escapes(root / "m", tmp_path / "outside")
    return root


def load(root: Path, name: str = "m", override: str | None = None) -> ModelSource:
    config = text_format.Parse(override, mc.ModelConfig()) if override is not None else None
    return ModelRepository(root).load(name, config_override=config)


# -------------------------------------------------------------------------------------------- confined


def test_confined_returns_the_resolved_path_inside(tmp_path: Path) -> None:
    (tmp_path / "m" / "sub").mkdir(parents=True)
    (tmp_path / "m" / "sub" / "f").write_text("x")
    os.symlink(tmp_path / "m" / "sub" / "f", tmp_path / "m" / "inner")  # a link that stays inside is fine
    base = tmp_path / "m"
    assert confined(base, "sub/f", "f") == (base / "sub" / "f").resolve()
    assert confined(base, "./sub/f", "f") == (base / "sub" / "f").resolve()
    assert confined(base, "inner", "f") == (base / "sub" / "f").resolve()
    assert confined(base, "missing", "f") == (base / "missing").resolve()  # existence is the caller's question


@pytest.mark.parametrize(("value", "message"), [*ESCAPES, ("", "'f' is empty"), ("loop", "cannot be resolved")])
def test_confined_refuses(tmp_path: Path, value: str, message: str) -> None:
    base = tmp_path / "m"
    plant_escapes(base, tmp_path / "outside")
    os.symlink(base / "loop", base / "loop")
    with pytest.raises(InvalidArgument) as err:
        confined(base, value, "f")
    assert message in err.value.message
    assert err.value.message.startswith("f ") or err.value.message.startswith("'f'")


def test_confined_error_builder_and_within_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match=r"^model 'm': out\.f '\.\./x' must not contain '\.\.'$"):
        confined(tmp_path, "../x", "out.f", error=lambda detail: InvalidConfig(f"model 'm': {detail}"))
    with pytest.raises(InvalidArgument, match="must be a path relative to the 'warmup' directory"):
        confined(tmp_path, "/x", "f", within="the 'warmup' directory")


def test_confined_base_must_stay_inside_root(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f").write_text("x")
    os.symlink(tmp_path / "elsewhere", model / "warmup")  # warmup/ itself links out of the model
    with pytest.raises(InvalidArgument, match="leads outside"):
        confined(model / "warmup", "f", "input_data_file", root=model)
    assert confined(model / "warmup", "f", "input_data_file") == (tmp_path / "elsewhere" / "f").resolve()


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "/etc", "a\\b", "a\x00b"])
def test_model_names_are_plain(name: str) -> None:
    assert not is_plain_name(name)
    with pytest.raises(InvalidArgument, match="invalid model name"):
        validate_model_name(name)


@pytest.mark.parametrize("name", ["m", "...", ".hidden", "model-1.v2", "ünïcode"])
def test_plain_names(name: str) -> None:
    assert is_plain_name(name)


# ------------------------------------------------------------------------------ repository: model dirs


def test_repository_api_names_cannot_leave(repo: Path) -> None:
    r = ModelRepository(repo)
    for name in ("../models", "..", "m/1", "/etc", "m\x00"):
        with pytest.raises(InvalidArgument, match="invalid model name"):
            r.load(name)
        assert not r.has_model(name)


def test_model_directory_may_be_a_link_out_of_the_repository(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "real_m"
    elsewhere.mkdir(parents=True)
    (elsewhere / "config.pbtxt").write_text(CONFIG.replace('"m"', '"linked"'))
    make_onnx(elsewhere / "1" / "model.onnx")
    (elsewhere / "labels.txt").write_text("a\nb\n")
    root = tmp_path / "models"
    root.mkdir()
    os.symlink(elsewhere, root / "linked")
    source = ModelRepository(root).load("linked")
    assert source.versions == {1: root / "linked" / "1" / "model.onnx"}
    # inside a linked model, files are confined to where the link points
    (tmp_path / "elsewhere" / "sibling.txt").write_text("x\n")
    override = CONFIG.replace('"m"', '"linked"')
    os.symlink(tmp_path / "elsewhere" / "sibling.txt", elsewhere / "sibling_link")
    with pytest.raises(InvalidConfig, match=r"label_filename 'sibling_link' leads outside the model directory"):
        load(root, "linked", override.replace('name: "y"', 'name: "y" label_filename: "sibling_link"'))
    source = load(root, "linked", override.replace('name: "y"', 'name: "y" label_filename: "labels.txt"'))
    assert source.labels == {"y": ("a", "b")}


# ---------------------------------------------------------------------------- label_filename (classification)


@pytest.mark.parametrize(("value", "message"), ESCAPES)
def test_label_filename_is_confined(repo: Path, value: str, message: str) -> None:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    config.output[0].label_filename = value
    with pytest.raises(InvalidConfig) as err:
        ModelRepository(repo).load("m", config_override=config)
    assert "model 'm'" in err.value.message and "output[0].label_filename" in err.value.message
    assert message in err.value.message


def test_label_filename_inside_is_read(repo: Path) -> None:
    (repo / "m" / "labels").mkdir()
    (repo / "m" / "labels" / "l.txt").write_text("cat\ndog\n")
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    config.output[0].label_filename = "labels/l.txt"
    assert ModelRepository(repo).load("m", config_override=config).labels == {"y": ("cat", "dog")}


# ----------------------------------------------------------------------- default_model_filename / model file


@pytest.mark.parametrize("value", ["../../outside/secret", "/etc/passwd", "a/b", "..", "a\x00b"])
def test_default_model_filename_must_be_a_plain_name(repo: Path, value: str) -> None:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    config.default_model_filename = value
    with pytest.raises(InvalidConfig, match="default_model_filename"):
        ModelRepository(repo).load("m", config_override=config)


def test_model_file_linking_out_of_the_model_is_refused(repo: Path, tmp_path: Path) -> None:
    make_onnx(tmp_path / "outside" / "real.onnx")
    os.symlink(tmp_path / "outside" / "real.onnx", repo / "m" / "1" / "linked.onnx")
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    config.default_model_filename = "linked.onnx"
    with pytest.raises(InvalidConfig) as err:
        ModelRepository(repo).load("m", config_override=config)
    msg = err.value.message
    assert "version 1: model file (default_model_filename) '1/linked.onnx' leads outside the model directory" in msg


def test_version_directory_linking_out_is_refused(repo: Path, tmp_path: Path) -> None:
    make_onnx(tmp_path / "outside" / "v2" / "model.onnx")
    os.symlink(tmp_path / "outside" / "v2", repo / "m" / "2")
    with pytest.raises(InvalidConfig, match=r"version 2: model file '2/model\.onnx' leads outside"):
        load(repo)


def test_model_file_linking_inside_the_model_is_fine(repo: Path) -> None:
    (repo / "m" / "2").mkdir()
    os.symlink(repo / "m" / "1" / "model.onnx", repo / "m" / "2" / "model.onnx")
    config = text_format.Parse(CONFIG + "version_policy: { all {} }", mc.ModelConfig())
    assert sorted(ModelRepository(repo).load("m", config_override=config).versions) == [1, 2]


def test_config_pbtxt_linking_out_is_refused(repo: Path, tmp_path: Path) -> None:
    (tmp_path / "outside" / "config.pbtxt").write_text(CONFIG)
    (repo / "m" / "config.pbtxt").unlink()
    os.symlink(tmp_path / "outside" / "config.pbtxt", repo / "m" / "config.pbtxt")
    with pytest.raises(InvalidConfig, match=r"config\.pbtxt 'config\.pbtxt' leads outside the model directory"):
        load(repo)


# -------------------------------------------------------------------------- initial_state data_file


def implicit_state(model_dir: Path, data_file: str) -> ImplicitState:
    cfg = text_format.Parse(
        'name: "m" max_batch_size: 4 sequence_batching { state [ { input_name: "S_IN" output_name: "S_OUT" '
        'data_type: TYPE_INT32 dims: [ 1 ] initial_state: { name: "i" data_type: TYPE_INT32 dims: [ 1 ] '
        'data_file: "PLACEHOLDER" } } ] }',
        mc.ModelConfig(),
    )
    cfg.sequence_batching.state[0].initial_state[0].data_file = data_file
    return ImplicitState(cfg, model_dir)


@pytest.mark.parametrize(("value", "message"), ESCAPES)
def test_data_file_is_confined(tmp_path: Path, value: str, message: str) -> None:
    model = tmp_path / "m"
    plant_escapes(model / "initial_state", tmp_path / "outside")
    (tmp_path / "outside" / "secret").write_bytes(b"\0" * 4)  # the right size: refused all the same
    with pytest.raises(InvalidConfig) as err:
        implicit_state(model, value)
    assert err.value.message.startswith("model 'm': sequence_batching.state[0].initial_state[0].data_file")
    assert message in err.value.message


def test_data_file_initial_state_dir_linking_out_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "init.bin").write_bytes(b"\0" * 4)
    os.symlink(tmp_path / "outside", model / "initial_state")
    with pytest.raises(InvalidConfig, match="leads outside the model's 'initial_state' directory"):
        implicit_state(model, "init.bin")


def test_data_file_inside_is_read(tmp_path: Path) -> None:
    (tmp_path / "m" / "initial_state").mkdir(parents=True)
    (tmp_path / "m" / "initial_state" / "init.bin").write_bytes((7).to_bytes(4, "little"))
    assert implicit_state(tmp_path / "m", "init.bin").specs[0].initial.tolist() == [7]


# ----------------------------------------------------------------------------- warmup input_data_file


@pytest.mark.parametrize(("value", "message"), ESCAPES)
def test_input_data_file_is_confined(tmp_path: Path, value: str, message: str) -> None:
    model = tmp_path / "m"
    plant_escapes(model / "warmup", tmp_path / "outside")
    with pytest.raises(InvalidArgument) as err:
        warmup_file(model, value)
    assert err.value.message.startswith("input_data_file") and message in err.value.message


def test_input_data_file_warmup_dir_linking_out_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "x.bin").write_bytes(b"\0")
    os.symlink(tmp_path / "outside", model / "warmup")
    with pytest.raises(InvalidArgument, match="leads outside the model's 'warmup' directory"):
        warmup_file(model, "x.bin")


# ------------------------------------------------------------------------ staged files of a load request


def planting_mkdtemp(plant: Callable[[Path], None]) -> Callable[..., str]:
    """``tempfile.mkdtemp`` that plants something in the new directory: a race won by an attacker."""
    import tempfile

    real = tempfile.mkdtemp

    def mkdtemp(*args: object, **kwargs: object) -> str:
        directory = real(*args, **kwargs)  # type: ignore[call-overload]
        plant(Path(directory))
        return directory

    return mkdtemp


@pytest.mark.parametrize(
    ("planted", "files"),
    [
        ("dir", {"1/model.onnx": b"evil"}),  # 1 -> outside: the file would land outside
        ("file", {"1/model.onnx": b"evil"}),  # 1/model.onnx -> outside/victim: the write would follow it
        ("deep", {"1/a/b/model.onnx": b"evil"}),  # 1/a -> outside
    ],
)
def test_staging_never_writes_through_a_planted_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: str, files: dict[str, bytes]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"original")

    def plant(directory: Path) -> None:
        if planted == "dir":
            os.symlink(outside, directory / "1")
        elif planted == "file":
            (directory / "1").mkdir()
            os.symlink(outside / "victim", directory / "1" / "model.onnx")
        else:
            (directory / "1").mkdir()
            os.symlink(outside, directory / "1" / "a")

    monkeypatch.setattr("serve_app.repository.staging.tempfile.mkdtemp", planting_mkdtemp(plant))
    root = tmp_path / "staging"
    with pytest.raises(ServeError) as err:
        stage_files(files, root, "m")
    assert isinstance(err.value, InvalidArgument) and "Invalid file parameter" in err.value.message
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_bytes() == b"original"
    assert not any(root.iterdir())  # the half-written directory is removed
