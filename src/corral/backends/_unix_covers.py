"""Which host unix sockets a bubblewrap sandbox can reach when ``network.allowUnixSockets`` names them.

The sandbox has its own network namespace, so only pathname sockets matter.
With a list of named sockets, the plan empties the directories where services
keep theirs (:data:`SOCKET_DIRS`), binds each named socket back read-only, and
binds ``/dev/null`` over every other socket the host has bound
(:func:`host_unix_listeners`, from ``/proc/net/unix``) that the sandbox would
still see. These covers are the second layer: the broker's ``connect()`` check
(:mod:`._broker_connect`) is what enforces the list (docs/egress.md).
"""

from __future__ import annotations

import os

from .._exceptions import EnforcementUnavailable
from .base import is_under

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._plan import HostFacts

__all__ = [
    "SOCKET_DIRS",
    "corral_sockets",
    "host_unix_listeners",
    "named_socket_paths",
    "unix_socket_mounts",
]

#: Directories replaced by an empty tmpfs when ``network.allowUnixSockets`` lists
#: sockets: where services keep theirs (the named ones are bound back).
SOCKET_DIRS = ("/run", "/var/run")


def corral_sockets(state: str) -> tuple[str, ...]:
    """corral's own sockets in state directory *state*: the server's and the kept shells'.

    ``/proc/net/unix`` names them by an alias (``/proc/self/fd/N/...``) when
    the state directory is too deep for ``sun_path`` (``_wire.bind_unix``):
    :func:`host_unix_listeners` is told their real paths.
    """
    found = [os.path.join(state, "server", "server.sock")]
    shells = os.path.join(state, "shells")
    try:
        found += [
            os.path.join(shells, n) for n in sorted(os.listdir(shells)) if n.endswith(".sock")
        ]
    except OSError:
        pass
    return tuple(found)


def host_unix_listeners(
    *, as_other: bool, also: tuple[str, ...] = ()
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The socket files of the pathname unix sockets bound in this network namespace.

    From ``/proc/net/unix``: every socket a process of the host's network
    namespace has bound to a path (docker.sock, the session bus, ssh-agent,
    corral's own server), wherever it lives, kept when the path is a socket
    file now, as ``(canonical path, closed directories)``. Abstract names
    (``@...``) are left out: the sandbox has its own network namespace, where
    they do not exist. With *as_other* (a root caller's sandbox runs as an
    unrelated uid) the closed directories are the ancestors that others
    cannot search: the plan covers such a socket only where the sandbox owns
    them (idmapped), as bubblewrap could not mount over it otherwise. *also*
    adds paths the table cannot name (:func:`corral_sockets`).
    """
    import stat

    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return ()
    paths = {parts[7] for parts in (line.split(None, 7) for line in lines) if len(parts) == 8}
    paths.update(also)
    found: dict[str, tuple[str, ...]] = {}
    # an alias through another process's /proc/self/fd means nothing here (see *also*)
    for path in sorted(p for p in paths if p.startswith("/") and not p.startswith("/proc/")):
        # the canonical path: bubblewrap mounts below its new root, where an absolute
        # symlink such as /var/run -> /run would not resolve
        real = os.path.realpath(path)
        try:
            if not stat.S_ISSOCK(os.lstat(real).st_mode):
                continue
            closed = tuple(
                d for d in _ancestors(real) if as_other and not os.stat(d).st_mode & stat.S_IXOTH
            )
        except OSError:
            continue
        found[real] = closed
    return tuple(sorted(found.items()))


def _ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``["/", "/a", "/a/b"]``."""
    parts = path.split("/")[1:-1]
    return ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def unix_socket_mounts(
    named: tuple[str, ...],
    facts: HostFacts,
    *,
    writable: list[str],
    hidden: list[str],
    deny_read: tuple[str, ...],
    carves: list[str],
    owned: list[str],
) -> list[str]:
    """The mounts that leave only the *named* host sockets reachable (docs/egress.md).

    The directories in *hidden* and *deny_read* are already empty in the
    sandbox (``/run``, the private ``/tmp``, secrets) except for what *carves*
    (``allowRead``) re-exposes; *owned* are the directories idmapped to a
    root caller's sandbox uid. Each named socket is bound back read-only
    (``connect`` works on a read-only mount, a ``chmod`` does not), and every
    other socket bound on the host (``/proc/net/unix``) that the sandbox would
    still see gets ``/dev/null`` bound over it.

    Raises:
        EnforcementUnavailable: a named socket is missing, is not a socket, lies
            under a directory the sandbox may write (it could replace it), or
            under ``denyRead``.
    """

    def gone(path: str) -> bool:  # hidden, and not bound back in (workspace, allowRead ...)
        return any(is_under(path, h) for h in (*hidden, *deny_read)) and not any(
            is_under(path, c) for c in (*carves, *writable)
        )

    args: list[str] = []
    pairs = facts.detail("unix_named", ())
    assert isinstance(pairs, tuple)
    real: dict[str, str] = dict(pairs)
    bound: set[str] = set()
    for path in named:
        kind = facts.kind(path)
        target = real.get(path, path)
        problem = None
        if kind != "socket":
            problem = "it does not exist" if kind == "missing" else f"it is a {kind}, not a socket"
        elif any(is_under(p, w) for w in writable for p in (path, target)):
            problem = "it is under a directory the sandbox may write, which could replace it"
        elif any(is_under(target, d) for d in deny_read) and gone(target):
            problem = "it is under filesystem.denyRead"
        elif is_under(target, str(facts.detail("corral_state", "/nonexistent"))):
            problem = (
                "it is corral's own (its server would take the connection corral makes "
                "for the sandbox as one of its own clients')"
            )
        if problem is not None:
            raise EnforcementUnavailable(
                f"Failed to enforce network.allowUnixSockets: {path}: {problem}",
                rule="network.allowUnixSockets",
                hint="name a socket the service has created, outside the writable directories",
            )
        args += ["--ro-bind", path, target]
        bound.add(target)
    listeners = facts.detail("unix_listeners", ())
    assert isinstance(listeners, tuple)
    for path, closed in listeners:
        if path in bound or gone(path):
            continue
        if any(not any(is_under(d, o) for o in owned) for d in closed):
            continue  # behind a directory the sandbox's uid cannot search
        args += ["--ro-bind", "/dev/null", path]
    return args


def named_socket_paths(facts: HostFacts) -> tuple[str, ...]:
    """The canonical host paths of ``network.allowUnixSockets`` (from :meth:`inspect`)."""
    named = facts.detail("unix_named", ())
    assert isinstance(named, tuple)
    return tuple(str(canonical) for _path, canonical in named)
