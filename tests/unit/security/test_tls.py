"""TlsSettings: clear errors for missing, unreadable or half-given files (certificates that work: integration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve_app.errors import InvalidArgument
from serve_app.grpc_server.server import grpc_ssl_context
from serve_app.http_server.server import uvicorn_tls_options
from serve_app.security.tls import TlsSettings, optional_tls


def test_no_files_no_tls() -> None:
    assert optional_tls() is None
    assert optional_tls("", "", "") is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cert_file": "c.pem"}, "needs both a certificate file (--tls-cert) and a key file (--tls-key)"),
        ({"key_file": "k.pem"}, "needs both a certificate file"),
        ({"ca_file": "ca.pem"}, "needs both a certificate file"),
        ({"require_client_cert": True}, "needs both a certificate file"),
    ],
)
def test_half_given(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        optional_tls(**kwargs)  # type: ignore[arg-type]
    assert message in err.value.message


def test_missing_file_is_named(tmp_path: Path) -> None:
    key = tmp_path / "k.pem"
    key.write_text("x")
    with pytest.raises(InvalidArgument, match=r"TLS certificate file '.*nope\.pem' cannot be read: No such file"):
        TlsSettings(str(tmp_path / "nope.pem"), str(key)).check()
    with pytest.raises(InvalidArgument, match=r"TLS key file '.*nope\.pem' cannot be read"):
        TlsSettings(str(key), str(tmp_path / "nope.pem")).check()
    with pytest.raises(InvalidArgument, match=r"TLS CA file '.*nope\.pem' cannot be read"):
        TlsSettings(str(key), str(key), str(tmp_path / "nope.pem")).check()


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"TLS certificate file '.*' cannot be read: Is a directory"):
        TlsSettings(str(tmp_path), str(tmp_path)).check()


def test_not_pem(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(InvalidArgument, match="do not load as a PEM certificate chain and its private key"):
        TlsSettings(str(junk), str(junk)).check()
    with pytest.raises(InvalidArgument, match="do not load as a PEM"):
        uvicorn_tls_options(TlsSettings(str(junk), str(junk)))
    with pytest.raises(InvalidArgument, match="do not load as a PEM"):
        grpc_ssl_context(TlsSettings(str(junk), str(junk)))


def test_client_certificates_need_a_ca(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="requiring client certificates needs a CA file"):
        TlsSettings("c.pem", "k.pem", require_client_cert=True).check()


def test_settings_are_plain_data() -> None:
    import pickle

    tls = TlsSettings("c.pem", "k.pem", "ca.pem", True)
    assert pickle.loads(pickle.dumps(tls)) == tls
