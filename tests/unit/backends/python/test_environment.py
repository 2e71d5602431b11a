"""``EXECUTION_ENV_PATH`` and ``requirements.txt``: a Python model's own dependencies.

Fake environments are plain directories under ``tmp_path``: only their layout matters here
(``lib/pythonX.Y/site-packages`` for the running interpreter).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from serve_app.backends.python.environment import (
    add_execution_env,
    execution_env,
    pip_requirements,
    site_packages,
)
from serve_app.config import parse_config
from serve_app.errors import InternalError, Unsupported
from serve_app.protos import model_config_pb2 as mc

PY = f"python{sys.version_info.major}.{sys.version_info.minor}"


def config(env: str | None) -> mc.ModelConfig:
    text = 'name: "m"\nbackend: "python"\n'
    if env is not None:
        text += f'parameters: {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env}" }} }}\n'
    return parse_config(text, model="m", path="config.pbtxt")


def make_env(root: Path, python: str = PY) -> Path:
    (root / "lib" / python / "site-packages").mkdir(parents=True)
    return root


def test_no_environment() -> None:
    assert execution_env(config(None), Path("/models/m")) is None
    assert execution_env(config("  "), Path("/models/m")) is None


def test_placeholder_is_the_model_directory(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    env = make_env(model_dir / "env")
    assert execution_env(config("$$TRITON_MODEL_DIRECTORY/env"), model_dir) == env.resolve()


def test_absolute_path_is_canonical(tmp_path: Path) -> None:
    env = make_env(tmp_path / "envs" / "a")
    (tmp_path / "link").symlink_to(env)
    assert execution_env(config(str(tmp_path / "link")), tmp_path) == env.resolve()


def test_missing_environment(tmp_path: Path) -> None:
    with pytest.raises(InternalError) as err:
        execution_env(config("$$TRITON_MODEL_DIRECTORY/nope"), tmp_path / "m")
    assert err.value.message == f"Failed to get the canonical path for {tmp_path / 'm'}/nope."


def test_an_archive_is_refused(tmp_path: Path) -> None:
    """Triton unpacks conda-pack archives; serve_app asks for the unpacked directory."""
    (tmp_path / "env.tar.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(Unsupported) as err:
        execution_env(config("$$TRITON_MODEL_DIRECTORY/env.tar.gz"), tmp_path)
    assert "EXECUTION_ENV_PATH" in err.value.message
    assert "archive" in err.value.message
    assert "unpack it" in err.value.message


def test_site_packages_for_this_interpreter(tmp_path: Path) -> None:
    env = make_env(tmp_path / "env")
    make_env(env, "python2.7")
    assert site_packages(env) == env / "lib" / PY / "site-packages"


def test_site_packages_windows_layout(tmp_path: Path) -> None:
    (tmp_path / "Lib" / "site-packages").mkdir(parents=True)
    assert site_packages(tmp_path) == tmp_path / "Lib" / "site-packages"


def test_site_packages_of_another_python_names_what_it_found(tmp_path: Path) -> None:
    env = make_env(tmp_path / "env", "python2.7")
    make_env(env, "python3.1")
    with pytest.raises(InternalError) as err:
        site_packages(env)
    message = err.value.message
    assert f"has no lib/{PY}/site-packages" in message
    assert "(it has python2.7, python3.1)" in message
    assert f"({sys.version_info.major}.{sys.version_info.minor})" in message


def test_site_packages_of_an_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(InternalError) as err:
        site_packages(tmp_path)
    assert "(it has" not in err.value.message


def test_add_execution_env_goes_first_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    env = make_env(tmp_path / "m" / "env")
    cfg = config("$$TRITON_MODEL_DIRECTORY/env")
    assert add_execution_env(cfg, tmp_path / "m") == env.resolve()
    packages = str(env.resolve() / "lib" / PY / "site-packages")
    assert sys.path[0] == packages
    add_execution_env(cfg, tmp_path / "m")
    assert sys.path.count(packages) == 1


def test_add_execution_env_without_one_leaves_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = list(sys.path)
    assert add_execution_env(config(None), Path("/models/m")) is None
    assert sys.path == before


def test_pip_requirements(tmp_path: Path) -> None:
    assert pip_requirements(tmp_path) == []
    (tmp_path / "requirements.txt").write_text(
        "# the model's dependencies\n\nnumpy>=1.24\n  pillow==10.0  # images\n\n   \ntokenizers\n"
    )
    assert pip_requirements(tmp_path) == ["numpy>=1.24", "pillow==10.0", "tokenizers"]


def test_pip_requirements_keeps_url_fragments(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text(
        "git+https://github.com/org/repo.git#egg=repo\nhttps://example.com/pkg-1.0.tar.gz#sha256=abc  # pinned\n"
    )
    assert pip_requirements(tmp_path) == [
        "git+https://github.com/org/repo.git#egg=repo",
        "https://example.com/pkg-1.0.tar.gz#sha256=abc",
    ]
