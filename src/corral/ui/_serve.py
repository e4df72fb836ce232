"""Start ``corral ui``: bind a loopback socket, mint the secrets, run uvicorn.

A non-loopback address is refused before anything listens (the page can
apply changes to the user's workspace). Port 0 (the default) takes a free
port from the kernel. The URL printed (and opened in a browser, where there
is a graphical one) carries the per-start token; uvicorn's access log is off
so the token is never written to a log.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import sys
from typing import TYPE_CHECKING

from .._exceptions import InvalidRequest

if TYPE_CHECKING:
    from typing import TextIO

    from ._guard import Secrets

__all__ = ["bind", "loopback_address", "serve"]


def loopback_address(host: str) -> str:
    """*host* as a loopback IP literal (``localhost`` is ``127.0.0.1``).

    Raises:
        InvalidRequest: *host* is not a loopback address.
    """
    if host == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise InvalidRequest(
            f"Failed to start corral ui: {host!r} is not an IP address",
            hint="give a loopback address: 127.0.0.1 (the default) or ::1",
        ) from None
    if not address.is_loopback:
        raise InvalidRequest(
            f"Failed to start corral ui: {host} is not a loopback address; the page can apply "
            "changes to your workspace, so it listens on loopback only",
            hint="use 127.0.0.1 (the default) or ::1; reach it from elsewhere with an SSH tunnel",
        )
    return str(address)


def bind(host: str, port: int) -> tuple[socket.socket, Secrets]:
    """A listening socket on loopback *host*:*port* and fresh secrets for it.

    Raises:
        InvalidRequest: *host* is not loopback.
        OSError: the port is taken.
    """
    from ._guard import Secrets

    address = loopback_address(host)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(64)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]
    return sock, Secrets(
        token=secrets.token_urlsafe(32),
        csrf=secrets.token_urlsafe(32),
        host=address,
        port=bound_port,
    )


def _has_graphical_browser() -> bool:
    if sys.platform == "darwin":
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def serve(
    state_dir: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    open_browser: bool = True,
    announce: TextIO | None = None,
) -> None:
    """Serve the UI for *state_dir* until interrupted.

    The URL is written to *announce* (a text stream; default stdout) as
    ``corral ui: http://127.0.0.1:PORT/?token=...`` before serving.
    """
    import uvicorn

    from ._app import build_app

    sock, keys = bind(host, port)
    url = f"{keys.origin}/?token={keys.token}"
    stream = announce if announce is not None else sys.stdout
    stream.write(f"corral ui: {url}\n")
    stream.flush()
    if open_browser and _has_graphical_browser():
        import webbrowser

        webbrowser.open(url)
    config = uvicorn.Config(
        build_app(state_dir, keys),
        log_level="warning",
        access_log=False,
        lifespan="off",
        ws="none",
        http="h11",
        timeout_graceful_shutdown=1,
        server_header=False,
    )
    uvicorn.Server(config).run(sockets=[sock])
