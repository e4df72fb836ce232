"""Load the layered settings files into a Policy that knows where each value came from.

Layers, later wins (DESIGN §4); each has a label used in errors and explain:

==========================  ==============================================  ========
label                       what                                            trusted
==========================  ==============================================  ========
``defaults``                built-in rows of :mod:`corral.policy._defaults`  yes
``user PATH``               ``$XDG_CONFIG_HOME/corral/settings.json``       yes
``project PATH``            ``<workspace>/.corral/settings.json``           if trusted
``local PATH``              ``<workspace>/.corral/settings.local.json``     if trusted
``environment ...``         ``CORRAL_SETTINGS`` (a file), then              yes
                            ``CORRAL_BACKEND``, ``CORRAL_ISOLATION``
``settings PATH``           each ``--settings FILE``                        yes
``profile:NAME``            the selected profile (``--profile``,            yes
                            ``CORRAL_PROFILE``)
``rule:GLOB``               each rule whose glob matches the command line   yes
``flags``                   the command-line flags                          yes
==========================  ==============================================  ========

Project files are untrusted until ``corral trust`` records their hash
(:mod:`corral.policy._trust`); an untrusted layer may only tighten the policy
(:mod:`corral.policy._merge`). Profiles and rules from an untrusted layer are
ignored, so profile and rule layers are always trusted.

The workspace is settled first, because the project files live in it: the
``workspace`` argument (``--workspace``), else ``filesystem.workspace`` from
the flags, the ``--settings`` files, ``CORRAL_SETTINGS`` or the user file
(latest first), else the nearest directory above the current one that holds
``.git`` (a file or a directory; git is not run), else the current directory.
A ``.git`` in the home directory or ``/`` (a dotfiles repository) is not taken
as a project.

This module is on the ``corral run`` start-up path: it imports only ``os``,
``posixpath``, ``stat`` and corral's own light modules (no :mod:`json`,
:mod:`re`, :mod:`typing`, :mod:`dataclasses`, :mod:`pathlib`); a unit test
checks it.
"""

from __future__ import annotations

import os
import posixpath

from .._exceptions import SettingsError
from .._frozen import Record
from . import _keys as k
from ._defaults import default_policy, expand_home
from ._digest import sha256_hex
from ._files import read_settings_file
from ._glob import match_word
from ._locations import (
    config_dir,
    default_home,
    project_settings_files,
    state_dir,
    trust_file,
    user_settings_file,
)
from ._merge import MergeState
from ._model import EnvPolicy, FilesystemPolicy, NetworkPolicy, Policy, ResourceLimits
from ._trust import read_trust_records
from ._validate import (
    Context,
    check_project_workspace,
    did_you_mean,
    parse_settings,
    validate_layer,
    validate_workspace,
)
from ._watched import depends_on, observed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

__all__ = ["LayerInfo", "ResolvedSettings", "find_workspace", "load_settings"]

#: Environment variables that form the ``environment`` layer (besides CORRAL_SETTINGS).
ENV_KEYS: tuple[tuple[str, str], ...] = (
    ("CORRAL_ISOLATION", "isolation"),
    ("CORRAL_BACKEND", "backend"),
)

_SECTIONS: dict[str, type[Record]] = {
    "filesystem": FilesystemPolicy,
    "network": NetworkPolicy,
    "resources": ResourceLimits,
    "env": EnvPolicy,
}


class LayerInfo(Record):
    """One layer that was considered, for explain and ``corral trust --status``.

    Attributes:
        name: ``"defaults"``, ``"user"``, ``"project"``, ``"local"``,
            ``"environment"``, ``"settings"``, ``"profile"``, ``"rule"`` or ``"flags"``.
        label: the provenance label of its values, e.g.
            ``"user /home/me/.config/corral/settings.json"``.
        path: the file, for file layers.
        found: whether the file exists (missing user and project files are fine);
            always true for layers that are not files.
        trusted: ``False`` for an untrusted project file (only tightening values applied).
        sha256: the digest of the file's bytes, for project files.
    """

    name: str
    label: str
    path: str | None = None
    found: bool = True
    trusted: bool = True
    sha256: str | None = None


