"""TLS in process: both front ends with certificates made here, spoken to by stock tritonclient (and httpx).

The certificates come from ``cryptography`` (or the ``openssl`` command); without either the tests
are skipped.  The HTTP app runs under a real uvicorn on a free port, as the gateway runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import uvicorn
from tritonclient.utils import InferenceServerException

from serve_app.errors import InvalidArgument
from serve_app.grpc_server import start_grpc_server
from serve_app.http_server import build_http_app
from serve_app.http_server.server import uvicorn_tls_options
from serve_app.security.tls import TlsSettings
from serve_app.service import InferenceService
from tests.support.net import free_port
from tests.support.repos import ADD_SUB

T = TypeVar("T")


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1 / localhost and a client certificate, all signed by the CA."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_key: Path  # a key that belongs to no certificate


def _with_cryptography(d: Path) -> Pki:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def key(path: Path) -> ec.EllipticCurvePrivateKey:
        k = ec.generate_private_key(ec.SECP256R1())
        pem = k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.write_bytes(pem)
        return k

    def cert(path: Path, cn: str, k: Any, issuer: Any, issuer_key: Any, *, ca: bool = False, san: Any = None) -> Any:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer.subject if issuer is not None else name)
            .public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        c = builder.sign(issuer_key, hashes.SHA256())
        path.write_bytes(c.public_bytes(serialization.Encoding.PEM))
        return c

    ca_key = key(d / "ca.key")
    ca = cert(d / "ca.pem", "serve_app test CA", ca_key, None, ca_key, ca=True)
    server_san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert(d / "server.pem", "localhost", key(d / "server.key"), ca, ca_key, san=server_san)
    cert(d / "client.pem", "client", key(d / "client.key"), ca, ca_key)
    key(d / "other.key")
    return _pki(d)


def _with_openssl(d: Path) -> Pki:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=serve_app test CA")
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for who, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        run("req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN={who}")
        sign = ["-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1"]
        run("x509", "-req", "-in", f"{who}.csr", *sign, "-out", f"{who}.pem", *ext)
    run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "other.key")
    return _pki(d)


def _pki(d: Path) -> Pki:
    return Pki(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key", d / "other.key")


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl command is available to make certificates")
        return _with_openssl(d)
    return _with_cryptography(d)


@contextlib.asynccontextmanager
async def running_uvicorn(app: Any, **config: Any) -> AsyncIterator[int]:
    """``app`` under uvicorn on a free loopback port of this event loop; yields the port."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", **config)
    )
    task = asyncio.get_running_loop().create_task(server.serve())
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        if task.done():
            task.result()  # raises why it did not start
        assert server.started, "uvicorn did not start"
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def in_thread(fn: Callable[[], T]) -> T:
    """Run a blocking stock client away from the event loop that serves it."""
    return await asyncio.to_thread(fn)


def operands() -> tuple[np.ndarray, np.ndarray]:
    return np.arange(16, dtype=np.float32).reshape(1, 16), np.full((1, 16), 2.0, dtype=np.float32)


def grpc_add_sub(client: grpcclient.InferenceServerClient, **kwargs: Any) -> np.ndarray:
    a, b = operands()
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return client.infer(ADD_SUB, inputs, **kwargs).as_numpy("OUTPUT0")


def http_add_sub(client: httpclient.InferenceServerClient, **kwargs: Any) -> np.ndarray:
    a, b = operands()
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return client.infer(ADD_SUB, inputs, **kwargs).as_numpy("OUTPUT0")


EXPECTED = (np.arange(16, dtype=np.float32) + 2.0).reshape(1, 16)


# -------------------------------------------------------------------------------------------------- gRPC


@contextlib.asynccontextmanager
async def grpc_server(service: InferenceService, tls: TlsSettings) -> AsyncIterator[str]:
    port = free_port()
    server = await start_grpc_server(service, "127.0.0.1", port, tls=tls)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


