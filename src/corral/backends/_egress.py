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
    "UPSTREAM_CA_ENV",
    "check_request_rules",
    "credentials_for",
    "egress_spec",
    "injected_credentials",
    "local_forwards",
    "mask_placeholder",
    "needs_termination",
    "read_credential_file",
    "trust_bundle",
]

#: The port the proxy listens on inside the sandbox (its own loopback).
PROXY_PORT = 3128
#: A hosts(5) file that replaces DNS for the proxy (tests, air-gapped setups).
HOSTS_ENV = "CORRAL_EGRESS_HOSTS"
#: A PEM file that replaces the system trust store for the hosts the proxy terminates
#: TLS for (tests with their own CA, private registries).
UPSTREAM_CA_ENV = "CORRAL_EGRESS_UPSTREAM_CA"
_MAX_SECRET = 65536
#: Where systems keep their bundle of trusted CAs (the first that exists is used).
TRUST_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Arch, Alpine (ca-certificates)
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL
    "/etc/ssl/ca-bundle.pem",  # openSUSE
    "/etc/ssl/cert.pem",  # Alpine (libressl), macOS
)


def needs_termination(request: ExecRequest, policy: Policy) -> bool:
    """Whether the run's proxy terminates TLS for some hosts (request rules, masked credentials)."""
    network = policy.network
    if network.mode != "allowlist":
        return False
    if network.allow_requests or network.deny_requests:
        return True
    return any(c.mode == "mask" for c in credentials_for(request, policy))


def local_forwards(allow: tuple[str, ...]) -> tuple[tuple[int, str], ...]:
    """``(port, rule)`` of the host's loopback services that ``network.allow`` names by port.

    ``localhost:PORT``, ``127.0.0.1:PORT`` and ``[::1]:PORT`` are forwarded:
    the proxy listens on ``127.0.0.1:PORT`` inside the sandbox and connects to
    the host's ``127.0.0.1:PORT``, so plain clients reach them at the same
    address (their proxy variables skip loopback).
    """
    forwards: dict[int, str] = {}
    for text in allow:
        pattern = parse_pattern(text)
        if pattern.port is None:
            continue
        if (
            (pattern.kind == "name" and pattern.name == "localhost")
            or (pattern.version == 4 and pattern.prefix == 32 and pattern.value == 0x7F000001)
            or (pattern.version == 6 and pattern.prefix == 128 and pattern.value == 1)
        ):
            forwards.setdefault(pattern.port, f"network.allow: {pattern.text}")
    return tuple(sorted(forwards.items()))


def check_unix_sockets(policy: Policy, backend: str) -> None:
    """Refuse ``network.allowUnixSockets`` as a list of paths where it cannot hold.

    Only bubblewrap hides the host's other sockets (docs/egress.md), and only
    in its own network namespace: in ``"open"`` mode every abstract socket of
    the host (``@/tmp/.X11-unix/X0``, session buses, corral's own slots) is
    reachable, which no mount can hide.

    Raises:
        EnforcementUnavailable: another backend, or ``"open"`` mode.
    """
    network = policy.network
    if not isinstance(network.allow_unix_sockets, tuple):
        return
    if backend != "bubblewrap":
        why = f"the {backend} backend cannot hide the host's other sockets"
    elif network.mode == "open":
        why = (
            'network.mode "open" shares the host\'s network namespace, so every abstract '
            "unix socket of the host stays reachable"
        )
    else:
        return
    raise EnforcementUnavailable(
        f"Failed to enforce network.allowUnixSockets (a list of sockets): {why}",
        rule="network.allowUnixSockets",
        hint='use the bubblewrap backend with network.mode "none" or "allowlist", or true',
    )


def check_request_rules(policy: Policy, *, terminating: bool, backend: str) -> None:
    """Refuse request rules that this run cannot enforce.

    They are enforced by corral's proxy with TLS termination (allowlist mode
    on a backend that supports it: *terminating*); with ``network.mode =
    "none"`` nothing is reachable, so they hold trivially.

    Raises:
        EnforcementUnavailable: ``"open"`` mode, or a backend without termination.
    """
    network = policy.network
    if not (network.allow_requests or network.deny_requests) or network.mode == "none":
        return
    if network.mode == "open":
        why = 'network.mode "open" reaches the network without corral\'s proxy'
    elif not terminating:
        why = f"the {backend} backend's proxy does not terminate TLS"
    else:
        return
    rule = "network.denyRequests" if network.deny_requests else "network.allowRequests"
    raise EnforcementUnavailable(
        f"Failed to enforce {rule}: {why}",
        rule=rule,
        hint='use network.mode "allowlist" with the bubblewrap backend',
    )


def mask_placeholder(token: str, name: str) -> str:
    """The per-run placeholder the sandbox sees for the masked credential *name*.

    Derived from the run's random proxy token (so it changes every run) by a
    one-way hash: it reveals nothing about the secret or the token.
    """
    import hashlib

    digest = hashlib.sha256(f"corral-mask\0{token}\0{name}".encode()).hexdigest()
    return f"corral_masked_{digest[:40]}"


def trust_bundle(ca_cert: bytes) -> tuple[str, bytes]:
    """``(path, contents)``: the host's CA bundle with *ca_cert* appended, and where it lives.

    Raises:
        EnforcementUnavailable: the host has no CA bundle file to extend.
    """
    for path in TRUST_BUNDLES:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        return os.path.realpath(path), data.rstrip(b"\n") + b"\n" + ca_cert
    raise EnforcementUnavailable(
        "Failed to enforce masked credentials or request rules: this host has no CA bundle "
        "(" + ", ".join(TRUST_BUNDLES) + ") to add corral's per-run CA to",
        rule="credentials",
        hint="install ca-certificates",
    )


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


