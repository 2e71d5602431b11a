"""A Triton model repository on local disk.

Layout, as in Triton::

    <root>/<model>/config.pbtxt               optional; generated when missing
    <root>/<model>/<version>/<model file>     version: a positive integer

Anything else in a model directory is ignored, as are hidden directories.
A model directory may be a symbolic link (as in Triton); every file read for a
model (config.pbtxt, model files, label files) must resolve inside the model
directory's resolved path (``serve_app.security.paths``).
Loading a model reads its config, completes and validates it, and picks the
served versions; nothing here imports a framework beyond ONNX Runtime's reader.
A load may replace config.pbtxt by a config given with the request (the load
API's ``config``) and read the model from another directory (files staged
from the request); both go through the same completion and validation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from serve_app.backends import complete_io
from serve_app.config import (
    ENSEMBLE_PLATFORM,
    autocomplete_config,
    default_model_filename,
    parse_config,
    validate_config,
    validate_model_filename,
    validate_platform,
)
from serve_app.config.autocomplete import MODEL_FILENAMES
from serve_app.config.pbtxt import config_error
from serve_app.errors import InternalError, InvalidArgument, NotFound, ServeError, as_serve_error
from serve_app.protos import model_config_pb2 as mc
from serve_app.repository.version_policy import select_versions
from serve_app.security.paths import confined, is_plain_name

CONFIG_FILENAME = "config.pbtxt"
CONFIGS_DIR = "configs"  # where --model-config-name's alternate configs live in a model's directory
# What messages name as the "file" when a load request's config replaces config.pbtxt.
CONFIG_OVERRIDE = "config override"
_MAX_VERSION = 2**63 - 1  # versions are int64 on the wire


@dataclass(frozen=True)
class ModelSource:
    """Everything needed to deploy one model, read from its directory."""

    name: str
    directory: Path
    config: mc.ModelConfig  # completed and validated
    # Served versions (after the version policy) -> model file; for an
    # ensemble, which has no file, the version directory.
    versions: dict[int, Path]
    # Output name -> class labels, from the outputs' label_filename (classification extension).
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)


class ModelRepository:
    """Reads model directories under ``root``; holds no state between calls, so
    a poll sees the disk as it is now."""

    def __init__(self, root: str | Path, config_name: str = "", *, complete: bool = True) -> None:
        """``config_name``: Triton's --model-config-name: each model's ``configs/<config_name>.pbtxt`` where
        it exists, instead of its config.pbtxt.  ``complete``: configs are completed from their models
        (inputs, outputs, batching, a Python model's ``auto_complete_config``); off (Triton's strict model
        config), only the platform or backend and Triton's defaults are filled in."""
        self._root = Path(root)
        self._complete = complete
        if not self._root.is_dir():
            raise NotFound(f"model repository '{root}' does not exist or is not a directory")
        check_config_name(config_name)
        self._config_name = config_name

    @property
    def root(self) -> Path:
        return self._root

    def model_names(self) -> list[str]:
        """The model directory names, sorted; hidden directories and files are skipped."""
        try:
            entries = list(self._root.iterdir())
        except OSError as exc:
            raise InternalError(f"failed to poll from model repository '{self._root}': {exc}") from None
        return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_dir())

    def load(
        self, name: str, *, config_override: mc.ModelConfig | None = None, directory: Path | None = None
    ) -> ModelSource:
        """Parse, complete and validate model ``name``; raise a ServeError saying why not.

        ``config_override`` is used instead of config.pbtxt (it is completed and
        validated the same way; an empty name becomes ``name``, another name is an
        error).  ``directory`` reads the model's versions from there instead of
        ``<root>/<name>`` (files staged from a load request).
        """
        if directory is None:
            directory = self._model_dir(name)
        else:
            validate_model_name(name)
            directory = Path(directory)
            if not directory.is_dir():
                raise NotFound(f"model '{name}': model directory '{directory}' does not exist")
        try:
            return self._load(name, directory, config_override)
        except OSError as exc:
            raise InternalError(f"model '{name}': failed to read '{directory}': {exc}") from None

    def has_model(self, name: str) -> bool:
        """Whether ``name`` is a (non-hidden) model directory of the repository."""
        try:
            self._model_dir(name)
        except ServeError:
            return False
        return True

    def config_file(self, directory: Path) -> str:
        """The config a model directory is loaded from, relative to it: ``configs/<config_name>.pbtxt`` when
        a config name is set and that file exists (Triton's rule), config.pbtxt otherwise."""
        if self._config_name:
            custom = f"{CONFIGS_DIR}/{self._config_name}.pbtxt"
            if (directory / custom).is_file():
                return custom
        return CONFIG_FILENAME

    def model_dir(self, name: str) -> Path:
        """The directory of model ``name``; NotFound or InvalidArgument as :meth:`load` says."""
        return self._model_dir(name)

    def load_all(self) -> dict[str, ModelSource | ServeError]:
        """Every model in the repository; one that fails doesn't stop the others."""
        results: dict[str, ModelSource | ServeError] = {}
        for name in self.model_names():
            try:
                results[name] = self.load(name)
            except Exception as exc:
                results[name] = as_serve_error(exc)
        return results

    def _model_dir(self, name: str) -> Path:
        """The directory of ``name``, which must be a plain name inside the root."""
        validate_model_name(name)
        directory = self._root / name
        if name.startswith(".") or not directory.is_dir():
            raise NotFound(
                f"model '{name}': failed to poll from model repository '{self._root}': no such model directory"
            )
        return directory

    def _load(self, name: str, directory: Path, config_override: mc.ModelConfig | None = None) -> ModelSource:
        if config_override is not None:
            has_config = True
            where = CONFIG_OVERRIDE
            config = mc.ModelConfig()
            config.CopyFrom(config_override)
        else:
            config_file = self.config_file(directory)
            config_path = directory / config_file
            has_config = config_path.is_file()
            if has_config:
                _confine(name, directory, config_file, config_file, str(config_path))
            # The file messages name: config.pbtxt, else (generated config) the model file.
            where = str(config_path if has_config else directory)
            text = _read_text(config_path, name) if has_config else ""
            config = parse_config(text, model=name, path=where)
        if config.platform or config.backend:
            validate_platform(config, model=name, path=where)
        validate_model_filename(config, model=name, path=where)

        available = _version_dirs(directory)
        if not available:
            raise config_error(
                name,
                str(directory),
                "no version directories: each version lives in a numbered subdirectory (1/, 2/, ...)",
            )
        served = select_versions(config, list(available))
        if not served:
            raise config_error(
                name,
                where,
                f"version_policy: no available version is served by the policy (available: {sorted(available)})",
            )

        model_file: Path | None = None
        if config.platform == ENSEMBLE_PLATFORM:
            versions = {v: available[v] for v in served}
        else:
            filename = default_model_filename(config) or _probe_model_file(name, available[served[-1]])
            versions = {}
            named = " (default_model_filename)" if config.default_model_filename else ""
            for version in served:
                path = available[version] / filename
                if not path.exists():
                    raise config_error(name, str(path), f"version {version}: model file not found")
                what = f"version {version}: model file{named}"
                _confine(name, directory, f"{available[version].name}/{filename}", what, str(path))
                versions[version] = path
            model_file = versions[served[-1]]
            if not has_config:
                where = str(model_file)

        completed = autocomplete_config(
            config,
            model=name,
            model_dir=directory,
            model_file=model_file,
            complete_io=complete_io if self._complete else None,
        )
        validate_config(completed, model=name, path=where)
        labels = _labels(name, directory, completed, where)
        return ModelSource(name=name, directory=directory, config=completed, versions=versions, labels=labels)


