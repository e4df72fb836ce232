"""Glob patterns for paths, environment variable names and commands.

Semantics (the same everywhere corral takes a glob):

* ``*`` matches any run of characters except ``/``; ``?`` one such character;
  ``[abc]``, ``[a-z]`` and ``[!abc]`` one character from (or not from) a set.
* In *path* patterns, a segment that is exactly ``**`` matches zero or more
  whole segments: ``**/.git/config`` matches ``.git/config`` and
  ``a/b/.git/config``; ``build/**`` matches everything below ``build`` but not
  ``build`` itself.
* Matching is case-sensitive and purely textual: callers pass normalised,
  ``/``-separated paths without ``.`` or ``..`` segments.
* In *word* patterns (env names, commands) ``/`` is an ordinary character.

This module deliberately does not use :mod:`fnmatch`/:mod:`re`: importing
them costs several milliseconds on the hot path (docs/design.md, "Start-up
budget"), and the grammar above is small.
"""

from __future__ import annotations

__all__ = ["PathPattern", "compiled", "components", "escape", "match_word", "validate_pattern"]


def validate_pattern(pattern: str) -> str | None:
    """Return a description of what is wrong with *pattern*, or ``None`` if it is valid."""
    if not pattern:
        return "empty pattern"
    if "\x00" in pattern:
        return "pattern contains a NUL byte"
    i = 0
    while i < len(pattern):
        if pattern[i] == "[":
            end = _class_end(pattern, i)
            if end < 0:
                return f"unclosed '[' at position {i}"
            i = end
        i += 1
    return None


def _class_end(pattern: str, start: int) -> int:
    """Return the index of the ``]`` closing the class opened at *start*, or -1."""
    i = start + 1
    if i < len(pattern) and pattern[i] == "!":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern):
        if pattern[i] == "]":
            return i
        i += 1
    return -1


def _class_matches(pattern: str, start: int, end: int, ch: str) -> bool:
    """Whether *ch* is in the class ``pattern[start:end+1]`` (``[`` ... ``]``)."""
    i = start + 1
    negate = i < end and pattern[i] == "!"
    if negate:
        i += 1
    found = False
    # No "]" can occur before *end* except as the first member: _class_end stops at the first one.
    while i < end:
        c = pattern[i]
        if i + 2 < end and pattern[i + 1] == "-":
            if pattern[i] <= ch <= pattern[i + 2]:
                found = True
            i += 3
        else:
            if c == ch:
                found = True
            i += 1
    return found != negate


def _match_text(pattern: str, text: str, *, slash_is_special: bool) -> bool:
    """Match one segment (or a whole word) with ``*``, ``?`` and classes.

    Iterative with single-star backtracking: linear in practice, and at worst
    O(len(pattern) * len(text)), never exponential.
    """
    p = t = 0
    star_p = star_t = -1
    while t < len(text):
        if p < len(pattern):
            c = pattern[p]
            if c == "*":
                star_p, star_t = p, t
                p += 1
                continue
            if c == "?" and not (slash_is_special and text[t] == "/"):
                p += 1
                t += 1
                continue
            if c == "[":
                end = _class_end(pattern, p)
                if end > 0:
                    if not (slash_is_special and text[t] == "/") and _class_matches(
                        pattern, p, end, text[t]
                    ):
                        p = end + 1
                        t += 1
                        continue
                elif text[t] == "[":
                    p += 1
                    t += 1
                    continue
            elif c == text[t]:
                p += 1
                t += 1
                continue
        if star_p >= 0 and not (slash_is_special and text[star_t] == "/"):
            star_t += 1
            p, t = star_p + 1, star_t
            continue
        return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


def match_word(pattern: str, word: str) -> bool:
    """Match an environment variable name or a command line against *pattern*.

    ``/`` is not special: ``"npm publish*"`` matches ``"npm publish --tag x"``.
    """
    return _match_text(pattern, word, slash_is_special=False)