def egress_spec(
    policy: Policy,
    facts: HostFacts,
    *,
    request: ExecRequest | None = None,
    terminating: bool = False,
    backend: str = "",
) -> EgressSpec:
    """The proxy's configuration for *policy* (allowlist mode).

    With *terminating* (a backend that gives the sandbox the per-run CA's
    trust bundle), the spec carries the request rules, the masked
    credentials that apply to *request* and the CA; otherwise request rules
    are refused (masked credentials are refused by :func:`injected_credentials`).

    Raises:
        UsageError: a host pattern is invalid or over-broad (possible only
            for a Policy built in code: the settings loader refuses those), or
            ``CORRAL_EGRESS_HOSTS`` is not an absolute path.
        LaunchFailed: the facts carry no proxy token (``inspect_host`` draws one).
        EnforcementUnavailable: request rules without *terminating*, or TLS
            termination is needed but no CA could be drawn (``cryptography``
            missing).
    """
    check_request_rules(policy, terminating=terminating, backend=backend)
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
    forwards = local_forwards(network.allow)
    for port, rule in forwards:
        if port == PROXY_PORT:
            raise UsageError(
                f"{rule}: port {PROXY_PORT} is the egress proxy's own port inside the sandbox",
                hint="run the local service on another port",
            )
    spec = EgressSpec(
        allow=network.allow,
        deny=network.deny,
        port=PROXY_PORT,
        token=facts.egress_token,
        hosts_file=hosts_file,
        forwards=forwards,
    )
    if not terminating:
        return spec
    masks = _masks(request, policy, facts) if request is not None else ()
    if not (masks or network.allow_requests or network.deny_requests):
        return spec
    if not facts.egress_ca:
        raise EnforcementUnavailable(
            "Failed to enforce masked credentials or request rules: corral could not draw "
            "the per-run CA for TLS termination (the 'cryptography' package is missing)",
            rule="credentials" if masks else "network.denyRequests",
            hint="pip install 'corral[egress]'",
        )
    upstream_ca = dict(facts.environ).get(UPSTREAM_CA_ENV) or None
    if upstream_ca is not None and not upstream_ca.startswith("/"):
        raise UsageError(f"{UPSTREAM_CA_ENV}={upstream_ca!r} must be an absolute path")
    return spec.replace(
        allow_requests=network.allow_requests,
        deny_requests=network.deny_requests,
        masks=masks,
        ca=facts.egress_ca,
        upstream_ca=upstream_ca,
    )


def _masks(
    request: ExecRequest, policy: Policy, facts: HostFacts
) -> tuple[tuple[str, str, str, tuple[str, ...], tuple[str, ...], bool], ...]:
    """``(name, placeholder, secret, hosts, headers, query)`` of the masked credentials that apply."""
    return tuple(
        (
            credential.name,
            mask_placeholder(facts.egress_token, credential.name),
            value,
            credential.hosts,
            credential.headers or ("authorization",),
            credential.query,
        )
        for credential, value in _credential_values(request, policy, facts)
        if credential.mode == "mask"
    )


def injected_credentials(
    request: ExecRequest, policy: Policy, facts: HostFacts, *, masking: bool = False
) -> tuple[tuple[str, str], ...]:
    """``(name, value)`` of the credentials this command receives (see
    :mod:`corral.policy._credentials`), values taken from the host
    environment or the files ``inspect_host`` read. With *masking* (the
    backend's proxy terminates TLS: :func:`egress_spec` with
    ``terminating=True``), a ``"mask"`` credential's value is its per-run
    placeholder (:func:`mask_placeholder`).

    Raises:
        UsageError: a credential applies but its source is unset, unreadable,
            empty, too large or contains a NUL byte (the command would
            otherwise run without the secret it was configured to get).
        EnforcementUnavailable: a ``"mask"`` credential applies without
            *masking* (this backend's proxy cannot substitute it) or outside
            allowlist mode.
    """
    injected: list[tuple[str, str]] = []
    for credential, value in _credential_values(request, policy, facts):
        if credential.mode == "mask":
            if not masking or policy.network.mode != "allowlist":
                raise EnforcementUnavailable(
                    f'Failed to enforce credentials ({credential.name}): mode "mask" needs '
                    "corral's proxy to substitute it in TLS it terminates (network.mode "
                    '"allowlist" on the bubblewrap backend)',
                    rule="credentials",
                    hint=f'use "mode": "env" for {credential.name}, or the bubblewrap backend',
                )
            value = mask_placeholder(facts.egress_token, credential.name)
        injected.append((credential.name, value))
    return tuple(injected)


def _credential_values(
    request: ExecRequest, policy: Policy, facts: HostFacts
) -> list[tuple[Credential, str]]:
    """``(credential, secret)`` of the credentials that apply to *request*. Raises UsageError."""
    environ = dict(facts.environ)
    files = dict(facts.credential_files)
    values: list[tuple[Credential, str]] = []
    for credential in credentials_for(request, policy):
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
        if credential.mode == "mask" and not value.isprintable():
            raise UsageError(
                f"Failed to inject the credential {credential.name}: {where_text} contains "
                "control characters or line breaks, which cannot go in an HTTP header"
            )
        values.append((credential, value))
    return values
