"""Built-in defaults, each as an ``(item, reason)`` row.

Every opening and every protection corral applies without being asked is a row
here with the reason beside it; ``tests/repo`` fails on an empty reason, and
``docs/policy-reference.md`` renders these tables. Paths starting with ``~/``
are relative to the user's home directory.
"""

from __future__ import annotations

from ._model import EnvPolicy, FilesystemPolicy, NetworkPolicy, Policy, ResourceLimits

__all__ = [
    "DEFAULT_RESOURCES",
    "ENV_PASS",
    "PROTECTED_PATTERNS",
    "SECRET_PATHS",
    "default_policy",
    "expand_home",
]

#: Host paths that are unreadable inside the sandbox.
SECRET_PATHS: tuple[tuple[str, str], ...] = (
    ("~/.ssh", "SSH private keys, agent sockets and known hosts"),
    ("~/.aws", "AWS access keys and session tokens"),
    ("~/.gnupg", "GPG private keys and the agent socket"),
    ("~/.config/gcloud", "Google Cloud credentials and access tokens"),
    ("~/.azure", "Azure CLI tokens"),
    ("~/.kube", "Kubernetes cluster credentials"),
    ("~/.docker/config.json", "container registry credentials"),
    ("~/.netrc", "passwords for HTTP/FTP hosts used by curl, git and pip"),
    ("~/.git-credentials", "git's stored HTTPS passwords and tokens"),
    ("~/.config/gh", "GitHub CLI OAuth token"),
    ("~/.config/hub", "hub (GitHub) OAuth token"),
    ("~/.pypirc", "PyPI upload tokens"),
    ("~/.npmrc", "npm registry auth tokens"),
    ("~/.yarnrc.yml", "yarn registry auth tokens"),
    ("~/.cargo/credentials.toml", "crates.io publish token"),
    ("~/.cargo/credentials", "crates.io publish token (old name)"),
    ("~/.gem/credentials", "RubyGems API key"),
    ("~/.m2/settings.xml", "Maven repository passwords"),
    ("~/.gradle/gradle.properties", "Gradle repository and signing secrets"),
    ("~/.terraform.d/credentials.tfrc.json", "Terraform Cloud tokens"),
    ("~/.vault-token", "HashiCorp Vault token"),
    ("~/.config/op", "1Password CLI session data"),
    ("~/.local/share/keyrings", "GNOME keyring (saved passwords)"),
    ("~/.password-store", "pass(1) password store"),
    ("~/.mozilla", "Firefox profiles: cookies and saved passwords"),
    ("~/.config/google-chrome", "Chrome profiles: cookies and saved passwords"),
    ("~/.config/chromium", "Chromium profiles: cookies and saved passwords"),
    ("~/.config/BraveSoftware", "Brave profiles: cookies and saved passwords"),
    ("~/.claude/.credentials.json", "Claude Code's own OAuth credentials"),
    (
        "~/.config/corral",
        "corral's user settings: the sandbox must not learn or probe its own policy",
    ),
    ("~/.local/state/corral", "corral's audit log, trust records and previews"),
)

