"""File names from configs and requests, confined to the directory they belong to.

One rule for every field that names a file of a model (``label_filename``, ``default_model_filename``,
``initial_state.data_file``, ``model_warmup.input_data_file``, config.pbtxt itself):

- the name is relative, not empty, without NUL bytes and without ``..`` components;
- once every symbolic link is resolved, the file lies inside its base directory (``warmup/``,
  ``initial_state/``, the model directory), and that base inside the model directory.

The model directory itself may be a symbolic link leading out of the repository: Triton follows
links in a repository and users often link model directories in from elsewhere.  What is confined is
what lies *inside* a model: its files must resolve under the model directory's resolved path, so a
linked model can't reach past where its link points.  A model file that is itself a link to
somewhere else (e.g. ``1/model.onnx -> /blobs/x``) is refused: link the model directory instead.

Model names are single path components (:func:`is_plain_name`); files sent with a load request are
written by ``repository/staging.py`` under a fresh directory, never through a link.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from serve_app.errors import InvalidArgument, ServeError

_SEPARATORS: frozenset[str] = frozenset(s for s in ("/", "\\", os.sep, os.altsep) if s is not None)


def is_plain_name(name: str) -> bool:
    """Whether ``name`` is one directory entry name: nothing that could name another directory."""
    return bool(name) and name not in (".", "..") and "\x00" not in name and not any(s in name for s in _SEPARATORS)


def confined(
    base: Path,
    relative: str,
    what: str,
    *,
    root: Path | None = None,
    within: str = "the model directory",
    error: Callable[[str], ServeError] = InvalidArgument,
) -> Path:
    """The resolved path of ``base / relative``, refused unless it stays inside ``base`` (and ``base`` inside ``root``).

    ``what`` names the field in the message (``output[0].label_filename``), ``within`` names
    ``base`` for a reader (``the model's 'warmup' directory``); ``error`` builds the error from
    the message, so a config field can raise InvalidConfig naming the model and file.  The path
    need not exist: whether it does is the caller's question.
    """
    if not relative:
        raise error(f"'{what}' is empty")
    if "\x00" in relative:
        raise error(f"{what} {relative!r} must not contain a NUL byte")
    rel = PurePosixPath(relative)
    if rel.is_absolute() or Path(relative).is_absolute() or relative.startswith("\\"):
        raise error(f"{what} '{relative}' must be a path relative to {within}")
    if ".." in rel.parts or ".." in Path(relative).parts:
        raise error(f"{what} '{relative}' must not contain '..'")
    try:
        top = (root if root is not None else base).resolve()
        inside = base.resolve()
        target = (inside / relative).resolve()
    except (OSError, RuntimeError) as exc:  # a link loop (RuntimeError before Python 3.13)
        raise error(f"{what} '{relative}' cannot be resolved: {exc}") from None
    if not inside.is_relative_to(top) or not target.is_relative_to(inside):
        raise error(f"{what} '{relative}' leads outside {within}")
    return target
