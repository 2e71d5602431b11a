"""Writing a load request's files into a fresh directory they cannot leave.

Triton's load API takes ``file:<path>`` parameters (``file:1/model.onnx``) and
writes them under a temporary model directory, refusing any path whose
normalized form leaves it.  We refuse such paths before writing anything, and
more strictly: no absolute paths, no ``..``, ``.`` or empty components, no
backslashes (a Windows separator on one side is a file name on the other) and
no NUL bytes.  Every directory and file is created new inside a directory
nobody else has seen (``mkdtemp``: mode 0700), without following links: each
component is created and opened relative to its parent's open descriptor with
``O_NOFOLLOW``, so a link planted meanwhile fails the write instead of being
followed out of the directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from serve_app.errors import InternalError, InvalidArgument
from serve_app.repository.repository import validate_model_name

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW
MAX_PATH_BYTES = 4096  # Linux's PATH_MAX: a longer path can't be opened by its name
MAX_PATH_DEPTH = 64  # directories a file may lie under: a deeper tree is no model's, and walking it (to read or
# delete it) recurses once per level
_SHOWN = 200  # characters of a refused path that its error repeats


def shown(path: object) -> str:
    """A path as an error message repeats it: cut after a few hundred characters."""
    text = str(path)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def staged_path(path: str) -> PurePosixPath:
    """``path`` as a relative path inside the model directory, or InvalidArgument saying why it is not one."""

    def refuse(why: str, rule: str = "; it must stay within model directory") -> InvalidArgument:
        return InvalidArgument(f"Invalid file parameter 'file:{shown(path)}': {why}{rule}")

    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise refuse(f"the path is longer than {MAX_PATH_BYTES} bytes", "")
    if path.count("/") >= MAX_PATH_DEPTH:
        raise refuse(f"the path is more than {MAX_PATH_DEPTH} directories deep", "")
    if not path:
        raise refuse("the path is empty")
    if "\x00" in path:
        raise refuse("the path contains a NUL byte")
    if "\\" in path:
        raise refuse("the path contains a backslash")
    if path.startswith("/"):
        raise refuse("the path is absolute")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise refuse("the path has an empty, '.' or '..' component")
    return PurePosixPath(*parts)


def stage_files(files: Mapping[str, bytes], root: Path, model: str) -> Path:
    """Write ``files`` (relative path -> content) under a new directory ``root/<model>-<random>``; return it.

    Every path is checked before anything is written; if writing fails the
    directory is removed again.
    """
    validate_model_name(model)
    paths = {staged_path(path): bytes(content) for path, content in files.items()}
    _check_no_file_is_a_directory(paths)
    root.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=f"{model}-", dir=root)).resolve()
    try:
        for rel, content in paths.items():
            try:
                _write(directory, rel, content)
            except OSError as exc:  # e.g. a path component longer than the file system allows
                raise InternalError(
                    f"failed to load '{model}', failed to poll from model repository: Invalid file parameter "
                    f"'file:{shown(rel)}': {exc.strerror or exc}"
                ) from None
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


def remove_staged(directory: Path, root: Path) -> None:
    """Delete a directory :func:`stage_files` made under ``root``; anything else is left alone."""
    directory, root = Path(directory), Path(root)
    try:
        inside = directory.resolve().parent == root.resolve()
    except OSError:
        return
    if inside and directory.is_dir() and not directory.is_symlink():
        shutil.rmtree(directory, ignore_errors=True)


def _check_no_file_is_a_directory(paths: Mapping[PurePosixPath, bytes]) -> None:
    """``1`` and ``1/model.onnx`` can't both be files (Triton: 'directory has been created as a file')."""
    for rel in paths:
        for parent in rel.parents:
            if parent != PurePosixPath(".") and parent in paths:
                raise InvalidArgument(
                    f"Invalid file parameter 'file:{shown(rel)}', directory '{shown(parent)}' has been given as a file"
                )


def _write(directory: Path, rel: PurePosixPath, content: bytes) -> None:
    """Create ``rel``'s parent directories and the file itself, all new, none through a link."""

    def refuse(why: str) -> InvalidArgument:
        return InvalidArgument(f"Invalid file parameter 'file:{shown(rel)}': {why}")

    fd = os.open(directory, _DIR_FLAGS)
    try:
        for part in rel.parts[:-1]:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass  # made for an earlier file of this request (or planted: opening it below says which)
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError:  # a link (ELOOP with O_NOFOLLOW) or a file (ENOTDIR)
                raise refuse(f"'{part}' is not a directory") from None
            os.close(fd)
            fd = child
        try:
            out = os.open(rel.parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644, dir_fd=fd)
        except FileExistsError:
            raise refuse("it already exists; it must stay within model directory") from None
        with os.fdopen(out, "wb") as f:
            f.write(content)
    finally:
        os.close(fd)