#: Workspace-relative persistence points: code the host runs later without
#: the sandbox. They may not be created, changed, renamed or deleted at any
#: depth, existing or not.
PROTECTED_PATTERNS: tuple[tuple[str, str], ...] = (
    ("**/.bashrc", "run by every interactive bash"),
    ("**/.bash_profile", "run by bash login shells"),
    ("**/.bash_login", "run by bash login shells"),
    ("**/.bash_logout", "run when a bash login shell exits"),
    ("**/.profile", "run by sh/bash login shells"),
    ("**/.zshrc", "run by every interactive zsh"),
    ("**/.zshenv", "run by every zsh, even scripts"),
    ("**/.zprofile", "run by zsh login shells"),
    ("**/.zlogin", "run by zsh login shells"),
    ("**/.zlogout", "run when a zsh login shell exits"),
    ("**/.config/fish/**", "fish configuration and functions run by every fish"),
    (
        "**/.git",
        "a repository's .git (planted as a file or symlink it redirects git to a payload; "
        "deleted, it makes a parent repository the next run's workspace); a repository "
        "the run creates is its own, checked by the git check afterwards",
    ),
    ("**/.git/hooks/**", "git runs hooks on commit, checkout, merge, push"),
    (
        "**/.git/config",
        "git config can name programs (core.fsmonitor, core.sshCommand, aliases, filters)",
    ),
    ("**/.git/config.worktree", "per-worktree git config (extensions.worktreeConfig)"),
    ("**/.git/commondir", "points the repository at another gitdir's config and hooks"),
    ("**/.git/modules/**/hooks/**", "hooks of submodules"),
    ("**/.git/modules/**/config", "git config of submodules"),
    ("**/.git/modules/**/config.worktree", "per-worktree git config of submodules"),
    ("**/.git/modules/**/commondir", "redirects a submodule's gitdir"),
    ("**/.git/worktrees/*/config.worktree", "per-worktree git config"),
    ("**/.git/worktrees/*/commondir", "redirects a worktree's gitdir"),
    ("**/.gitmodules", "submodule URLs and update commands"),
    ("**/.gitconfig", "a home directory's global git config can name programs"),
    ("**/.config/git/**", "git's XDG config (config, attributes) can name programs"),
    ("**/.pre-commit-config.yaml", "pre-commit runs the hooks it lists on every commit"),
    ("**/.envrc", "direnv runs it when a shell enters the directory"),
    ("**/.mise.toml", "mise runs its hooks and tasks and sets the environment on cd"),
    ("**/mise.toml", "mise runs its hooks and tasks and sets the environment on cd"),
    ("**/.aider.conf.yml", "aider runs the lint and test commands it names"),
    ("**/.cursor/**", "Cursor rules, MCP servers and settings"),
    ("**/.gemini/**", "Gemini CLI settings, MCP servers and hooks"),
    ("**/.codex/**", "Codex CLI configuration and MCP servers"),
    ("**/.continue/**", "Continue agent configuration and MCP servers"),
    ("**/.windsurf/**", "Windsurf rules and workflows"),
    ("**/.zed/**", "Zed tasks and settings can run programs"),
    ("**/.bash_aliases", "sourced by Debian's and Ubuntu's default .bashrc"),
    ("**/.local/bin/**", "on PATH before the system: a planted program shadows a real one"),
    (
        "**/.local/lib/python*/site-packages/*.pth",
        "Python runs the import lines of .pth files in the user site at every start",
    ),
    ("**/.config/systemd/user/**", "user services systemd starts at login"),
    ("**/.config/autostart/**", "programs the desktop session starts at login"),
    ("**/.ssh/config", "ProxyCommand and LocalCommand run programs"),
    ("**/.husky/**", "husky hook scripts that git runs on commit"),
    ("**/.vscode/**", "VS Code tasks, launch configs and settings can run programs"),
    ("**/.idea/**", "JetBrains run configurations and tool settings can run programs"),
    ("**/.devcontainer/**", "editors build and run dev containers from it"),
    ("**/.claude/**", "Claude Code settings, hooks, commands and agents"),
    ("**/.mcp.json", "MCP servers that agents start"),
    ("**/.corral/**", "corral's own project settings"),
)

#: Host environment variables passed into the sandbox (names or globs).
ENV_PASS: tuple[tuple[str, str], ...] = (
    ("PATH", "find programs"),
    ("HOME", "programs locate their (read-only) config"),
    ("USER", "identify the user by name"),
    ("LOGNAME", "identify the user by name"),
    ("SHELL", "the user's shell for programs that spawn one"),
    ("LANG", "locale: text encoding and messages"),
    ("LANGUAGE", "locale: message language preference"),
    ("LC_*", "locale categories"),
    ("TERM", "terminal capabilities"),
    ("COLORTERM", "terminal colour support"),
    ("NO_COLOR", "user asked for no colour"),
    ("TZ", "time zone"),
)

