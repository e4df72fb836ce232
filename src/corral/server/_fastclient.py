"""The compiled fast client, ``_bin/corral-client``: where it is and how it falls back.

``corral-client`` (``native/corral-client.c`` and ``native/client/``) serves ``corral run`` and
``corral hook claude-code`` through the corral server without starting an
interpreter (docs/design.md, "The fast client"). Whenever the server cannot
serve, it execs corral's *Python* command line - and a compiled program
cannot know which interpreter that is. So the Python side records it:

* **the sidecar** ``_bin/corral-client.cli``, next to the binary: one line,
  the absolute path of the interpreter of the installation the binary belongs
  to (``sys.executable`` of a process running this package). The fast client
  execs ``<interpreter> -P -c "from corral.cli import main ..." ARGS`` and
  trusts the file only when it is a regular file owned by the binary's owner
  (or root) and writable by nobody else. :func:`usable_client` writes it when
  the Python side first chooses the fast client (the hook's rewrite, ``corral
  install``, a server starting) and checks it on every use; a binary whose
  sidecar cannot be written (a read-only installation) is not used.
* **the code stamp** the binary sends, ``"c1:" + realpath``: a server accepts
  it only when that is its own package's binary (:func:`client_stamp`).
* **the plugin record** ``<state dir>/fast-client``: two lines, the ``corral``
  script that wrote it and the fast client. The Claude Code plugin's hook
  script (``plugins/corral/hooks/corral-hook``) uses the fast client only when
  the first line is the ``corral`` it finds on ``PATH`` (:func:`note_for_plugin`).

This module is on the hook's hot path: it imports only :mod:`os` and :mod:`sys`.
"""

from __future__ import annotations

import os
import sys

__all__ = [
    "CLIENT_NAME",
    "PLUGIN_RECORD",
    "SIDECAR_SUFFIX",
    "client_path",
    "client_stamp",
    "note_for_plugin",
    "usable_client",
]

CLIENT_NAME = "corral-client"
SIDECAR_SUFFIX = ".cli"
PLUGIN_RECORD = "fast-client"
_MAX_SIDECAR = 4096


def client_path() -> str:
    """Where this installation's fast client is (whether or not it was built)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(package, "_bin", CLIENT_NAME)


def client_stamp() -> str:
    """The code stamp this installation's fast client sends: ``"c1:"`` + its real path."""
    return "c1:" + os.path.realpath(client_path())


def _trusted_content(path: str, owner: int) -> bytes | None:
    """The sidecar's bytes when the fast client would trust the file, else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000 or st.st_mode & 0o022:
            return None
        if st.st_uid not in (owner, 0):
            return None
        return os.read(fd, _MAX_SIDECAR + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def _write_atomically(path: str, content: bytes) -> bool:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644
        )
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    return True


def usable_client(executable: str | None = None) -> str | None:
    """The fast client's path when it is built and can fall back to this installation.

    *executable* is the interpreter its fallback must exec (default:
    ``sys.executable``). The sidecar is written when it is missing, names
    another interpreter, or would not be trusted by the binary; ``None`` when
    the binary is missing or not executable, or the sidecar cannot be
    written - callers then use the Python CLI, as before the fast client.
    """
    from ..policy._watched import depends_on

    path = client_path()
    depends_on(path)
    depends_on(path + SIDECAR_SUFFIX)
    interpreter = sys.executable if executable is None else executable
    if not interpreter or not interpreter.startswith("/") or "\n" in interpreter:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    if (st.st_mode & 0o170000) != 0o100000 or not os.access(path, os.X_OK):
        return None
    expected = os.fsencode(interpreter) + b"\n"
    if b"\0" in expected or len(expected) >= _MAX_SIDECAR:
        return None
    sidecar = path + SIDECAR_SUFFIX
    recorded = _trusted_content(sidecar, st.st_uid)
    if recorded is not None and _same_interpreter(recorded, interpreter):
        return path
    return path if _write_atomically(sidecar, expected) else None


def _same_interpreter(recorded: bytes, interpreter: str) -> bool:
    """Whether the sidecar's line names *interpreter* or its twin in the same directory.

    ``venv/bin/python`` and ``venv/bin/python3`` are one environment (the
    directory decides which ``pyvenv.cfg`` applies): accepting either keeps
    two callers from rewriting the file in turn.
    """
    if not recorded.endswith(b"\n") or recorded.count(b"\n") != 1:
        return False
    other = os.fsdecode(recorded[:-1])
    if other == interpreter:
        return True
    return os.path.dirname(other) == os.path.dirname(interpreter) and os.path.realpath(
        other
    ) == os.path.realpath(interpreter)


def note_for_plugin(state_dir: str, corral: str, fast: str | None) -> None:
    """Keep the plugin record (``<state_dir>/fast-client``) in step with *fast*.

    *corral* is the absolute path of the ``corral`` script this process runs
    as; the plugin's hook script uses the recorded fast client only when that
    script is the ``corral`` on its ``PATH``. With *fast* None (not usable) a
    record of this script is removed. Best effort: errors are ignored.
    """
    path = os.path.join(state_dir, PLUGIN_RECORD)
    try:
        with open(path, "rb") as f:
            current: bytes | None = f.read(2 * _MAX_SIDECAR)
    except OSError:
        current = None
    mine = os.fsencode(corral) + b"\n"
    try:
        if fast is None:
            if current is not None and current.startswith(mine):
                os.unlink(path)
            return
        wanted = mine + os.fsencode(fast) + b"\n"
        if current != wanted:
            from .._state import ensure_dir

            ensure_dir(state_dir)
            _write_atomically(path, wanted)
    except OSError:
        pass
