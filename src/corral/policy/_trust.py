"""Trust records: which project settings files the user has accepted.

A project's ``.corral/settings.json`` and ``.corral/settings.local.json`` live
in the repository the agent works on, so corral treats them as untrusted (they
may only tighten the policy) until the user runs ``corral trust``. That
records the SHA-256 of each file's exact bytes in
``$XDG_STATE_HOME/corral/trust.json``; a file whose bytes change is untrusted
again. The state directory is unreadable inside the sandbox (a default
``denyRead`` row), so a sandboxed command cannot trust its own settings.

Format (version 1)::

    {"version": 1,
     "files": {"/src/app/.corral/settings.json":
                 {"sha256": "<64 hex digits>", "trustedAt": "2025-01-31T12:00:00Z"}}}

Writes are atomic (temporary file + rename, mode 0600) and serialised by an
advisory lock on ``trust.json.lock``.
"""

from __future__ import annotations

import os
import posixpath

from .._exceptions import SettingsError
from .._frozen import Record
from .._jsonfast import dumps, loads
from ._digest import sha256_hex
from ._files import (
    check_confined_dirs,
    error_reason,
    read_settings_file,
    read_small_file,
    write_file_atomically,
)
from ._locations import default_home, project_settings_files, trust_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ._keys import KeyTable

__all__ = [
    "TRUST_CHANGED",
    "TRUST_MISSING",
    "TRUST_TRUSTED",
    "TRUST_UNTRUSTED",
    "TrustStatus",
    "read_trust_records",
    "trust_project",
    "trust_status",
]

TRUST_TRUSTED = "trusted"  # recorded, and the bytes match
TRUST_UNTRUSTED = "untrusted"  # never trusted
TRUST_CHANGED = "changed"  # trusted once; the bytes changed since
TRUST_MISSING = "missing"  # no such file

_VERSION = 1
_UNTRUSTED = "treating project settings as untrusted"


class TrustStatus(Record):
    """The trust state of one project settings file (for ``corral trust --status``).

    Attributes:
        path: absolute path of the file.
        state: ``"trusted"``, ``"untrusted"``, ``"changed"`` or ``"missing"``.
        sha256: digest of the file's current bytes (``None`` when missing).
    """

    path: str
    state: str
    sha256: str | None = None


def read_trust_records(path: str) -> tuple[dict[str, str], str | None]:
    """Return ``({settings file: sha256}, problem)`` from the trust file at *path*.

    A missing file means no records. A malformed or unreadable one also gives
    no records (everything stays untrusted: fail closed) and a *problem*
    message saying why, for a warning.
    """
    try:
        data = read_small_file(path, below=_records_base(path))
    except (OSError, ValueError) as exc:
        return {}, f"cannot read trust records {path}: {error_reason(exc)}; {_UNTRUSTED}"
    if data is None:
        return {}, None
    try:
        records = _parse_records(data)
    except ValueError as exc:  # JSONError is a ValueError
        return {}, f"ignoring malformed trust records {path}: {exc}; {_UNTRUSTED}"
    return records, None


def _records_base(path: str) -> str:
    """The XDG base directory above ``corral/trust.json``: no link is followed below it."""
    return posixpath.dirname(posixpath.dirname(path))


def _parse_records(data: bytes) -> dict[str, str]:
    document = loads(data)
    if not isinstance(document, dict) or document.get("version") != _VERSION:
        raise ValueError(f'expected an object with "version": {_VERSION}')
    files = document.get("files")
    if not isinstance(files, dict):
        raise ValueError('expected "files" to be an object')
    records: dict[str, str] = {}
    for name, entry in files.items():
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(digest, str) or len(digest) != 64:
            raise ValueError(f"bad record for {name}")
        records[name] = digest
    return records


def _resolve(
    workspace: str,
    home: str | None,
    environ: Mapping[str, str] | None,
) -> tuple[str, str, Mapping[str, str]]:
    env = os.environ if environ is None else environ
    home = default_home(env) if home is None else home
    workspace = posixpath.normpath(posixpath.join(os.getcwd(), workspace))
    if not posixpath.isdir(workspace):
        raise SettingsError(
            f"workspace {workspace} does not exist or is not a directory",
            hint="pass --workspace DIR",
        )
    return workspace, home, env


