"""The channel's handshake: each end proves it holds the shared key, and the key never crosses the wire.

The server speaks first: a version tag and a fresh random nonce.  The client
answers with its own nonce and an HMAC-SHA256 of both nonces under the key;
the server checks it and proves itself the same way, over the nonces in the
other order and under another label.  Only then does the client send a call or
load an answer: a process that took a dead instance's port learns nothing and
gets nothing to unpickle.  Fresh nonces on both sides stop a recorded
exchange from being replayed; the labels stop one side's proof from being
reflected as the other's.  Pure functions of bytes, so both ends and the
tests share them; the socket work is in :mod:`serve_app.transport.channel`.

What this does not give is privacy or integrity of the frames that follow:
someone who can rewrite traffic on the cluster network can still take over an
authenticated connection (as with Ray's own ports without TLS).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

MAGIC = b"SAC1"  # serve_app channel, handshake version 1
NONCE_BYTES = 32
PROOF_BYTES = hashlib.sha256().digest_size
HELLO_BYTES = len(MAGIC) + NONCE_BYTES  # server -> client
RESPONSE_BYTES = NONCE_BYTES + PROOF_BYTES  # client -> server: its nonce, its proof
# server -> client after the response: its proof (PROOF_BYTES)
_CLIENT = b"serve_app channel client"
_SERVER = b"serve_app channel server"


class HandshakeFailed(Exception):
    """The other end does not speak the channel's handshake or does not hold the key."""


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _proof(key: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, label + first + second, hashlib.sha256).digest()


def hello(server_nonce: bytes) -> bytes:
    """What the server sends first."""
    return MAGIC + server_nonce


def respond(key: bytes, hello_bytes: bytes, client_nonce: bytes) -> tuple[bytes, bytes]:
    """The client's answer to the server's hello: (the response to send, the server nonce it answers)."""
    if len(hello_bytes) != HELLO_BYTES or not hello_bytes.startswith(MAGIC):
        raise HandshakeFailed("the peer does not speak the channel's handshake")
    server_nonce = hello_bytes[len(MAGIC) :]
    return client_nonce + _proof(key, _CLIENT, server_nonce, client_nonce), server_nonce


def check_client(key: bytes, server_nonce: bytes, response: bytes) -> bytes:
    """The server's check of the client's response; returns the server's own proof to send back."""
    if len(response) != RESPONSE_BYTES:
        raise HandshakeFailed("short handshake response")
    client_nonce, proof = response[:NONCE_BYTES], response[NONCE_BYTES:]
    if not hmac.compare_digest(proof, _proof(key, _CLIENT, server_nonce, client_nonce)):
        raise HandshakeFailed("the client does not hold the channel's key")
    return _proof(key, _SERVER, client_nonce, server_nonce)


def check_server(key: bytes, server_nonce: bytes, client_nonce: bytes, proof: bytes) -> None:
    """The client's check of the server's proof."""
    if not hmac.compare_digest(proof, _proof(key, _SERVER, client_nonce, server_nonce)):
        raise HandshakeFailed("the peer could not prove it holds the channel's key")