async def test_grpc_over_tls(service: InferenceService, pki: Pki) -> None:
    async with grpc_server(service, TlsSettings(str(pki.server_cert), str(pki.server_key))) as url:

        def secure() -> tuple[bool, np.ndarray]:
            with grpcclient.InferenceServerClient(url, ssl=True, root_certificates=str(pki.ca)) as client:
                return client.is_server_live(), grpc_add_sub(client)

        live, out = await in_thread(secure)
        assert live
        np.testing.assert_array_equal(out, EXPECTED)

        def plaintext() -> None:
            with grpcclient.InferenceServerClient(url) as client:
                client.is_server_live(client_timeout=5)

        with pytest.raises(InferenceServerException):
            await in_thread(plaintext)


async def test_grpc_mutual_tls(service: InferenceService, pki: Pki) -> None:
    tls = TlsSettings(str(pki.server_cert), str(pki.server_key), str(pki.ca), require_client_cert=True)
    async with grpc_server(service, tls) as url:

        def with_client_cert() -> np.ndarray:
            with grpcclient.InferenceServerClient(
                url,
                ssl=True,
                root_certificates=str(pki.ca),
                private_key=str(pki.client_key),
                certificate_chain=str(pki.client_cert),
            ) as client:
                return grpc_add_sub(client)

        np.testing.assert_array_equal(await in_thread(with_client_cert), EXPECTED)

        def without_client_cert() -> None:
            with grpcclient.InferenceServerClient(url, ssl=True, root_certificates=str(pki.ca)) as client:
                client.is_server_live(client_timeout=5)

        with pytest.raises(InferenceServerException):
            await in_thread(without_client_cert)


async def test_grpc_server_refuses_a_key_of_another_certificate(service: InferenceService, pki: Pki) -> None:
    with pytest.raises(InvalidArgument, match="do not load as a PEM certificate chain and its private key"):
        await start_grpc_server(
            service, "127.0.0.1", free_port(), tls=TlsSettings(str(pki.server_cert), str(pki.other_key))
        )


# -------------------------------------------------------------------------------------------------- HTTP


async def test_http_over_tls(service: InferenceService, pki: Pki) -> None:
    tls = TlsSettings(str(pki.server_cert), str(pki.server_key))
    async with running_uvicorn(build_http_app(service), **uvicorn_tls_options(tls)) as port:

        def secure() -> tuple[bool, np.ndarray]:
            client = httpclient.InferenceServerClient(
                f"127.0.0.1:{port}", ssl=True, ssl_options={"ca_certs": str(pki.ca)}
            )
            try:
                return client.is_server_live(), http_add_sub(client)
            finally:
                client.close()

        live, out = await in_thread(secure)
        assert live
        np.testing.assert_array_equal(out, EXPECTED)

        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(pki.ca))) as client:
            assert (await client.get(f"https://127.0.0.1:{port}/v2/health/live")).status_code == 200
            assert (await client.get(f"https://localhost:{port}/v2/health/ready")).status_code == 200
        async with httpx.AsyncClient() as client:  # the system's CAs don't know ours
            with pytest.raises(httpx.ConnectError):
                await client.get(f"https://127.0.0.1:{port}/v2/health/live")
            with pytest.raises(httpx.HTTPError):  # plaintext on the TLS port
                await client.get(f"http://127.0.0.1:{port}/v2/health/live")


async def test_http_mutual_tls(service: InferenceService, pki: Pki) -> None:
    tls = TlsSettings(str(pki.server_cert), str(pki.server_key), str(pki.ca), require_client_cert=True)
    async with running_uvicorn(build_http_app(service), **uvicorn_tls_options(tls)) as port:
        url = f"https://127.0.0.1:{port}/v2/health/live"
        with_cert = ssl.create_default_context(cafile=str(pki.ca))
        with_cert.load_cert_chain(str(pki.client_cert), str(pki.client_key))
        async with httpx.AsyncClient(verify=with_cert) as client:
            assert (await client.get(url)).status_code == 200
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(pki.ca))) as client:
            with pytest.raises(httpx.HTTPError):  # the handshake (or the first read) fails without one
                await client.get(url)
