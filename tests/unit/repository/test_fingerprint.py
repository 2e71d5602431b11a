"""model_fingerprint: what counts as a change of a model directory, without reading model bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serve_app.repository.fingerprint import MISSING, model_fingerprint


@pytest.fixture
def model(tmp_path: Path) -> Path:
    d = tmp_path / "m"
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text('name: "m"')
    (d / "1" / "model.onnx").write_bytes(b"weights")
    return d


def test_stable_when_nothing_changes(model: Path) -> None:
    assert model_fingerprint(model) == model_fingerprint(model)
    assert len(model_fingerprint(model)) == 64


def test_missing_directory(tmp_path: Path) -> None:
    assert model_fingerprint(tmp_path / "nope") == MISSING
    (tmp_path / "file").write_text("x")
    assert model_fingerprint(tmp_path / "file") == MISSING


def test_new_version_directory(model: Path) -> None:
    before = model_fingerprint(model)
    (model / "2").mkdir()  # an empty directory is a version of an ensemble
    assert model_fingerprint(model) != before


def test_removed_version(model: Path) -> None:
    (model / "2").mkdir()
    (model / "2" / "model.onnx").write_bytes(b"v2")
    before = model_fingerprint(model)
    (model / "2" / "model.onnx").unlink()
    (model / "2").rmdir()
    assert model_fingerprint(model) != before


def test_edited_config(model: Path) -> None:
    before = model_fingerprint(model)
    (model / "config.pbtxt").write_text('name: "m"\nmax_batch_size: 4')
    assert model_fingerprint(model) != before


def test_replaced_file_same_size_older_mtime(model: Path) -> None:
    """Triton's 'newest mtime grew' misses this; the fingerprint does not."""
    path = model / "1" / "model.onnx"
    st = path.stat()
    before = model_fingerprint(model)
    path.write_bytes(b"WEIGHTS")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))
    assert model_fingerprint(model) != before


def test_content_is_not_read(model: Path) -> None:
    """Same size and mtime: the same fingerprint, whatever the bytes (cheap by design)."""
    path = model / "1" / "model.onnx"
    st = path.stat()
    before = model_fingerprint(model)
    path.write_bytes(b"WEIGHTS")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert model_fingerprint(model) == before


def test_hidden_entries_are_ignored(model: Path) -> None:
    before = model_fingerprint(model)
    (model / ".config.pbtxt.swp").write_text("editor")
    (model / ".git").mkdir()
    (model / ".git" / "HEAD").write_text("ref")
    (model / "1" / ".tmp").write_text("x")
    assert model_fingerprint(model) == before


def test_renamed_file(model: Path) -> None:
    before = model_fingerprint(model)
    (model / "1" / "model.onnx").rename(model / "1" / "model.plan")
    assert model_fingerprint(model) != before


def test_symlinks_are_followed_without_looping(model: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "store"
    elsewhere.mkdir()
    (elsewhere / "model.onnx").write_bytes(b"v2")
    (model / "2").symlink_to(elsewhere, target_is_directory=True)
    (model / "1" / "loop").symlink_to(model, target_is_directory=True)
    before = model_fingerprint(model)
    (elsewhere / "model.onnx").write_bytes(b"v2 bigger")
    assert model_fingerprint(model) != before


def test_dangling_link_is_hashed_not_fatal(model: Path) -> None:
    (model / "1" / "gone").symlink_to(model / "nowhere")
    assert len(model_fingerprint(model)) == 64
