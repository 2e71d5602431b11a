"""The command line as Triton's tests and deployment scripts write it: ``--name=true|false`` booleans and
Triton's server flags, each with Triton's meaning or accepted as documented."""

from __future__ import annotations

import pathlib

import pytest

from scripts import example_models
from serve_app.cli import build_parser, settings_from
from serve_app.errors import InvalidArgument
from serve_app.local.server import serve_locally
from serve_app.settings import ServerSettings
from tests.support.net import free_port


def settings(*flags: str) -> ServerSettings:
    return settings_from(build_parser().parse_args(["--model-repository", "/m", *flags]))


@pytest.mark.parametrize(
    ("flags", "value"),
    [
        ((), False),
        (("--allow-client-shm",), True),
        (("--allow-client-shm=true",), True),
        (("--allow-client-shm=1",), True),
        (("--allow-client-shm", "on"), True),
        (("--allow-client-shm=true", "--allow-client-shm=false"), False),
        (("--allow-client-shm=FALSE",), False),
        (("--allow-client-shm", "--no-allow-client-shm"), False),
    ],
)
def test_booleans_take_tritons_spelling(flags: tuple[str, ...], value: bool) -> None:
    assert settings(*flags).allow_client_shm is value


def test_a_boolean_with_another_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        settings("--log-info=maybe")
    assert "invalid boolean value 'maybe'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        settings("--no-log-info=true")


def test_tritons_server_flags() -> None:
    s = settings(
        "--strict-model-config=false",
        "--strict-readiness=true",
        "--exit-on-error=false",
        "--backend-config=python,shm-default-byte-size=1048576",
        "--backend-config=default-max-batch-size=8",
        "--backend-directory=/opt/tritonserver/backends",
        "--cuda-memory-pool-byte-size=0:268435456",
        "--cuda-memory-pool-byte-size=1:0",
    )
    assert (s.strict_model_config, s.strict_readiness, s.exit_on_error) == (False, True, False)
    assert s.backend_settings() == {"python": {"shm-default-byte-size": "1048576"}, "": {"default-max-batch-size": "8"}}
    assert s.backend_directory == "/opt/tritonserver/backends"
    assert s.cuda_memory_pools() == {0: 268435456, 1: 0}
    assert settings("--disable-auto-complete-config").strict_model_config is True


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--backend-config=,a=1", "No backend specified. --backend-config option format is"),
        ("--backend-config=python,a", "--backend-config option format is '<backend name>,<setting>=<value>'"),
        ("--backend-config=python,a=", "--backend-config option format is '<backend name>,<setting>=<value>'"),
        ("--cuda-memory-pool-byte-size=256", "--cuda-memory-pool-byte-size option format is"),
    ],
)
def test_badly_formed_triton_flags_are_refused(flag: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        settings(flag)
    assert err.value.message.startswith(message)


def test_exit_on_error_stops_a_server_whose_model_failed_to_load(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example_models.add_sub(tmp_path, name="broken")
    (tmp_path / "broken" / "config.pbtxt").write_text('name: "broken"\nmax_batch_size: eight\n')
    ports = [f"--{name}-port={free_port()}" for name in ("http", "grpc", "metrics")]
    s = settings_from(build_parser().parse_args(["--model-repository", str(tmp_path), "--exit-on-error=true", *ports]))
    assert serve_locally(s) == 1
    assert "error: creating server: Internal - failed to load all models" in capsys.readouterr().err
