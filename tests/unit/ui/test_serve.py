"""``corral ui`` listens on loopback only: the address check happens before any socket."""

from __future__ import annotations

import pytest

from corral._exceptions import InvalidRequest
from corral.ui._serve import bind, loopback_address


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.9.8.7", "127.9.8.7"),
        ("localhost", "127.0.0.1"),
        ("::1", "::1"),
        ("[::1]", "::1"),
    ],
)
def test_loopback_addresses_are_accepted(given: str, address: str) -> None:
    assert loopback_address(given) == address


@pytest.mark.parametrize("given", ["0.0.0.0", "::", "10.0.0.1", "192.0.2.1", "example.com", ""])
def test_everything_else_is_refused(given: str) -> None:
    with pytest.raises(InvalidRequest):
        loopback_address(given)


def test_bind_takes_a_free_port_and_mints_distinct_secrets() -> None:
    first, keys = bind("127.0.0.1", 0)
    second, other = bind("127.0.0.1", 0)
    try:
        assert first.getsockname()[1] == keys.port > 0 and keys.port != other.port
        assert keys.token != keys.csrf and keys.token != other.token and len(keys.token) >= 43
        assert keys.origin == f"http://127.0.0.1:{keys.port}"
        assert keys.allowed_hosts() == {f"127.0.0.1:{keys.port}", f"localhost:{keys.port}"}
    finally:
        first.close()
        second.close()


WITHOUT_EXTRA = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("starlette", "uvicorn", "jinja2", "pygments"):
            raise ImportError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Absent())
from corral.cli import main
sys.exit(main(["ui", "--no-open"]))
"""


def test_without_the_extra_it_says_what_to_install() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRA], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 125
    assert b"needs the optional extra 'ui'" in done.stderr
    assert b"pip install 'corral[ui]'" in done.stderr
