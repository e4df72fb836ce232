"""POSIX shell quoting for command strings corral writes (the hook, wrap-plugin).

One rule: wrap the word in single quotes and write every ``'`` as ``'\\''``.
Inside single quotes a POSIX shell (and bash, zsh) interprets nothing - no
``$``, backquotes, backslashes, newlines or history - so any string without a
NUL byte survives exactly. :mod:`shlex` would do the same but imports
:mod:`re` (docs/design.md, "Start-up budget").
"""

from __future__ import annotations

__all__ = ["SAFE", "join", "quote"]

#: Characters a word may hold unquoted (quote() leaves such words alone).
SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_")


def quote(word: str) -> str:
    """Return *word* quoted for a POSIX shell; words of only safe characters stay as they are.

    Raises:
        ValueError: *word* contains a NUL byte (no shell can receive one).

    Example::

        quote("it's $HOME")   # "'it'\\''s $HOME'"
    """
    if "\x00" in word:
        raise ValueError("a shell word cannot contain a NUL byte")
    if word and all(c in SAFE for c in word):
        return word
    return "'" + word.replace("'", "'\\''") + "'"


def join(argv: tuple[str, ...] | list[str]) -> str:
    """Quote each word of *argv* and join them with spaces."""
    return " ".join(quote(word) for word in argv)
