"""The instance channel over TLS with Ray's TLS variables: mutual TLS with the cluster's CA, the key handshake
inside; a peer without a certificate of that CA can't connect."""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.errors import Unavailable
from serve_app.transport import ChannelClient, ChannelServer
from serve_app.transport.pool import ChannelPool
from serve_app.transport.tls import CA, CERT, KEY, USE_TLS, channel_tls
from tests.integration.test_security_tls import Pki, pki

__all__ = ["pki"]
TOKEN = b"0123456789abcdef"


async def echo(payload: Any) -> Any:
    return payload


def ray_env(pki: Pki, cert: str = "server") -> dict[str, str]:
    return {
        USE_TLS: "1",
        CERT: str(getattr(pki, f"{cert}_cert")),
        KEY: str(getattr(pki, f"{cert}_key")),
        CA: str(pki.ca),
    }


def test_off_unless_ray_uses_tls(pki: Pki) -> None:
    assert channel_tls({}) is None and channel_tls({USE_TLS: "0", CERT: "x"}) is None
    with pytest.raises(ValueError, match=KEY):
        channel_tls({USE_TLS: "1", CERT: str(pki.server_cert), CA: str(pki.ca)})


async def test_calls_cross_over_mutual_tls(pki: Pki) -> None:
    tls = channel_tls(ray_env(pki))
    server = ChannelServer(echo, TOKEN, tls=tls)
    address = await server.start("127.0.0.1")
    client = ChannelClient(address, tls=channel_tls(ray_env(pki, "client")))
    await client.connect(TOKEN)
    assert await client.call({"x": 1}) == {"x": 1}
    client.close()
    server.close()


async def test_a_plain_peer_cannot_connect(pki: Pki) -> None:
    server = ChannelServer(echo, TOKEN, tls=channel_tls(ray_env(pki)))
    address = await server.start("127.0.0.1")
    with pytest.raises(Unavailable, match="cannot reach the channel's peer"):  # no TLS: no handshake completes
        await ChannelPool(TOKEN).get(address)
    server.close()