class ResolvedSettings(Record):
    """The outcome of :func:`load_settings`.

    Attributes:
        policy: the effective :class:`~corral.policy.Policy`.
        provenance: key path → label of the layer that set it. List entries are
            ``key[i]``, map entries ``key.name`` (``"filesystem.denyRead[0]"``,
            ``"env.set.CI"``).
        warnings: messages for the user (ignored untrusted values, removals
            that removed nothing, unreadable trust records), without the
            ``corral:`` prefix.
        layers: every layer considered, in order.
        workspace: the absolute workspace path.
        profile: the selected profile, if any.
        matched_rules: the ``match`` globs of the rules that applied, in order.
        integrations: ``integrations.*`` values by path without the prefix
            (``"claudeCode.unsandboxedCommands"``).
        values: the merged settings by key path, in settings units (bytes,
            seconds), for explain and ``corral policy --json``.
        keys: the key table the settings were loaded with.
    """

    policy: Policy
    provenance: dict[str, str]
    warnings: tuple[str, ...]
    layers: tuple[LayerInfo, ...]
    workspace: str
    profile: str | None
    matched_rules: tuple[str, ...]
    integrations: dict[str, Any]
    values: dict[str, Any]
    keys: k.KeyTable


# ---------------------------------------------------------------- files
class _FileLayer:
    """A settings file read before the workspace is known (user, environment, --settings)."""

    __slots__ = ("document", "info")

    def __init__(
        self, name: str, label: str, path: str, *, required: bool, below: str | None = None
    ) -> None:
        data = read_settings_file(path, required=required, below=below)
        self.document = None if data is None else parse_settings(data, source=path)
        self.info = LayerInfo(name=name, label=label, path=path, found=data is not None)


# ---------------------------------------------------------------- workspace
def find_workspace(cwd: str, *, home: str) -> tuple[str, str]:
    """Return ``(workspace, label)`` for *cwd*: the git top-level above it, else *cwd*.

    Looks for ``.git`` (directory or file) without running git. ``.git`` in
    *home* or ``/`` is ignored: a dotfiles repository is not a project.
    """
    top = git_top_level(cwd, home=home)
    if top is not None:
        return top, "detected: git top-level"
    return cwd, "detected: current directory"


def git_top_level(directory: str, *, home: str) -> str | None:
    """The nearest directory at or above *directory* that holds ``.git`` (a directory or a
    file; git is not run), never *home* or ``/``; ``None`` when there is none."""
    stop = {"/", posixpath.normpath(home)}
    while directory not in stop:
        depends_on(posixpath.join(directory, ".git"))
        try:
            os.lstat(posixpath.join(directory, ".git"))
        except OSError:
            pass
        else:
            return directory
        directory = posixpath.dirname(directory)
    return None


def _settle_workspace(
    workspace: str | None,
    flags: dict[str, Any],
    files: Sequence[_FileLayer | None],
    *,
    cwd: str,
    home: str,
) -> tuple[str, str, list[str]]:
    """Return ``(workspace, provenance label, warnings)`` (see the module docstring).

    *files* are the layers that may set ``filesystem.workspace``, latest first.

    Raises:
        SettingsError: the workspace does not exist or is not a directory.
    """
    notes: list[str] = []
    if workspace is not None:
        ws, label = _absolute(workspace, cwd, home), "flags"
    else:
        pre = Context(workspace=cwd, home=home, cwd=cwd)
        candidates = [("flags", "flags", flags)] + [
            (layer.info.label, layer.info.path or "", layer.document)
            for layer in files
            if layer is not None
        ]
        for candidate, source, document in candidates:
            found = validate_workspace(document, source=source, ctx=pre)
            if found is not None:
                ws, label = found, candidate
                break
        else:
            ws, label = find_workspace(cwd, home=home)
            notes = _check_detected_workspace(ws, home)
    depends_on(ws)
    if not posixpath.isdir(ws):
        problem = "does not exist" if not posixpath.exists(ws) else "is not a directory"
        raise SettingsError(
            f"workspace {ws} {problem}",
            source=label,
            key="filesystem.workspace",
            hint="pass --workspace DIR with an existing directory",
        )
    return ws, label, notes