def trust_status(
    workspace: str, *, home: str | None = None, environ: Mapping[str, str] | None = None
) -> list[TrustStatus]:
    """Return the trust state of the project settings files of *workspace*.

    Args:
        workspace: the project directory.
        home: the home directory (default: from *environ*).
        environ: the environment, for ``XDG_STATE_HOME`` (default: ``os.environ``).

    Raises:
        SettingsError: the workspace does not exist, or a file cannot be read.

    Example::

        for status in trust_status("/src/app"):
            print(status.state, status.path)
    """
    workspace, home, env = _resolve(workspace, home, environ)
    records, _ = read_trust_records(trust_file(home=home, environ=env))
    statuses = []
    for _, path in project_settings_files(workspace):
        data = read_settings_file(path, below=workspace)
        if data is None:
            statuses.append(TrustStatus(path=path, state=TRUST_MISSING))
            continue
        digest = sha256_hex(data)
        recorded = records.get(path)
        state = (
            TRUST_UNTRUSTED
            if recorded is None
            else TRUST_TRUSTED
            if recorded == digest
            else TRUST_CHANGED
        )
        statuses.append(TrustStatus(path=path, state=state, sha256=digest))
    return statuses


def trust_project(
    workspace: str,
    *,
    home: str | None = None,
    environ: Mapping[str, str] | None = None,
    keys: KeyTable | None = None,
) -> list[str]:
    """Trust the current bytes of *workspace*'s project settings files.

    Each existing file is validated first (a file that would not load is not
    trusted), then its SHA-256 is recorded. Later edits make it untrusted again.

    Args:
        workspace: the project directory.
        home: the home directory (default: from *environ*).
        environ: the environment, for ``XDG_STATE_HOME`` (default: ``os.environ``).
        keys: the key table to validate against (default: the built-in one).

    Returns:
        The absolute paths of the files now trusted (empty when there are none).

    Raises:
        SettingsError: the workspace does not exist, a file is invalid, or the
            trust records cannot be read or written.

    Example::

        trust_project("/src/app")  # ["/src/app/.corral/settings.json"]
    """
    from ._keys import KEYS
    from ._validate import Context, check_project_workspace, parse_settings, validate_layer

    workspace, home, env = _resolve(workspace, home, environ)
    ctx = Context(workspace=workspace, home=home, cwd=workspace)
    digests: dict[str, str] = {}
    for _, path in project_settings_files(workspace):
        data = read_settings_file(path, below=workspace)
        if data is None:
            continue
        document = parse_settings(data, source=path)
        values = validate_layer(document, source=path, ctx=ctx, table=keys or KEYS)
        check_project_workspace(values, source=path, workspace=workspace)
        digests[path] = sha256_hex(data)
    if not digests:
        return []
    _record(trust_file(home=home, environ=env), digests)
    return list(digests)


def _record(path: str, digests: dict[str, str]) -> None:
    import fcntl
    import time

    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        check_confined_dirs(path, _records_base(path))
        os.makedirs(posixpath.dirname(path), mode=0o700, exist_ok=True)
        lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except (OSError, ValueError) as exc:  # LinkError is a ValueError
        raise SettingsError(
            f"cannot write trust records: {error_reason(exc)}", source=path
        ) from exc
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = read_small_file(path, below=_records_base(path))
            document: dict[str, Any] = (
                loads(data) if data is not None else {"version": _VERSION, "files": {}}
            )
            if data is not None:
                _parse_records(data)
        except (OSError, ValueError) as exc:  # JSONError is a ValueError
            raise SettingsError(
                f"cannot update trust records: {error_reason(exc)}",
                source=path,
                hint="fix or remove the file (removing it untrusts every project)",
            ) from exc
        for name, digest in digests.items():
            document["files"][name] = {"sha256": digest, "trustedAt": stamp}
        try:
            write_file_atomically(path, (dumps(document, sort_keys=True) + "\n").encode("ascii"))
        except OSError as exc:
            raise SettingsError(
                f"cannot write trust records: {error_reason(exc)}", source=path
            ) from exc
    finally:
        os.close(lock)
