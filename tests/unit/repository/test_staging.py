"""stage_files: a load request's files land in a fresh directory and nowhere else."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from serve_app.errors import InternalError, InvalidArgument
from serve_app.repository.staging import remove_staged, stage_files, staged_path


def test_writes_files_under_a_fresh_directory(tmp_path: Path) -> None:
    root = tmp_path / "staging"
    files = {"1/model.onnx": b"one", "2/model.onnx": b"two", "labels.txt": b"a\nb\n", "1/sub/dir/x.bin": b""}
    first = stage_files(files, root, "m")
    second = stage_files(files, root, "m")
    assert first != second
    for directory in (first, second):
        assert directory.parent == root.resolve()
        assert directory.name.startswith("m-")
        assert (directory / "1" / "model.onnx").read_bytes() == b"one"
        assert (directory / "2" / "model.onnx").read_bytes() == b"two"
        assert (directory / "labels.txt").read_bytes() == b"a\nb\n"
        assert (directory / "1" / "sub" / "dir" / "x.bin").read_bytes() == b""


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("../escape", "'..'"),
        ("1/../../escape", "'..'"),
        ("1/../model.onnx", "'..'"),
        ("..", "'..'"),
        ("./1/model.onnx", "'.'"),
        ("1//model.onnx", "empty"),
        ("1/", "empty"),
        ("1\\..\\..\\escape", "backslash"),
        ("1/model\x00.onnx", "NUL"),
    ],
)
def test_paths_that_could_leave_are_refused(tmp_path: Path, path: str, why: str) -> None:
    root = tmp_path / "staging"
    with pytest.raises(InvalidArgument, match="must stay within model directory") as info:
        stage_files({"1/model.onnx": b"ok", path: b"evil"}, root, "m")
    assert why in str(info.value)
    assert f"'file:{path}'" in str(info.value)
    # checked before anything is written: no directory at all
    assert not root.exists() or not any(root.iterdir())
    assert not (tmp_path / "escape").exists()


def test_staged_path() -> None:
    assert staged_path("1/model.onnx") == PurePosixPath("1", "model.onnx")
    assert staged_path("...") == PurePosixPath("...")  # a plain (odd) file name
    assert staged_path(".hidden") == PurePosixPath(".hidden")


def test_a_file_cannot_also_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="directory '1' has been given as a file"):
        stage_files({"1": b"file", "1/model.onnx": b"x"}, tmp_path / "staging", "m")
    assert not (tmp_path / "staging").exists()


@pytest.mark.parametrize("model", ["", "..", "a/b", "../x", "a\\b"])
def test_model_name_cannot_steer_the_directory(tmp_path: Path, model: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid model name"):
        stage_files({"1/model.onnx": b"x"}, tmp_path / "staging", model)


def test_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import serve_app.repository.staging as staging

    calls = {"n": 0}
    real = staging._write

    def flaky(directory: Path, rel: PurePosixPath, content: bytes) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        real(directory, rel, content)

    monkeypatch.setattr(staging, "_write", flaky)
    root = tmp_path / "staging"
    with pytest.raises(InternalError, match="disk full"):
        stage_files({"1/a": b"x", "1/b": b"y"}, root, "m")
    assert list(root.iterdir()) == []


def test_remove_staged_only_removes_staged_directories(tmp_path: Path) -> None:
    root = tmp_path / "staging"
    directory = stage_files({"1/model.onnx": b"x"}, root, "m")
    other = tmp_path / "keep"
    other.mkdir()
    remove_staged(other, root)
    remove_staged(root, root)
    assert other.exists() and root.exists()
    remove_staged(directory, root)
    assert not directory.exists()
    remove_staged(directory, root)  # already gone: fine


def test_a_path_the_file_system_refuses_fails_with_tritons_words(tmp_path: Path) -> None:
    """A component longer than NAME_MAX: Triton's 'failed to load ... failed to poll' (no OSError text leaks)."""
    with pytest.raises(InternalError) as info:
        stage_files({"1/" + "x" * 300: b"data"}, tmp_path / "staging", "m")
    assert info.value.message.startswith("failed to load 'm', failed to poll from model repository: ")
    assert list((tmp_path / "staging").iterdir()) == []


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("1/" + "d/" * 100 + "model.onnx", "more than 64 directories deep"),
        ("1/" + "d/" * 3000 + "model.onnx", "longer than 4096 bytes"),
        ("1/" + "d" * 200 + "/" + "e" * 200 + "/" + "f" * 4000, "longer than 4096 bytes"),
    ],
    ids=["deep", "long-and-deep", "long"],
)
def test_a_path_too_long_or_too_deep_is_refused_before_anything_is_written(tmp_path: Path, path: str, why: str) -> None:
    """Written, such a tree couldn't be deleted again (deleting it recurses once per level)."""
    with pytest.raises(InvalidArgument) as info:
        stage_files({path: b"data"}, tmp_path / "staging", "m")
    assert why in info.value.message
    assert len(info.value.message) < 400  # the path is cut in the message
    assert not (tmp_path / "staging").exists()


def test_a_path_64_directories_deep_is_staged_and_removed(tmp_path: Path) -> None:
    root = tmp_path / "staging"
    directory = stage_files({"d/" * 63 + "x.bin": b"x"}, root, "m")
    assert (directory / ("d/" * 63 + "x.bin")).read_bytes() == b"x"
    remove_staged(directory, root)
    assert not directory.exists()
