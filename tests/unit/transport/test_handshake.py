"""The channel handshake as pure logic: both ends prove the key, nothing replays or reflects, no key in clear."""

from __future__ import annotations

import pytest

from serve_app.transport import handshake as hs

KEY = b"0123456789abcdef"
OTHER = b"fedcba9876543210"


def run(client_key: bytes, server_key: bytes) -> None:
    """One handshake: raises HandshakeFailed where an end refuses the other."""
    server_nonce, client_nonce = hs.new_nonce(), hs.new_nonce()
    response, answered = hs.respond(client_key, hs.hello(server_nonce), client_nonce)
    assert answered == server_nonce
    proof = hs.check_client(server_key, server_nonce, response)
    hs.check_server(client_key, server_nonce, client_nonce, proof)


def test_ends_with_the_same_key_agree() -> None:
    run(KEY, KEY)


def test_a_client_without_the_key_is_refused() -> None:
    with pytest.raises(hs.HandshakeFailed, match="client does not hold"):
        run(OTHER, KEY)


def test_a_server_without_the_key_is_refused() -> None:
    """The server can't answer the challenge: a process that took a dead instance's port."""
    server_nonce, client_nonce = hs.new_nonce(), hs.new_nonce()
    response, _ = hs.respond(KEY, hs.hello(server_nonce), client_nonce)
    with pytest.raises(hs.HandshakeFailed, match="does not hold"):
        hs.check_client(OTHER, server_nonce, response)  # it can't check the client's response either
    impostor = hs.check_client(KEY, server_nonce, response)[::-1]
    with pytest.raises(hs.HandshakeFailed, match="could not prove"):
        hs.check_server(KEY, server_nonce, client_nonce, impostor)


def test_nothing_sent_contains_the_key() -> None:
    server_nonce, client_nonce = hs.new_nonce(), hs.new_nonce()
    hello = hs.hello(server_nonce)
    response, _ = hs.respond(KEY, hello, client_nonce)
    proof = hs.check_client(KEY, server_nonce, response)
    for sent in (hello, response, proof):
        assert KEY not in sent


def test_a_recorded_response_does_not_answer_a_new_challenge() -> None:
    old_nonce = hs.new_nonce()
    recorded, _ = hs.respond(KEY, hs.hello(old_nonce), hs.new_nonce())
    with pytest.raises(hs.HandshakeFailed):
        hs.check_client(KEY, hs.new_nonce(), recorded)


def test_the_servers_proof_cannot_be_reflected_as_a_clients() -> None:
    """A peer that relays the server's own proof back as a client response gets nowhere (labels differ)."""
    server_nonce, client_nonce = hs.new_nonce(), hs.new_nonce()
    response, _ = hs.respond(KEY, hs.hello(server_nonce), client_nonce)
    server_proof = hs.check_client(KEY, server_nonce, response)
    with pytest.raises(hs.HandshakeFailed):
        hs.check_client(KEY, client_nonce, server_nonce + server_proof)


@pytest.mark.parametrize("hello", [b"", b"XXXX" + bytes(hs.NONCE_BYTES), hs.MAGIC + b"short"])
def test_a_peer_that_does_not_speak_the_handshake_is_refused(hello: bytes) -> None:
    with pytest.raises(hs.HandshakeFailed, match="does not speak"):
        hs.respond(KEY, hello, hs.new_nonce())


def test_a_short_response_is_refused() -> None:
    with pytest.raises(hs.HandshakeFailed, match="short"):
        hs.check_client(KEY, hs.new_nonce(), b"x" * 10)
