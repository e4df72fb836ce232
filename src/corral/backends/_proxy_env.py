"""The environment that points a sandbox's tools at corral's egress proxy.

In allowlist mode the sandbox has no route out; these variables send the
well-known tools to the proxy on the sandbox's own loopback. The URL carries
the per-sandbox credential (``corral:TOKEN@``), which curl, git (libcurl),
pip/requests, Python's urllib, npm and Go send as ``Proxy-Authorization``.
Each row is ``(name, value template, reason)``; ``{http}`` and ``{socks}``
are the two proxy URLs.

Not covered: tools that ignore the proxy variables (they fail to connect,
nothing leaks), ``git://`` (use https), Java (set ``-Dhttps.proxyHost`` by
hand; Java does not take credentials from the URL).
"""

from __future__ import annotations

__all__ = ["NO_PROXY", "PROXY_ENV", "TRUST_ENV", "proxy_environment", "trust_environment"]

#: Destinations reached directly: the sandbox's own loopback services.
NO_PROXY = "localhost,127.0.0.1,::1"

PROXY_ENV: tuple[tuple[str, str, str], ...] = (
    ("HTTP_PROXY", "{http}", "plain-HTTP requests (most tools read one of the two spellings)"),
    ("http_proxy", "{http}", "plain-HTTP requests (curl reads only the lower-case name)"),
    ("HTTPS_PROXY", "{http}", "HTTPS through CONNECT tunnels; TLS stays end to end"),
    ("https_proxy", "{http}", "HTTPS through CONNECT tunnels (lower-case spelling)"),
    ("ALL_PROXY", "{socks}", "other protocols through SOCKS5 with remote name resolution"),
    ("all_proxy", "{socks}", "other protocols through SOCKS5 (lower-case spelling)"),
    ("NO_PROXY", NO_PROXY, "the sandbox's own loopback services are reached directly"),
    ("no_proxy", NO_PROXY, "the sandbox's own loopback services (lower-case spelling)"),
    ("npm_config_proxy", "{http}", "npm and pnpm: plain-HTTP registries"),
    ("npm_config_https_proxy", "{http}", "npm and pnpm: HTTPS registries"),
    ("npm_config_noproxy", NO_PROXY, "npm and pnpm: loopback directly"),
    ("YARN_HTTP_PROXY", "{http}", "Yarn 2+ reads its own variables"),
    ("YARN_HTTPS_PROXY", "{http}", "Yarn 2+ reads its own variables"),
    ("NODE_USE_ENV_PROXY", "1", "Node.js's built-in fetch honours the proxy variables (Node 24+)"),
)


def proxy_environment(
    port: int, token: str, host: str = "127.0.0.1"
) -> tuple[tuple[str, str], ...]:
    """The ``(name, value)`` pairs for a proxy on ``host:port`` with credential *token*
    (*host*: the sandbox's own loopback, or the micro-VM's forwarded proxy address)."""
    http = f"http://corral:{token}@{host}:{port}"
    socks = f"socks5h://corral:{token}@{host}:{port}"
    return tuple((name, value.format(http=http, socks=socks)) for name, value, _reason in PROXY_ENV)


#: Variables that make the usual tools trust the CA bundle with corral's per-run CA
#: (only when the proxy terminates TLS for some hosts: request rules, masked
#: credentials). The bundle is also mounted over the system's bundle path, so
#: tools that read the default location need nothing.
TRUST_ENV: tuple[tuple[str, str], ...] = (
    ("SSL_CERT_FILE", "OpenSSL's default (Python's ssl, Ruby, many C programs)"),
    ("REQUESTS_CA_BUNDLE", "Python requests (and pip's vendored copy) use certifi otherwise"),
    ("CURL_CA_BUNDLE", "curl and libcurl users"),
    ("GIT_SSL_CAINFO", "git over HTTPS"),
    ("PIP_CERT", "pip"),
    ("NODE_EXTRA_CA_CERTS", "Node.js (npm, Claude Code) adds these to its built-in roots"),
)


def trust_environment(bundle_path: str) -> tuple[tuple[str, str], ...]:
    """The ``(name, value)`` pairs pointing every tool of :data:`TRUST_ENV` at *bundle_path*."""
    return tuple((name, bundle_path) for name, _reason in TRUST_ENV)
