"""A Python model's own dependencies: ``EXECUTION_ENV_PATH`` and ``requirements.txt``.

Triton starts a model's stub inside the environment ``EXECUTION_ENV_PATH``
names (a conda-pack archive or an unpacked environment, whose Python must be
the server's).  Here a model's instances run in the server's interpreter, so
an *unpacked* environment directory is honoured by putting its
``site-packages`` first on the import path of the instance's process; an
archive is refused with a clear error (unpack it and point at the
directory).  A ``requirements.txt`` in the model directory is installed by
Ray into the model's own replicas (a runtime environment: see
:func:`pip_requirements`), not here.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from serve_app.errors import InternalError, Unsupported
from serve_app.protos import model_config_pb2 as mc

ENV_PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIR_PLACEHOLDER = "$$TRITON_MODEL_DIRECTORY"
REQUIREMENTS = "requirements.txt"
_COMMENT = re.compile(r"(^|\s+)#.*$")


def execution_env(config: mc.ModelConfig, model_dir: Path) -> Path | None:
    """The environment directory a model's ``EXECUTION_ENV_PATH`` names (placeholder resolved), or None."""
    param = config.parameters.get(ENV_PARAMETER)
    if param is None or not param.string_value.strip():
        return None
    raw = param.string_value.strip().replace(MODEL_DIR_PLACEHOLDER, str(model_dir), 1)
    path = Path(os.path.realpath(raw))
    if not path.exists():
        raise InternalError(f"Failed to get the canonical path for {raw}.")
    if not path.is_dir():
        raise Unsupported(
            f"model '{config.name}': {ENV_PARAMETER} names {path}, an archive; serve_app uses unpacked environments "
            "only: unpack it (e.g. 'mkdir env && tar -xzf env.tar.gz -C env') and name the directory"
        )
    return path


def site_packages(env: Path) -> Path:
    """The environment's ``site-packages`` for this interpreter's Python version."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [env / "lib" / version / "site-packages", env / "Lib" / "site-packages"]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    others = sorted(p.parent.name for p in (env / "lib").glob("python*/site-packages"))
    found = f" (it has {', '.join(others)})" if others else ""
    raise InternalError(
        f"the Python environment at {env} has no lib/{version}/site-packages{found}: its Python must be the server's "
        f"({sys.version_info.major}.{sys.version_info.minor})"
    )


def add_execution_env(config: mc.ModelConfig, model_dir: Path) -> Path | None:
    """Put the model's environment first on the import path; the environment used, or None."""
    env = execution_env(config, model_dir)
    if env is None:
        return None
    packages = str(site_packages(env))
    if packages not in sys.path:
        sys.path.insert(0, packages)
    return env


def pip_requirements(model_dir: Path) -> list[str]:
    """The requirement lines of the model directory's ``requirements.txt`` (none: an empty list)."""
    path = model_dir / REQUIREMENTS
    if not path.is_file():
        return []
    # pip's comments start at a '#' that begins the line or follows whitespace (URLs keep their '#egg=...')
    lines = (_COMMENT.sub("", line).strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]