def _check_detected_workspace(workspace: str, home: str) -> list[str]:
    """Refuse ``/`` as an implicit workspace (corral started outside any project).

    The home directory, detected or explicit, is judged later by
    :func:`_check_home_workspace`.
    """
    if workspace == "/":
        raise SettingsError(
            "refusing to use / as the workspace (it would make every file writable)",
            source="detected: current directory",
            key="filesystem.workspace",
            hint="run corral inside a project, or pass --workspace DIR",
        )
    return []


def _homes(home: str) -> set[str]:
    """*home* and the user database's home of this uid (they differ under sudo, ``HOME=``)."""
    homes = {home}
    uid_home = observed(_uid_home)
    if uid_home is not None:
        homes.add(posixpath.normpath(uid_home))
    return {h for h in homes if h.startswith("/")}


def _uid_home() -> str | None:
    """The user database's home of this uid (None: no entry)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_dir
    except (KeyError, ImportError):
        return None


def _add_secret_paths_of_other_homes(state: MergeState, home: str, env: Mapping[str, str]) -> None:
    """Hide the secret paths under every home the command could read them in.

    The defaults name them under *home* (``$HOME``). The user database's home
    may differ (``sudo``, ``HOME=/tmp/x corral run``), and the XDG variables
    move ``~/.config`` and ``~/.local/share``; the secrets are hidden at each
    of those places too, as defaults (so a ``"!path"`` entry can still remove
    one).
    """
    from ._defaults import SECRET_PATHS

    label = "defaults (secret paths of other homes)"
    for other in sorted(_homes(home) - {home}):
        for path, _reason in SECRET_PATHS:
            state.add_entry("filesystem.denyRead", expand_home(path, other), label)
    for variable, default in (
        ("XDG_CONFIG_HOME", "~/.config/"),
        ("XDG_DATA_HOME", "~/.local/share/"),
    ):
        base = env.get(variable, "")
        if not base.startswith("/"):
            continue
        for path, _reason in SECRET_PATHS:
            if path.startswith(default):
                moved = posixpath.join(posixpath.normpath(base), path[len(default) :])
                state.add_entry("filesystem.denyRead", moved, f"defaults ({variable})")


def _check_home_workspace(state: MergeState, home: str) -> None:
    """Refuse a workspace that is a home directory or above one, unless allowed.

    Such a workspace makes the shell rc files, editor and agent configs and
    corral's own settings writable; one planted ``~/.config/corral`` would
    unsandbox every later run. ``filesystem.allowHomeWorkspace`` (a flag or a
    trusted layer; project files cannot set it) accepts it with a warning.
    """
    ws = state.values["filesystem.workspace"]
    covered = sorted(h for h in _homes(home) if h == ws or h.startswith(ws.rstrip("/") + "/"))
    if not covered:
        return
    what = "your home directory" if covered[0] == ws else f"a directory above {covered[0]}"
    if not state.values["filesystem.allowHomeWorkspace"]:
        raise SettingsError(
            f"refusing the workspace {ws}: it is {what}, so the command could change your "
            "shell rc files, editor and agent configs and corral's own settings",
            source=state.sources.get("filesystem.workspace"),
            key="filesystem.workspace",
            hint=(
                "run corral inside a project (or pass --workspace DIR); to accept it anyway "
                "pass --allow-home-workspace or set filesystem.allowHomeWorkspace in your "
                "user settings"
            ),
        )
    state.warnings.append(
        f"the workspace {ws} is {what} (filesystem.allowHomeWorkspace): everything in it "
        "except protected paths is writable; pass --workspace DIR to narrow it"
    )


def _absolute(path: str, cwd: str, home: str) -> str:
    return posixpath.normpath(posixpath.join(cwd, expand_home(path, home)))


# ---------------------------------------------------------------- defaults and policy
def _attr(policy: Policy, attr: str) -> Any:
    value: Any = policy
    for part in attr.split("."):
        value = getattr(value, part)
    return value


def _settings_value(row: k.Key, value: Any) -> Any:
    """A Policy attribute value in the merge state's shape (lists, dicts)."""
    if row.merge == k.PER_KEY:
        return dict(value)
    if row.merge == k.CONCAT:
        return sorted(value) if isinstance(value, frozenset) else list(value)
    return value


def _default_values(table: k.KeyTable, policy: Policy) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for row in table.rows:
        if row.attr is not None:
            values[row.path] = _settings_value(row, _attr(policy, row.attr))
        else:
            values[row.path] = row.default
    return values


