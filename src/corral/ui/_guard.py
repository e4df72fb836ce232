"""The access rules of ``corral ui``, as one ASGI middleware in front of every route.

The page can apply a preview to the user's workspace, so it is guarded like a
credential:

- **Token**: every request, static files included, carries the per-start
  secret as ``?token=`` (compared in constant time); anything else is 403.
  The token travels in the URL rather than in a cookie because cookies are
  not scoped by port: another local web server on ``127.0.0.1`` (another
  user's) would receive a cookie set here.
- **Host**: the ``Host`` header must name the loopback address and port the
  server listens on (or ``localhost``), so a DNS-rebinding page cannot reach
  it under a name of its own.
- **Methods**: ``GET``/``HEAD`` never change state; every change is a
  ``POST`` whose form carries the per-start CSRF token (a second secret,
  embedded in the page's forms) and whose ``Origin``, when the browser sends
  one, is this server's. Other methods are 405.
- **Headers**: a strict Content-Security-Policy (only this server's own
  scripts and styles, nothing inline, no framing), a ``same-origin``
  referrer policy (the token never leaves in a ``Referer``; ``no-referrer``
  would make the browser send ``Origin: null`` with the page's own forms),
  ``nosniff``, ``no-store``.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["MAX_FORM_BYTES", "Guard", "Secrets"]

#: the largest form a POST may send (the page's forms are a few hundred bytes)
MAX_FORM_BYTES = 64 * 1024

_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_HEADERS = [
    (b"content-security-policy", _CSP.encode()),
    (b"referrer-policy", b"same-origin"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


class Secrets:
    """The per-start secrets and the address they are valid for."""

    def __init__(self, token: str, csrf: str, host: str, port: int) -> None:
        self.token = token
        self.csrf = csrf
        self.host = host
        self.port = port

    @property
    def origin(self) -> str:
        """``http://HOST:PORT`` as the browser sends it in ``Origin``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def allowed_hosts(self) -> set[str]:
        """The ``Host`` header values accepted."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return {f"{host}:{self.port}", f"localhost:{self.port}"}


async def _refuse(send: Send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _same(given: str | None, secret: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), secret.encode())


class Guard:
    """ASGI middleware enforcing the module's rules before *app* sees a request."""

    def __init__(self, app: ASGIApp, secrets: Secrets) -> None:
        self.app = app
        self.secrets = secrets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if headers.get("host") not in self.secrets.allowed_hosts():
            await _refuse(send, 403, "corral ui: refused: wrong Host header")
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        token = query.get("token", [None])[0]
        if not _same(token, self.secrets.token):
            await _refuse(send, 403, "corral ui: refused: missing or wrong token")
            return
        method = scope["method"]
        if method == "POST":
            replay = await self._check_post(scope, receive, send, headers)
            if replay is None:
                return
            receive = replay
        elif method not in ("GET", "HEAD"):
            await _refuse(send, 405, "corral ui: method not allowed")
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _check_post(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]
    ) -> Receive | None:
        """Check a POST's origin and CSRF token; return a ``receive`` replaying its body."""
        origin = headers.get("origin")
        if origin is not None and origin != self.secrets.origin:
            await _refuse(send, 403, "corral ui: refused: cross-origin request")
            return None
        if headers.get("content-type", "").split(";")[0].strip() != (
            "application/x-www-form-urlencoded"
        ):
            await _refuse(send, 415, "corral ui: refused: expected a form")
            return None
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_FORM_BYTES:
                await _refuse(send, 413, "corral ui: refused: form too large")
                return None
        form = parse_qs(body.decode("utf-8", "replace"))
        if not _same(form.get("csrf", [None])[0], self.secrets.csrf):
            await _refuse(send, 403, "corral ui: refused: missing or wrong CSRF token")
            return None
        scope["corral.form"] = form
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay
