"""JSON on the hot path without importing :mod:`json`.

``import json`` imports :mod:`re` (for the decoder's regexes) and costs 5-8 ms
on the machines corral targets, a large share of ``corral run``'s start-up
budget. CPython's C accelerator :mod:`_json` does the real work for
:mod:`json` anyway; this module drives it directly:

* :func:`loads` parses one JSON document strictly: duplicate keys, NaN and
  Infinity and trailing data are errors (settings files and hook payloads
  must mean one thing).
* :func:`loads` refuses documents nested deeper than :data:`MAX_DEPTH`
  (arrays and objects) with a :class:`JSONError` naming the depth and the
  place, instead of the parser's ``RecursionError``: settings files, hook
  payloads and peers of the corral server are untrusted input.
* :func:`dumps` writes compact JSON with ASCII escapes, like
  ``json.dumps(obj, separators=(",", ":"))``; ``sort_keys`` is available.

When :mod:`_json` is missing (another Python implementation) both fall back
to :mod:`json` with the same behaviour. Errors are :class:`JSONError` with a
1-based line and column.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["MAX_DEPTH", "JSONError", "check_depth", "dumps", "loads"]

#: The deepest nesting of arrays and objects accepted (corral's own documents use < 10).
MAX_DEPTH = 200


class JSONError(ValueError):
    """Malformed JSON. ``line`` and ``column`` are 1-based."""

    def __init__(self, message: str, text: str, pos: int) -> None:
        self.line = text.count("\n", 0, pos) + 1
        self.column = pos - (text.rfind("\n", 0, pos) + 1) + 1
        self.pos = pos
        self.reason = message
        super().__init__(f"{message} at line {self.line} column {self.column}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _pairs_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


class _Context:
    """The attributes ``_json.make_scanner`` reads from a ``JSONDecoder``."""

    strict = True
    object_hook = None
    object_pairs_hook = staticmethod(_pairs_without_duplicates)
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_reject_constant)
    memo: dict[str, str]

    def __init__(self) -> None:
        self.memo = {}


_WHITESPACE = " \t\n\r"
_scanner: Callable[[str, int], tuple[Any, int]] | None
_encoder: Callable[[Any, int], Any] | None
_sorted_encoder: Callable[[Any, int], Any] | None

try:
    from _json import encode_basestring_ascii as _c_escape
    from _json import make_encoder as _c_make_encoder
    from _json import make_scanner as _c_make_scanner
except ImportError:  # pragma: no cover - only on Pythons without the accelerator
    _scanner = _encoder = _sorted_encoder = None
else:
    _scanner = _c_make_scanner(_Context())  # type: ignore[arg-type]  # reads JSONDecoder's attributes

    def _default(obj: Any) -> Any:
        if isinstance(obj, (tuple, frozenset, set)):
            return list(obj)
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    def _make(sort_keys: bool) -> Callable[[Any, int], Any]:
        return _c_make_encoder(None, _default, _c_escape, None, ":", ",", sort_keys, False, False)

    _encoder = _make(False)
    _sorted_encoder = _make(True)


def check_depth(text: str, *, limit: int | None = None) -> None:
    """Raise :class:`JSONError` if *text* nests arrays and objects deeper than *limit*.

    *limit* defaults to :data:`MAX_DEPTH`. Cheap for ordinary documents: the
    scan runs only when *text* holds more brackets than the limit, and then in C
    (string methods); the character loop only finds the position of a refusal.
    """
    limit = MAX_DEPTH if limit is None else limit
    if text.count("[") + text.count("{") <= limit:
        return
    # strings out (their brackets are text), then the deepest running depth over the brackets
    # left, in C: a character loop in Python took 4-5 ms for corral's 90 kB probe cache, read
    # three times by an in-process run. An escaped backslash goes first, then an escaped quote:
    # every quote left delimits a string, so every other piece between quotes is outside one.
    import itertools

    plain = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(plain.split('"')[::2])
    steps = map(_DEPTH_STEP.__getitem__, filter(_DEPTH_STEP.__contains__, outside))
    if max(itertools.accumulate(steps), default=0) <= limit:
        return
    # find where, for the message (rare: the document is refused)
    depth = 0
    in_string = escaped = False
    for pos, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                raise JSONError(f"nested deeper than {limit} levels", text, pos)
        elif char in "]}":
            depth -= 1
    raise JSONError(f"nested deeper than {limit} levels", text, 0)


_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def loads(text: str | bytes) -> Any:
    """Parse *text* as one strict JSON document.

    Raises:
        JSONError: on malformed JSON, duplicate object keys, NaN/Infinity,
            data after the document, or nesting deeper than :data:`MAX_DEPTH`.
    """
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONError("invalid UTF-8", "", 0) from exc
    start = 0
    end = len(text)
    while start < end and text[start] in _WHITESPACE:
        start += 1
    if start == end:
        raise JSONError("expected a JSON value, found nothing", text, start)
    check_depth(text)
    if _scanner is None:  # pragma: no cover
        return _loads_stdlib(text)
    try:
        value, stop = _scanner(text, start)
    except (StopIteration, ValueError, SystemError):
        # The C scanner reports errors through json.decoder.JSONDecodeError and,
        # when json.decoder was never imported, fails without an exception
        # (SystemError). Errors are the cold path: re-parse with the json
        # module for a precise message and position.
        return _loads_stdlib(text)
    while stop < end and text[stop] in _WHITESPACE:
        stop += 1
    if stop != end:
        raise JSONError("unexpected data after the JSON value", text, stop)
    return value


def _loads_stdlib(text: str) -> Any:
    """Parse with :mod:`json` (same strictness); used for errors and without ``_json``."""
    import json

    try:
        return json.loads(
            text, object_pairs_hook=_pairs_without_duplicates, parse_constant=_reject_constant
        )
    except json.JSONDecodeError as exc:
        raise JSONError(exc.msg, text, exc.pos) from None
    except ValueError as exc:  # duplicate keys, NaN/Infinity
        raise JSONError(str(exc), text, 0) from None


def dumps(obj: Any, *, sort_keys: bool = False) -> str:
    """Serialise *obj* as compact ASCII JSON (tuples and sets become arrays)."""
    encoder = _sorted_encoder if sort_keys else _encoder
    if encoder is None:  # pragma: no cover
        import json

        return json.dumps(
            obj,
            separators=(",", ":"),
            sort_keys=sort_keys,
            allow_nan=False,
            default=lambda o: list(o) if isinstance(o, (tuple, set, frozenset)) else str(o),
        )
    return "".join(encoder(obj, 0))
