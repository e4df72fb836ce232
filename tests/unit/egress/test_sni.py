"""Parsing ClientHellos that the standard library's TLS client really sends."""

from __future__ import annotations

import ssl

import pytest

from corral.egress._sni import ClientHello, parse_client_hello


def _hello(server_hostname: str | None) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = server_hostname is not None
    if server_hostname is None:
        context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def _with_extension(hello: bytes, kind: int, value: bytes = b"") -> bytes:
    """*hello* (one record) with one more extension appended, lengths fixed up."""
    body = hello[5 + 4 :]
    pos = 2 + 32
    pos += 1 + body[pos]
    pos += 2 + int.from_bytes(body[pos : pos + 2], "big")
    pos += 1 + body[pos]
    extensions = body[pos + 2 :] + kind.to_bytes(2, "big") + len(value).to_bytes(2, "big") + value
    body = body[:pos] + len(extensions).to_bytes(2, "big") + extensions
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return hello[:3] + len(handshake).to_bytes(2, "big") + handshake


def test_reads_the_server_name() -> None:
    assert parse_client_hello(_hello("api.example.test")) == ClientHello(
        sni="api.example.test", encrypted=False
    )
    assert parse_client_hello(_hello(None)) == ClientHello(sni=None, encrypted=False)


def test_waits_for_a_complete_hello_across_records_and_segments() -> None:
    hello = _hello("api.example.test")
    for cut in (1, 5, 40, len(hello) - 1):
        assert parse_client_hello(hello[:cut]) is None
    # the same handshake split into two records
    handshake = hello[5:]
    half = len(handshake) // 2
    split = (
        hello[:3] + half.to_bytes(2, "big") + handshake[:half]
        + hello[:3] + (len(handshake) - half).to_bytes(2, "big") + handshake[half:]
    )  # fmt: skip
    assert parse_client_hello(split) == ClientHello(sni="api.example.test", encrypted=False)


def test_notices_encrypted_client_hello_and_esni() -> None:
    hello = _hello("public.example.test")
    assert parse_client_hello(_with_extension(hello, 0xFE0D, b"\x00\x01")).encrypted  # type: ignore[union-attr]
    assert parse_client_hello(_with_extension(hello, 0xFFCE)).encrypted  # type: ignore[union-attr]


def test_refuses_malformed_hellos() -> None:
    hello = _hello("api.example.test")
    with pytest.raises(ValueError, match="not a ClientHello"):
        parse_client_hello(hello[:5] + b"\x02" + hello[6:])
    with pytest.raises(ValueError, match="appears twice"):  # a second server_name
        parse_client_hello(_with_extension(hello, 0x0000, b"\x00\x03\x00\x00\x00"))
    with pytest.raises(ValueError, match="exactly one host name"):
        parse_client_hello(_with_extension(_hello(None), 0x0000, b"\x00\x00"))


def test_refuses_a_record_of_another_type_inside_the_hello() -> None:
    hello = _hello("api.example.test")
    handshake = hello[5:]
    split = hello[:3] + (10).to_bytes(2, "big") + handshake[:10] + b"\x17\x03\x03\x00\x01x"
    with pytest.raises(ValueError, match="not a handshake"):
        parse_client_hello(split)