def _build_policy(table: k.KeyTable, values: dict[str, Any]) -> Policy:
    sections: dict[str, dict[str, Any]] = {"": {}}
    for row in table.rows:
        if row.attr is None:
            continue
        value = values[row.path]
        if row.kind == k.KEY_PATHS:
            value = frozenset(value)
        elif row.merge == k.CONCAT:
            value = tuple(value)
        elif row.merge == k.PER_KEY:
            value = tuple(value.items())
        section, _, field = row.attr.rpartition(".")
        sections.setdefault(section, {})[field] = value
    top = sections.pop("")
    for name, fields in sections.items():
        top[name] = _SECTIONS[name](**fields)
    return Policy(**top)


def _protect_own_files(state: MergeState, dirs: tuple[str, ...], files: Sequence[str] = ()) -> None:
    """Keep corral's config and state dirs unreadable and, if writable, read-only.

    The defaults hide ``~/.config/corral`` and ``~/.local/state/corral``; with
    other XDG directories those are added here. When one lies inside (or
    contains) a writable area, it is also made read-only, so a sandboxed
    command can never edit the user settings or trust records. The settings
    *files* named by ``CORRAL_SETTINGS`` and ``--settings`` are made read-only
    too when they lie in a writable area (they are followed as named).
    """
    label = "defaults (corral's own files)"
    writable = [state.values["filesystem.workspace"], *state.values["filesystem.allowWrite"]]
    for directory in dirs:
        state.add_entry("filesystem.denyRead", directory, label)
        if any(_overlaps(directory, area) for area in writable):
            state.add_entry("filesystem.denyWrite", directory, label)
            state.add_entry("filesystem.denyWrite", directory + "/**", label)
    for path in files:
        if any(_overlaps(path, area) for area in writable):
            state.add_entry("filesystem.denyWrite", path, "defaults (settings files in use)")
    for directory in _own_installation():
        if any(_inside(directory, area) for area in writable):
            label = "defaults (corral's own installation)"
            state.add_entry("filesystem.denyWrite", directory, label)
            state.add_entry("filesystem.denyWrite", directory + "/**", label)


def _expose_worktree_git(state: MergeState, home: str) -> None:
    """A linked worktree's shared git directory: usable like a workspace's own ``.git``.

    Writable (read-only with ``filesystem.readOnly``), with every ``**/.git/...``
    persistence point of ``filesystem.protect`` denied in it (see
    :mod:`._worktree`). Left hidden, with a warning, when it overlaps a secret
    path or contains the home directory.
    """
    from ._worktree import GIT_PATTERN_PREFIX, linked_worktree_common_dir

    values = state.values
    common = linked_worktree_common_dir(values["filesystem.workspace"])
    if common is None:
        return
    if _inside(home, common) or any(_overlaps(common, s) for s in values["filesystem.denyRead"]):
        state.warnings.append(
            f"the workspace is a git worktree whose repository {common} overlaps a secret path "
            "or the home directory: it stays hidden, and git fails in the sandbox"
        )
        return
    label = "defaults (the linked worktree's git directory)"
    if values["filesystem.readOnly"]:
        state.add_entry("filesystem.allowRead", common, label)
        return
    state.add_entry("filesystem.allowWrite", common, label)
    for pattern in values["filesystem.protect"]:
        if pattern.startswith(GIT_PATTERN_PREFIX):
            rest = pattern[len(GIT_PATTERN_PREFIX) :]
            state.add_entry("filesystem.denyWrite", f"{common}/{rest}", label)


def _own_installation() -> list[str]:
    """The directories whose code runs unsandboxed as corral: its package and its environment.

    The package directory (``src/corral`` of an editable install) and
    ``sys.prefix`` (a virtual environment: ``bin/corral``, the interpreter,
    ``site-packages`` and its ``.pth`` files), each as named and resolved.
    A sandboxed command that could write them would run its code in the next
    hook call, client or (reloaded) server on the host.
    """
    import sys

    package = posixpath.dirname(posixpath.dirname(posixpath.abspath(__file__)))
    found = [package, posixpath.abspath(sys.prefix)]
    for path in found:
        depends_on(path)
    found += [posixpath.realpath(path) for path in found]
    return list(dict.fromkeys(found))