def check_config_name(config_name: str) -> None:
    """A --model-config-name names a file of a model's configs/ directory, without its .pbtxt."""
    if config_name and (not is_plain_name(config_name) or config_name.startswith(".")):
        raise InvalidArgument(
            f"invalid model config name {config_name!r}: must be a file name (without .pbtxt) in a model's "
            f"{CONFIGS_DIR}/ directory"
        )


def validate_model_name(name: str) -> None:
    """A model name must be a plain directory name: nothing that could leave the repository root."""
    if not is_plain_name(name):
        raise InvalidArgument(f"invalid model name {name!r}: must be a directory name in the model repository")


def _read_text(path: Path, model: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise config_error(model, str(path), f"not UTF-8 text: {exc}") from None


def _version_dirs(directory: Path) -> dict[int, Path]:
    """Numbered subdirectories; other entries (and version 0) are ignored."""
    versions: dict[int, Path] = {}
    for entry in sorted(directory.iterdir()):
        name = entry.name
        if name.isascii() and name.isdigit() and 0 < int(name) <= _MAX_VERSION and entry.is_dir():
            versions.setdefault(int(name), entry)
    return versions


def _probe_model_file(model: str, version_dir: Path) -> str:
    """With no platform, backend or file name configured, the platform's default
    file name that the version directory holds (as Triton looks for them)."""
    for filename in MODEL_FILENAMES.values():
        if (version_dir / filename).exists():
            return filename
    names = ", ".join(MODEL_FILENAMES.values())
    raise config_error(
        model,
        str(version_dir),
        f"platform: the config gives no 'platform' or 'backend' and the version directory holds none of {names}",
    )


def _confine(model: str, directory: Path, relative: str, what: str, where: str) -> Path:
    """``directory / relative`` resolved inside the model directory, or InvalidConfig naming the model and file."""
    return confined(directory, relative, what, error=lambda detail: config_error(model, where, detail))


def _labels(model: str, directory: Path, config: mc.ModelConfig, where: str) -> dict[str, tuple[str, ...]]:
    """Each output's label file (one label per line), which must lie inside the model's directory."""
    labels: dict[str, tuple[str, ...]] = {}
    for i, out in enumerate(config.output):
        if not out.label_filename:
            continue
        field_name = f"output[{i}].label_filename"
        path = _confine(model, directory, out.label_filename, field_name, where)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise config_error(model, where, f"{field_name}: cannot read '{out.label_filename}': {exc}") from None
        labels[out.name] = tuple(text.splitlines())
    return labels
