"""Where corral's own files live (XDG base directories, DESIGN §4 and §9).

* user settings: ``$XDG_CONFIG_HOME/corral/settings.json`` (default
  ``~/.config/corral/settings.json``);
* state (trust records, audit log, previews): ``$XDG_STATE_HOME/corral/``
  (default ``~/.local/state/corral/``);
* project settings: ``<workspace>/.corral/settings.json`` and
  ``<workspace>/.corral/settings.local.json``.

As the XDG specification says, a relative ``XDG_*`` value is ignored. Every
function takes the home directory and the environment explicitly.
"""

from __future__ import annotations

import os
import posixpath

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "LOCAL_SETTINGS",
    "PROJECT_SETTINGS",
    "config_dir",
    "default_home",
    "project_settings_files",
    "state_dir",
    "trust_file",
    "user_settings_file",
]

#: The project settings files, relative to the workspace.
PROJECT_SETTINGS = ".corral/settings.json"
LOCAL_SETTINGS = ".corral/settings.local.json"


def default_home(environ: Mapping[str, str]) -> str:
    """Return ``$HOME`` from *environ* when it is absolute, else the user database's entry."""
    home = environ.get("HOME", "")
    if home.startswith("/"):
        return posixpath.normpath(home)
    from ._watched import observed

    return observed(_uid_home)


def _uid_home() -> str:
    import pwd  # not os.path.expanduser: it would read the process's own $HOME

    return pwd.getpwuid(os.getuid()).pw_dir


def _xdg(environ: Mapping[str, str], name: str, home: str, fallback: str) -> str:
    value = environ.get(name, "")
    base = value if value.startswith("/") else posixpath.join(home, fallback)
    return posixpath.join(posixpath.normpath(base), "corral")


def config_dir(*, home: str, environ: Mapping[str, str]) -> str:
    """Return corral's user configuration directory."""
    return _xdg(environ, "XDG_CONFIG_HOME", home, ".config")


def state_dir(*, home: str, environ: Mapping[str, str]) -> str:
    """Return corral's state directory (trust records, audit log, previews)."""
    return _xdg(environ, "XDG_STATE_HOME", home, ".local/state")


def user_settings_file(*, home: str, environ: Mapping[str, str]) -> str:
    """Return the path of the user settings file (it need not exist)."""
    return posixpath.join(config_dir(home=home, environ=environ), "settings.json")


def trust_file(*, home: str, environ: Mapping[str, str]) -> str:
    """Return the path of the trust records file (it need not exist)."""
    return posixpath.join(state_dir(home=home, environ=environ), "trust.json")


def project_settings_files(workspace: str) -> tuple[tuple[str, str], ...]:
    """Return ``(("project", path), ("local", path))`` for *workspace*, in layer order."""
    return (
        ("project", posixpath.join(workspace, PROJECT_SETTINGS)),
        ("local", posixpath.join(workspace, LOCAL_SETTINGS)),
    )