# ------------------------------------------------ value shapes of passed variables
# (engineer C, issue 10: kept apart from the protect/secret rows above)

#: Host variables that pass only when their value has a shape: the locale
#: variables are in the default pass-through list for their meaning, not to
#: carry arbitrary data (``ssh`` forwards the client's ``LC_*``, so they are a
#: known channel). ``(name glob, shape, reason)``; shapes: see
#: :func:`env_value_allowed`.
ENV_VALUE_SHAPES: tuple[tuple[str, str, str], ...] = (
    ("LANG", "locale", "a locale name: C.UTF-8, en_US.UTF-8@euro"),
    ("LC_*", "locale", "a locale name: C.UTF-8, en_US.UTF-8@euro"),
    ("LANGUAGE", "locale-list", "locale names separated by colons: en_US:en"),
)


def _is_locale(value: str) -> bool:
    """``language[_TERRITORY][.codeset][@modifier]``, or ``C``/``POSIX`` with a codeset."""
    if not value:
        return True  # empty: the category falls back to LANG
    rest, at, modifier = value.partition("@")
    base, dot, codeset = rest.partition(".")
    language, underscore, territory = base.partition("_")
    if language in ("C", "POSIX"):
        if underscore:
            return False
    elif not (2 <= len(language) <= 3 and language.isascii() and language.isalpha()) or (
        not language.islower()
    ):
        return False
    if underscore and not (
        (
            len(territory) == 2
            and territory.isascii()
            and territory.isalpha()
            and territory.isupper()
        )
        or (len(territory) == 3 and territory.isdigit())
    ):
        return False
    if dot and not (
        0 < len(codeset) <= 20 and all(c.isascii() and (c.isalnum() or c == "-") for c in codeset)
    ):
        return False
    return not at or (0 < len(modifier) <= 20 and modifier.isascii() and modifier.isalnum())


def env_value_allowed(name: str, value: str) -> bool:
    """Whether the host's *value* of *name* may pass (see :data:`ENV_VALUE_SHAPES`)."""
    from ._glob import match_word

    for pattern, shape, _reason in ENV_VALUE_SHAPES:
        if match_word(pattern, name):
            if shape == "locale-list":
                return len(value) <= 256 and all(_is_locale(part) for part in value.split(":"))
            return _is_locale(value)
    return True


#: Default bounds (see ResourceLimits); null in settings removes one.
DEFAULT_RESOURCES: tuple[tuple[str, object, str], ...] = (
    ("memory", 8 << 30, "a runaway allocation cannot take the machine; large builds still fit"),
    ("pids", 4096, "a fork bomb stops at the limit; parallel builds still fit"),
    ("timeout", 3600.0, "nothing an agent starts runs unbounded; long test suites still fit"),
    ("output", 64 << 20, "a flood of output cannot exhaust corral's or the agent's memory"),
)


def expand_home(path: str, home: str) -> str:
    """Expand a leading ``~`` or ``~/`` against *home*; other paths are returned as is."""
    if path == "~":
        return home
    if path.startswith("~/"):
        return home.rstrip("/") + path[1:]
    return path


def default_policy(workspace: str, *, home: str) -> Policy:
    """Return the built-in policy for *workspace* with secret paths under *home*."""
    values = {name: value for name, value, _ in DEFAULT_RESOURCES}
    resources = ResourceLimits(
        memory=int(values["memory"]),  # type: ignore[call-overload]
        pids=int(values["pids"]),  # type: ignore[call-overload]
        timeout=float(values["timeout"]),  # type: ignore[arg-type]
        output=int(values["output"]),  # type: ignore[call-overload]
    )
    return Policy(
        filesystem=FilesystemPolicy(
            workspace=workspace,
            deny_read=tuple(expand_home(path, home) for path, _ in SECRET_PATHS),
            protect=tuple(pattern for pattern, _ in PROTECTED_PATTERNS),
        ),
        network=NetworkPolicy(),
        resources=resources,
        env=EnvPolicy(pass_through=tuple(name for name, _ in ENV_PASS)),
    )