def _inside(path: str, area: str) -> bool:
    return path == area or path.startswith(area.rstrip("/") + "/")


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


# ---------------------------------------------------------------- loading
def load_settings(
    *,
    cwd: str | None = None,
    home: str | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    settings_files: Sequence[str] = (),
    profile: str | None = None,
    command: str | Sequence[str] | None = None,
    workspace: str | None = None,
    keys: k.KeyTable = k.KEYS,
) -> ResolvedSettings:
    """Load, validate and merge every settings layer into a :class:`ResolvedSettings`.

    Args:
        cwd: the current directory (default: :func:`os.getcwd`).
        home: the home directory (default: ``$HOME`` from *environ*, else the
            user database).
        environ: the environment (default: :data:`os.environ`); read for the
            XDG directories and ``CORRAL_SETTINGS``, ``CORRAL_BACKEND``,
            ``CORRAL_ISOLATION``, ``CORRAL_PROFILE``. Empty values count as unset.
        flags: command-line settings in the settings-JSON shape, e.g.
            ``{"network": {"allow": ["pypi.org"]}}`` (the last layer).
        settings_files: extra settings files (``--settings FILE``), trusted;
            relative paths are relative to *cwd*. They must exist.
        profile: the profile to apply (``--profile``); default ``CORRAL_PROFILE``.
        command: the command line that rules are matched against (a string,
            or an argv list joined with spaces); ``None``: no rule applies.
        workspace: the workspace (``--workspace``); see the module docstring
            for the default.
        keys: the key table (see :meth:`KeyTable.extended <corral.policy._keys.KeyTable.extended>`).

    Raises:
        SettingsError: a file is unreadable, malformed or invalid, a named file
            or profile does not exist, or the workspace does not exist.

    Example::

        resolved = load_settings(flags={"resources": {"timeout": "10m"}},
                                 command=["pytest", "-q"])
        resolved.policy.resources.timeout   # 600.0
        resolved.provenance["resources.timeout"]   # "flags"
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    home = default_home(env) if home is None else posixpath.normpath(home)
    cwd = posixpath.normpath(os.getcwd() if cwd is None else posixpath.join(os.getcwd(), cwd))
    flags = dict(flags or {})

    # 1. Files that do not depend on the workspace.
    user_path = user_settings_file(home=home, environ=env)
    # No link is followed below the XDG base directory: ~/.config/corral as a
    # link to a directory a sandboxed command wrote is refused, not read.
    user = _FileLayer(
        "user",
        f"user {user_path}",
        user_path,
        required=False,
        below=posixpath.dirname(config_dir(home=home, environ=env)),
    )
    env_file = None
    if env.get("CORRAL_SETTINGS"):
        path = _absolute(env["CORRAL_SETTINGS"], cwd, home)
        env_file = _FileLayer(
            "environment", f"environment CORRAL_SETTINGS={path}", path, required=True
        )
    extra = []
    for name in settings_files:
        path = _absolute(name, cwd, home)
        extra.append(_FileLayer("settings", f"settings {path}", path, required=True))

    # 2. The workspace.
    ws, ws_label, notes = _settle_workspace(
        workspace, flags, (*reversed(extra), env_file, user), cwd=cwd, home=home
    )
    ctx = Context(workspace=ws, home=home, cwd=cwd)

    # 3. Validate every layer (in layer order, so the first bad file is reported).
    layers: list[LayerInfo] = [LayerInfo(name="defaults", label="defaults")]
    plan: list[tuple[dict[str, Any], str, str | None]] = []  # (values, label, untrusted path)

    def add_file(layer: _FileLayer) -> None:
        layers.append(layer.info)
        if layer.document is not None:
            assert layer.info.path is not None
            values = validate_layer(layer.document, source=layer.info.path, ctx=ctx, table=keys)
            plan.append((values, layer.info.label, None))

    add_file(user)
    ignored_profiles, trust_problems = _add_project_layers(ws, home, env, ctx, keys, layers, plan)
    notes += trust_problems
    if env_file is not None:
        add_file(env_file)
    for name, key in ENV_KEYS:
        if env.get(name):
            label = f"environment {name}"
            values = validate_layer(
                {key: env[name]}, source=f"environment {name}", ctx=ctx, table=keys
            )
            layers.append(LayerInfo(name="environment", label=label))
            plan.append((values, label, None))
    for layer in extra:
        add_file(layer)
    flag_values = validate_layer(flags, source="flags", ctx=ctx, table=keys)
    definitions: dict[str, Any] = {
        key: flag_values.pop(key) for key in ("rules", "profiles") if key in flag_values
    }
    if definitions:
        plan.append((definitions, "flags", None))

    # 4. Merge.
    defaults = default_policy(ws, home=home)
    state = MergeState(keys, _default_values(keys, defaults))
    state.sources["filesystem.workspace"] = ws_label
    state.warnings.extend(notes)
    _add_secret_paths_of_other_homes(state, home, env)
    for values, label, untrusted in plan:
        state.apply(values, label, untrusted=untrusted)

    # 5. The profile, the matching rules, the flags.
    selected = profile or env.get("CORRAL_PROFILE") or None
    if selected is not None:
        source = "flags" if profile else "environment CORRAL_PROFILE"
        profiles: dict[str, Any] = state.values["profiles"]
        if selected not in profiles:
            raise SettingsError(
                f'unknown profile "{selected}"' + did_you_mean(selected, profiles),
                source=source,
                hint=(
                    "it is defined in an untrusted project file; run 'corral trust' to accept it"
                    if selected in ignored_profiles
                    else "defined profiles: " + (", ".join(profiles) or "none")
                ),
            )
        label = f"profile:{selected}"
        layers.append(LayerInfo(name="profile", label=label))
        state.apply(profiles[selected], label)
    matched: list[str] = []
    if command is not None:
        line = command if isinstance(command, str) else " ".join(command)
        for rule in state.rules():
            if match_word(rule.match, line):
                label = f"rule:{rule.match}"
                layers.append(LayerInfo(name="rule", label=label))
                state.apply(rule.values, label)
                matched.append(rule.match)
    layers.append(LayerInfo(name="flags", label="flags"))
    state.apply(flag_values, "flags")
    if workspace is not None:
        state.apply({"filesystem.workspace": ws}, "flags")

    # 6. The result.
    _check_home_workspace(state, home)
    _expose_worktree_git(state, home)
    _protect_own_files(
        state,
        (config_dir(home=home, environ=env), state_dir(home=home, environ=env)),
        [layer.info.path for layer in (env_file, *extra) if layer is not None and layer.info.path],
    )
    integrations = {
        row.path.partition(".")[2]: _frozen(state.values[row.path])
        for row in keys.rows
        if row.path.startswith("integrations.")
    }
    return ResolvedSettings(
        policy=_build_policy(keys, state.values),
        provenance=state.provenance(),
        warnings=tuple(state.warnings),
        layers=tuple(layers),
        workspace=ws,
        profile=selected,
        matched_rules=tuple(matched),
        integrations=integrations,
        values=state.values,
        keys=keys,
    )


def _frozen(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return tuple(value.items())
    return value


def _add_project_layers(
    ws: str,
    home: str,
    env: Mapping[str, str],
    ctx: Context,
    keys: k.KeyTable,
    layers: list[LayerInfo],
    plan: list[tuple[dict[str, Any], str, str | None]],
) -> tuple[set[str], list[str]]:
    """Read, validate and trust-check the project files.

    Returns the names of the profiles ignored from untrusted files and the
    problems met reading the trust records.
    """
    records: dict[str, str] | None = None
    ignored_profiles: set[str] = set()
    problems: list[str] = []
    for name, path in project_settings_files(ws):
        label = f"{name} {path}"
        data = read_settings_file(path, below=ws)
        if data is None:
            layers.append(LayerInfo(name=name, label=label, path=path, found=False, trusted=False))
            continue
        values = validate_layer(parse_settings(data, source=path), source=path, ctx=ctx, table=keys)
        digest = sha256_hex(data)
        if records is None:
            records, problem = read_trust_records(trust_file(home=home, environ=env))
            if problem is not None:
                problems.append(problem)
        trusted = records.get(path) == digest
        if trusted:
            check_project_workspace(values, source=path, workspace=ws)
        else:
            ignored_profiles.update(values.get("profiles") or ())
        layers.append(LayerInfo(name=name, label=label, path=path, trusted=trusted, sha256=digest))
        plan.append((values, label, None if trusted else path))
    return ignored_profiles, problems
