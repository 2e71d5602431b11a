"""Optional TLS for the HTTP and gRPC front ends, from one set of PEM files.

``TlsSettings`` holds file names only (it crosses to Ray actors as plain data); :meth:`check`
loads them into an ``ssl.SSLContext`` first, so a missing, unreadable or mismatched file fails at
startup with a message naming the file instead of at the first handshake.  The client-certificate
rule is Triton's gRPC one (``--grpc-use-ssl-mutual``): without ``require_client_cert`` no client
certificate is asked for; with it, every client must present one signed by ``ca_file``.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from serve_app.errors import InvalidArgument


@dataclass(frozen=True)
class TlsSettings:
    """PEM files: the server's certificate chain and key; the CA that signs client certificates."""

    cert_file: str
    key_file: str
    ca_file: str | None = None
    require_client_cert: bool = False

    def check(self) -> None:
        """Raise InvalidArgument naming the file unless the files exist, are readable and belong together."""
        if not self.cert_file or not self.key_file:
            raise InvalidArgument("TLS needs both a certificate file and a key file")
        if self.require_client_cert and not self.ca_file:
            raise InvalidArgument("TLS: requiring client certificates needs a CA file to verify them with")
        for what, name in self.files():
            read_pem(what, name)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, ValueError) as exc:
            raise InvalidArgument(
                f"TLS certificate file '{self.cert_file}' and key file '{self.key_file}' "
                f"do not load as a PEM certificate chain and its private key: {exc}"
            ) from None
        if self.ca_file:
            try:
                context.load_verify_locations(cafile=self.ca_file)
            except ssl.SSLError as exc:
                raise InvalidArgument(f"TLS CA file '{self.ca_file}' holds no PEM certificate: {exc}") from None

    def files(self) -> list[tuple[str, str]]:
        files = [("certificate", self.cert_file), ("key", self.key_file)]
        return [*files, ("CA", self.ca_file)] if self.ca_file else files


def optional_tls(
    cert_file: str = "", key_file: str = "", ca_file: str = "", require_client_cert: bool = False
) -> TlsSettings | None:
    """The TlsSettings that settings or flags describe: None when no file is given, an error when half is."""
    if not cert_file and not key_file and not ca_file and not require_client_cert:
        return None
    if not cert_file or not key_file:
        raise InvalidArgument("TLS needs both a certificate file (--tls-cert) and a key file (--tls-key)")
    tls = TlsSettings(cert_file, key_file, ca_file or None, require_client_cert)
    tls.check()
    return tls


def read_pem(what: str, name: str) -> bytes:
    try:
        return Path(name).read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"TLS {what} file '{name}' cannot be read: {exc.strerror or exc}") from None
