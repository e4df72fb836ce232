"""Generate a deny-by-default Seatbelt (SBPL) profile from the policy (pure).

Rules of the generator:

* the profile opens with ``(deny default)``; every ``allow`` is preceded by a
  ``; reason:`` comment saying which part of the policy it comes from;
* untrusted strings (paths from settings, the workspace) never appear in the
  profile text: they are passed as ``sandbox-exec -D NAME=VALUE`` parameters
  and referenced as ``(param "NAME")``;
* protect patterns become regular expressions built only from the pattern's
  own literal segments (escaped), combined with ``(subpath (param ...))`` so
  the workspace path stays a parameter; their ancestors are protected from
  being renamed or deleted (``file-write-unlink``), so a protected directory
  cannot be moved away and replaced;
* later rules win in SBPL, so denials come after the broad allowances they
  narrow.
"""

from __future__ import annotations

__all__ = ["SeatbeltProfile", "build_profile", "glob_to_regex"]

_REGEX_SPECIAL = set(".^$*+?()[]{}|\\/")


class SeatbeltProfile:
    """A generated profile: its text and the ``-D`` parameters it references."""

    __slots__ = ("params", "text")

    def __init__(self, text: str, params: tuple[tuple[str, str], ...]) -> None:
        self.text = text
        self.params = params

    def argv(self) -> list[str]:
        """``sandbox-exec`` arguments before the command: ``-p TEXT -D K=V ...``."""
        args = ["-p", self.text]
        for name, value in self.params:
            args += ["-D", f"{name}={value}"]
        return args


def _escape(segment: str) -> str:
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in segment)


def glob_to_regex(pattern: str) -> tuple[str, list[str]]:
    """``(regex of the protected path, regexes of its ancestors)`` for a relative glob.

    ``**`` matches any number of directories, ``*`` any characters but ``/``,
    ``?`` one. The regexes match the *end* of an absolute path (the workspace
    prefix is checked separately with ``subpath``).

    Raises:
        ValueError: for character classes (``[...]``), which the generator
            does not translate.
    """
    if "[" in pattern:
        raise ValueError(
            f"character classes are not supported in Seatbelt protect rules: {pattern!r}"
        )
    parts = pattern.strip("/").split("/")
    out: list[str] = []
    ancestors: list[str] = []
    for index, part in enumerate(parts):
        if part == "**":
            out.append("(/.*)?" if index == len(parts) - 1 else "(/[^/]+)*")
            continue
        piece = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else _escape(c) for c in part)
        out.append("/" + piece)
        if index < len(parts) - 1 and "**" not in parts[index : index + 1]:
            ancestors.append("".join(out) + "$")
    regex = "".join(out) + "$"
    return regex, [a for a in ancestors if a != regex]


def build_profile(
    *,
    workspace: str,
    tmpdir: str,
    read_only: bool,
    allow_write: tuple[str, ...],
    deny_read: tuple[str, ...],
    allow_read: tuple[str, ...],
    protect: tuple[str, ...],
    deny_write: tuple[str, ...],
    network_mode: str,
    proxy_port: int | None = None,
) -> SeatbeltProfile:
    """The profile and parameters for one policy (see the module docstring)."""
    params: list[tuple[str, str]] = []

    def param(prefix: str, value: str) -> str:
        name = f"{prefix}_{len(params)}"
        params.append((name, value))
        return f'(param "{name}")'

    lines = ["(version 1)", "(deny default)", ""]

    def allow(reason: str, rule: str) -> None:
        lines.append(f"; reason: {reason}")
        lines.append(rule)

    allow("run the command and the programs it starts", "(allow process-exec process-fork)")
    allow("signal its own processes only", "(allow signal (target same-sandbox))")
    allow("programs read system settings (hw.ncpu, kern.osversion)", "(allow sysctl-read)")
    allow(
        "the system log and directory services that libSystem needs",
        '(allow mach-lookup (global-name "com.apple.system.logger") '
        '(global-name "com.apple.system.opendirectoryd.libinfo"))',
    )
    allow("readable system: everything not hidden below", "(allow file-read* file-test-existence)")
    allow(
        "discard output and use the terminal",
        '(allow file-write-data (literal "/dev/null") (literal "/dev/tty") (literal "/dev/dtracehelper"))',
    )
    allow("terminal ioctls on the controlling terminal", '(allow file-ioctl (literal "/dev/tty"))')
    writable = [] if read_only else [workspace]
    writable += list(allow_write)
    for path in writable:
        allow(
            "the workspace" if path == workspace else "filesystem.allowWrite",
            f"(allow file-write* (subpath {param('WRITE', path)}))",
        )
    allow("the private TMPDIR", f"(allow file-write* (subpath {param('TMPDIR', tmpdir)}))")
    if network_mode == "open":
        allow('network.mode "open"', "(allow network*)")
    elif network_mode == "allowlist" and proxy_port is not None:
        allow(
            "network.mode allowlist: only corral's egress proxy on loopback",
            f'(allow network-outbound (remote tcp "localhost:{int(proxy_port)}"))',
        )
    lines.append("")
    for path in deny_read:
        lines.append("; filesystem.denyRead")
        lines.append(f"(deny file-read* (subpath {param('DENY_READ', path)}))")
    for path in allow_read:
        allow(
            "filesystem.allowRead: re-exposed beneath a hidden path",
            f"(allow file-read* (subpath {param('ALLOW_READ', path)}))",
        )
    for path in deny_write:
        if path.startswith("/") and not any(c in path for c in "*?["):
            lines.append("; filesystem.denyWrite")
            lines.append(f"(deny file-write* (subpath {param('DENY_WRITE', path)}))")
    globs = [
        *protect,
        *(p for p in deny_write if not p.startswith("/") or any(c in p for c in "*?[")),
    ]
    for pattern in globs:
        regex, ancestors = glob_to_regex(pattern.removeprefix("/"))
        for area in writable:
            ref = param("PROTECT_ROOT", area)
            lines.append(f"; protected: {pattern}")
            lines.append(f'(deny file-write* (require-all (subpath {ref}) (regex #"{regex}")))')
            for ancestor in ancestors:
                lines.append(f"; protected: {pattern} (its ancestors cannot be renamed or removed)")
                lines.append(
                    f'(deny file-write-unlink (require-all (subpath {ref}) (regex #"{ancestor}")))'
                )
    return SeatbeltProfile("\n".join(lines) + "\n", tuple(params))
