"""TLS termination for the hosts whose requests the proxy must read (masked credentials,
request rules).

* :func:`make_ca` draws the per-run certificate authority (``cryptography``:
  an ECDSA P-256 key, valid for one day, path length 0, name constraints
  none - the key never leaves the corral process and dies with the run).
  Only its certificate enters the sandbox, merged into a copy of the host's
  trust bundle.
* :class:`Terminator` mints one leaf certificate per host on first use
  (cached for the run) and builds the two TLS contexts of a terminated
  tunnel: the proxy as server towards the sandbox (ALPN ``http/1.1`` only:
  the proxy parses HTTP/1.1) and as client towards the real host, verified
  against the host's trust store (or ``upstream_ca``), the host name checked.
* :class:`TLSChannel` runs :mod:`ssl` over memory BIOs on a non-blocking
  socket with the event loop's ``sock_recv``/``sock_sendall``, so the proxy
  keeps one event loop and no extra thread per connection.

:mod:`cryptography` is imported only here, and this module only when a run
has masked credentials or request rules.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    import socket

__all__ = ["TLSChannel", "Terminator", "leaf", "make_ca"]

_CHUNK = 65536


def _require_cryptography() -> None:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise ImportError(
            "masked credentials and request rules need the 'cryptography' package "
            "(pip install 'corral[egress]')"
        ) from None


def make_ca() -> tuple[bytes, bytes]:
    """A fresh CA: ``(certificate PEM, private key PEM)``.

    Raises:
        ImportError: ``cryptography`` is not installed.
    """
    _require_cryptography()
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "corral"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"corral egress CA {os.urandom(4).hex()}"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def leaf(ca_cert_pem: bytes, ca_key_pem: bytes, host: str, *more: str) -> bytes:
    """A PEM chain (leaf certificate, its key) for *host* (and *more* names), signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for name in (host, *more):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class Terminator:
    """The TLS contexts of one proxy: per-host server contexts and one upstream client context.

    Args:
        ca_cert_pem, ca_key_pem: the per-run CA (from :func:`make_ca`).
        upstream_ca: a PEM file that replaces the system trust store for
            verifying the real hosts (tests, private registries), or None.
    """

    __slots__ = ("_ca_cert", "_ca_key", "_client", "_servers")

    def __init__(self, ca_cert_pem: bytes, ca_key_pem: bytes, upstream_ca: str | None) -> None:
        _require_cryptography()
        self._ca_cert = ca_cert_pem
        self._ca_key = ca_key_pem
        self._servers: dict[str, ssl.SSLContext] = {}
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=upstream_ca)
        client.minimum_version = ssl.TLSVersion.TLSv1_2
        client.set_alpn_protocols(["http/1.1"])
        self._client = client

    @property
    def upstream_context(self) -> ssl.SSLContext:
        """Verifies the real host's certificate and name."""
        return self._client

    def server_context(self, host: str) -> ssl.SSLContext:
        """The context presenting a certificate for *host* (minted once per run)."""
        context = self._servers.get(host)
        if context is None:
            chain = leaf(self._ca_cert, self._ca_key, host)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.set_alpn_protocols(["http/1.1"])
            # load_cert_chain reads paths only: an anonymous memory file, never on disk
            fd = os.memfd_create("corral-leaf", os.MFD_CLOEXEC)
            try:
                os.write(fd, chain)
                context.load_cert_chain(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)
            self._servers[host] = context
        return context


class TLSChannel:
    """TLS over a non-blocking socket, driven by the event loop (memory BIOs).

    ``recv`` returns ``b""`` at the end of the stream (close_notify or a
    bare EOF); TLS errors raise :class:`ssl.SSLError` (an :class:`OSError`).
    """

    __slots__ = ("_in", "_loop", "_obj", "_out", "sock")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        initial: bytes = b"",
    ) -> None:
        self._loop = loop
        self.sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        if initial:
            self._in.write(initial)
        self._obj = context.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )

    async def _flush(self) -> None:
        data = self._out.read()
        if data:
            await self._loop.sock_sendall(self.sock, data)

    async def _fill(self) -> None:
        data = await self._loop.sock_recv(self.sock, _CHUNK)
        if data:
            self._in.write(data)
        else:
            self._in.write_eof()

    async def handshake(self) -> None:
        """Complete the handshake (raises ssl.SSLError / OSError on failure)."""
        while True:
            try:
                self._obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
        await self._flush()

    async def recv(self, size: int = _CHUNK) -> bytes:
        """Up to *size* decrypted bytes; ``b""`` at the end of the stream."""
        while True:
            try:
                return self._obj.read(size)
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    async def sendall(self, data: bytes | bytearray | memoryview) -> None:
        """Encrypt and send all of *data*."""
        view = memoryview(data)
        while view:
            written = self._obj.write(view)
            view = view[written:]
            await self._flush()

    async def close(self) -> None:
        """Send close_notify (best effort)."""
        try:
            self._obj.unwrap()
        except (ssl.SSLError, ValueError):
            pass
        try:
            await self._flush()
        except OSError:
            pass