class PathPattern:
    """A compiled path glob (see the module docstring for the grammar).

    Example::

        hooks = PathPattern("**/.git/hooks/**")
        hooks.matches("vendor/lib/.git/hooks/pre-commit")   # True
        hooks.could_match_below("vendor")                     # True
    """

    __slots__ = ("_segments", "absolute", "literals", "pattern")

    def __init__(self, pattern: str) -> None:
        problem = validate_pattern(pattern)
        if problem is not None:
            raise ValueError(f"invalid pattern {pattern!r}: {problem}")
        self.pattern = pattern
        self.absolute = pattern.startswith("/")
        segments = [s for s in pattern.strip("/").split("/") if s not in ("", ".")]
        # Collapse runs of ** (a/**/**/b == a/**/b).
        collapsed: list[str] = []
        for segment in segments:
            if segment == "**" and collapsed and collapsed[-1] == "**":
                continue
            collapsed.append(segment)
        self._segments = tuple(collapsed)
        #: The segments without ``*``, ``?`` or ``[``: each matches exactly one path
        #: component equal to it, so a path matches only if every one of them is among
        #: its components (:meth:`could_match_parts`).
        self.literals = frozenset(s for s in collapsed if not any(c in s for c in "*?["))

    def __repr__(self) -> str:
        return f"PathPattern({self.pattern!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PathPattern) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def matches(self, path: str) -> bool:
        """Whether *path* (``/``-separated; relative unless the pattern is absolute) matches."""
        parts = tuple(s for s in path.strip("/").split("/") if s)
        return self._match(0, parts, 0)

    def could_match_parts(self, parts: frozenset[str]) -> bool:
        """False only when no path whose components are *parts* can match (a cheap
        necessary condition: every literal segment is one of them); see :func:`components`."""
        return self.literals <= parts

    def could_match_below(self, directory: str) -> bool:
        """Whether some path strictly below *directory* could match this pattern.

        Used to decide whether renaming a directory can move protected paths.
        ``""`` stands for the base directory itself.
        """
        parts = tuple(s for s in directory.strip("/").split("/") if s)
        return self._prefix(0, parts, 0)

    def reaches_into(self, root: str) -> bool:
        """Whether this pattern, matched against whole paths, protects names below the
        absolute directory *root* that it misses when matched against their path relative
        to *root*; such a pattern is matched against the whole path too (see below).

        Only an any-depth pattern (``**/REST``) can: a match that begins in *root*'s own
        components. ``**/.config/fish/**`` reaches into ``/home/u/.config`` (its
        ``fish/config.fish`` is the user's fish configuration), and
        ``**/.git/worktrees/*/commondir`` into ``/r/.git/worktrees``. A pattern that matches
        *root* itself (or, for ``DIR/**``, is ``DIR``) does not: the root lies wholly inside
        what it protects (a Claude Code
        worktree session ``/r/.claude/worktrees/NAME`` under ``**/.claude/**``), where the
        user put it - no sandbox can make a directory there - and the pattern still
        applies relative to it. Patterns not anchored at any depth (``src/*.key``) are
        relative to their root only.

        Why this matters (docs/threat-model.md, "A root never hides a protection above
        it"): a writable root can be chosen by what an earlier sandbox wrote - a nested
        repository it created becomes the workspace of a run started there, a forged
        worktree layout names the git directory a run exposes - so a protection that
        depended on where a root begins could be stepped around by choosing the root.
        """
        segments = self._segments
        if self.absolute or len(segments) < 2 or segments[0] != "**":
            return False
        parts = tuple(s for s in root.strip("/").split("/") if s)
        if self._match(0, parts, 0):
            return False
        if segments[-1] == "**" and PathPattern("/".join(segments[:-1]))._match(0, parts, 0):
            return False  # DIR/** and the root is DIR: inside it too
        return any(self._prefix(1, parts, k) for k in range(len(parts)))

    def _match(self, si: int, parts: tuple[str, ...], pi: int) -> bool:
        segments = self._segments
        while si < len(segments):
            segment = segments[si]
            if segment == "**":
                if si == len(segments) - 1:
                    return pi < len(parts)  # trailing ** needs at least one segment
                return any(self._match(si + 1, parts, k) for k in range(pi, len(parts) + 1))
            if pi >= len(parts) or not _match_text(segment, parts[pi], slash_is_special=True):
                return False
            si += 1
            pi += 1
        return pi == len(parts)

    def _prefix(self, si: int, parts: tuple[str, ...], pi: int) -> bool:
        """Whether parts[pi:] can be extended by at least one segment into a match."""
        segments = self._segments
        while pi < len(parts):
            if si >= len(segments):
                return False
            segment = segments[si]
            if segment == "**":
                return True
            if not _match_text(segment, parts[pi], slash_is_special=True):
                return False
            si += 1
            pi += 1
        return si < len(segments)


def escape(path: str) -> str:
    """A pattern that matches exactly *path*: each ``*``, ``?`` and ``[`` becomes a
    one-character class (``[*]``), so a literal path someone else wrote (a config's
    ``core.hooksPath``) is never read as a glob, wider or invalid."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


def components(path: str) -> frozenset[str]:
    """The components of *path* as :meth:`PathPattern.matches` splits it, for
    :meth:`PathPattern.could_match_parts`."""
    return frozenset(s for s in path.split("/") if s)


#: Compiled patterns by their text; see :func:`compiled`.
_COMPILED: dict[str, PathPattern] = {}
#: Patterns :func:`compiled` keeps before it starts over (a bound, not a tuning knob).
_COMPILED_MAX = 4096


def compiled(pattern: str) -> PathPattern:
    """``PathPattern(pattern)``, compiled once per process and shared afterwards.

    A :class:`PathPattern` is immutable and a pure function of its text, so a
    pattern compiled for an earlier run is exactly the one this run would
    compile: the text is the whole key, and nothing about the host enters it
    (docs/design.md, "What a fresh run computes once"). At most
    :data:`_COMPILED_MAX` patterns are kept; past that the cache starts over.

    Raises:
        ValueError: *pattern* is not a valid glob (nothing is cached then).
    """
    glob = _COMPILED.get(pattern)
    if glob is None:
        glob = PathPattern(pattern)
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        _COMPILED[pattern] = glob
    return glob
