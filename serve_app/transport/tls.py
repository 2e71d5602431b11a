"""TLS for the instance channel, with Ray's own certificates when Ray runs with TLS.

A cluster that turns on Ray's TLS (``RAY_USE_TLS=1`` with ``RAY_TLS_SERVER_CERT``,
``RAY_TLS_SERVER_KEY`` and ``RAY_TLS_CA_CERT`` in every node's environment, which Ray's processes
inherit) has its channels use the same files: each end presents the node's certificate and requires
the other's to be signed by the CA (mutual TLS, 1.2 or later).  Host names are not checked, as the
channels address nodes by IP; the CA is the cluster's own.  The key handshake still runs inside.
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

USE_TLS, CERT, KEY, CA = "RAY_USE_TLS", "RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT"


@dataclass(frozen=True)
class ChannelTls:
    server: ssl.SSLContext
    client: ssl.SSLContext


def channel_tls(env: Mapping[str, str]) -> ChannelTls | None:
    """The channel's TLS contexts from Ray's TLS variables in ``env``; None when Ray's TLS is off."""
    if env.get(USE_TLS, "0").strip().lower() not in ("1", "true"):
        return None
    missing = [name for name in (CERT, KEY, CA) if not env.get(name)]
    if missing:
        raise ValueError(f"{USE_TLS} is on but {', '.join(missing)} is not set")
    cert, key, ca = env[CERT], env[KEY], env[CA]
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    client.check_hostname = False  # nodes are addressed by IP; the certificate must still be the CA's
    for context in (server, client):
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(cert, key)
    return ChannelTls(server, client)


@functools.cache
def process_tls() -> ChannelTls | None:
    """This process's channel TLS, from its environment (read once)."""
    return channel_tls(os.environ)
