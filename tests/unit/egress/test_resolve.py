"""Name resolution for the proxy: the static hosts table and the system resolver."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from corral.egress._resolve import Resolver, StaticResolver, SystemResolver, read_hosts_file
from corral.policy._hosts import parse_host


def test_the_static_table_answers_canonical_names_and_nothing_else() -> None:
    resolver = StaticResolver({"Example.TEST.": ["127.0.0.1", "::1"], "b.test": ["0x7f.2"]})
    assert asyncio.run(resolver.resolve("example.test", 443)) == [
        parse_host("127.0.0.1"),
        parse_host("::1"),
    ]
    assert asyncio.run(resolver.resolve("b.test", 80)) == [parse_host("127.0.0.2")]
    with pytest.raises(LookupError, match="not in the static hosts table"):
        asyncio.run(resolver.resolve("unknown.test", 80))


def test_the_static_table_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="is an address, not a name"):
        StaticResolver({"127.0.0.1": ["127.0.0.1"]})
    with pytest.raises(ValueError, match="must be IP addresses"):
        StaticResolver({"a.test": ["b.test"]})


def test_reads_a_hosts_file(tmp_path: Any) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# test names\n127.0.0.1 a.test b.test  # both\n\n::1 a.test\n")
    resolver = read_hosts_file(str(hosts))
    assert [h.text for h in asyncio.run(resolver.resolve("a.test", 1))] == ["127.0.0.1", "::1"]
    hosts.write_text("127.0.0.1\n")
    with pytest.raises(ValueError, match=r"hosts:1: expected 'ADDRESS NAME \[NAME\.\.\.\]'"):
        read_hosts_file(str(hosts))
    hosts.write_text("not-an-address a.test\n")
    with pytest.raises(ValueError, match="must be IP addresses"):
        read_hosts_file(str(hosts))
    hosts.write_bytes(b"#" * ((1 << 20) + 1))
    with pytest.raises(ValueError, match="larger than"):
        read_hosts_file(str(hosts))
    with pytest.raises(OSError, match="No such file"):
        read_hosts_file(str(tmp_path / "missing"))


def test_the_system_resolver_returns_canonical_addresses() -> None:
    # a numeric host: getaddrinfo answers without any lookup
    assert asyncio.run(SystemResolver().resolve("127.000.000.001", 80)) == [parse_host("127.0.0.1")]


def test_the_base_resolver_is_abstract() -> None:
    with pytest.raises(NotImplementedError):
        asyncio.run(Resolver().resolve("a.test", 1))
