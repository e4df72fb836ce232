"""Planning egress and scoped credentials: policy -> EgressSpec and injected variables. Pure.

Shared by the backends that give a sandbox its own network namespace and run
corral's proxy for it (``network.mode = "allowlist"``), and by every backend
that injects credentials (DESIGN §4 ``credentials``).
"""

from __future__ import annotations

import os

from .._exceptions import EnforcementUnavailable, UsageError
from ..policy._credentials import applicable_credentials
from ..policy._hosts import broad_pattern_problem, parse_pattern
from ._plan import EgressSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..pipeline._request import ExecRequest
    from ..policy._model import Credential, Policy
    from ._plan import HostFacts

__all__ = [
    "HOSTS_ENV",
    "PROXY_PORT",
    "credentials_for",
    "egress_spec",
    "injected_credentials",
    "read_credential_file",
]

#: The port the proxy listens on inside the sandbox (its own loopback).
PROXY_PORT = 3128
#: A hosts(5) file that replaces DNS for the proxy (tests, air-gapped setups).
HOSTS_ENV = "CORRAL_EGRESS_HOSTS"
_MAX_SECRET = 65536


def credentials_for(request: ExecRequest, policy: Policy) -> tuple[Credential, ...]:
    """The credentials *request* receives under *policy*.

    Raises:
        UsageError: a credential's host pattern is invalid (possible only for
            a Policy built in code).
    """
    try:
        return applicable_credentials(policy, request.command_line())
    except ValueError as exc:
        raise UsageError(f"credentials: invalid host pattern: {exc}") from None


def read_credential_file(path: str) -> str | None:
    """The secret in *path* (one trailing newline removed), or ``None`` when it is not a
    readable regular file of at most 64 KiB of UTF-8. Used by ``inspect_host``.
    """
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, _MAX_SECRET + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > _MAX_SECRET:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text.removesuffix("\n").removesuffix("\r")


def egress_spec(policy: Policy, facts: HostFacts) -> EgressSpec:
    """The proxy's configuration for *policy* (allowlist mode).

    Raises:
        UsageError: a host pattern is invalid or over-broad (possible only
            for a Policy built in code: the settings loader refuses those), or
            ``CORRAL_EGRESS_HOSTS`` is not an absolute path.
        LaunchFailed: the facts carry no proxy token (``inspect_host`` draws one).
    """
    network = policy.network
    for key, patterns, opening in (
        ("network.allow", network.allow, True),
        ("network.deny", network.deny, False),
    ):
        for text in patterns:
            try:
                pattern = parse_pattern(text)
            except ValueError as exc:
                raise UsageError(f"{key}: {text!r} is not a valid host pattern: {exc}") from None
            problem = broad_pattern_problem(pattern) if opening else None
            if problem is not None:
                raise UsageError(
                    f"{key}: {text!r} is too broad: {problem}",
                    hint="list the hosts the sandbox needs",
                )
    if not facts.egress_token:
        from .._exceptions import LaunchFailed

        raise LaunchFailed(
            "Failed to plan the egress proxy: no proxy credential was drawn for this run"
        )
    hosts_file = dict(facts.environ).get(HOSTS_ENV) or None
    if hosts_file is not None and not hosts_file.startswith("/"):
        raise UsageError(f"{HOSTS_ENV}={hosts_file!r} must be an absolute path")
    return EgressSpec(
        allow=network.allow,
        deny=network.deny,
        port=PROXY_PORT,
        token=facts.egress_token,
        hosts_file=hosts_file,
    )


def injected_credentials(
    request: ExecRequest, policy: Policy, facts: HostFacts
) -> tuple[tuple[str, str], ...]:
    """``(name, value)`` of the credentials this command receives (see
    :mod:`corral.policy._credentials`), values taken from the host
    environment or the files ``inspect_host`` read.

    Raises:
        UsageError: a credential applies but its source is unset, unreadable,
            empty, too large or contains a NUL byte (the command would
            otherwise run without the secret it was configured to get).
        EnforcementUnavailable: a ``"mask"`` credential applies (proxy-side
            substitution needs TLS interception, which corral does not do).
    """
    environ = dict(facts.environ)
    files = dict(facts.credential_files)
    injected: list[tuple[str, str]] = []
    for credential in credentials_for(request, policy):
        if credential.mode != "env":
            raise EnforcementUnavailable(
                f"Failed to enforce credentials ({credential.name}): mode {credential.mode!r} "
                "needs the proxy to rewrite requests inside TLS, which corral does not do",
                rule="credentials",
                hint=f'use "mode": "env" for {credential.name}',
            )
        scheme, _, where = credential.source.partition(":")
        value = environ.get(where) if scheme == "env" else files.get(credential.source)
        where_text = f"the host variable {where}" if scheme == "env" else f"the file {where}"
        if value is None:
            raise UsageError(
                f"Failed to inject the credential {credential.name}: {where_text} is "
                + ("not set" if scheme == "env" else "not readable"),
                hint=f"set it, or remove {credential.name} from credentials",
            )
        if not value or "\x00" in value or len(value) > _MAX_SECRET:
            raise UsageError(
                f"Failed to inject the credential {credential.name}: {where_text} is empty, "
                f"too large or contains a NUL byte"
            )
        injected.append((credential.name, value))
    return tuple(injected)
