"""Sizes and durations as people write them in settings: ``"512M"``, ``"1h30m"``.

Grammar (case-insensitive, no spaces inside the value):

* **size**: a number of bytes (``100``) or a decimal number with a binary unit:
  ``k``, ``m``, ``g``, ``t`` (powers of 1024), optionally followed by ``B`` or
  ``iB``: ``"100k"``, ``"512M"``, ``"1.5G"``, ``"2GiB"``. A plain ``B`` means
  bytes. A fractional result is rounded down to whole bytes. Zero and negative
  sizes are invalid: "no limit" is ``null`` in settings, never ``0``.
* **duration**: a number of seconds (``30``, ``0.5``) or one or more
  ``<number><unit>`` parts from the largest unit to the smallest, each unit at
  most once: ``h``, ``m``, ``s``, ``ms``: ``"500ms"``, ``"30s"``, ``"10m"``,
  ``"1h30m"``, ``"1.5h"``. Durations must be greater than zero.

Parsing is hand-written (no :mod:`re`: it costs milliseconds on the hot path).
Errors are :class:`ValueError` with a message meant for a user; the settings
loader wraps them in :class:`~corral.SettingsError` with the file and key.

Example::

    parse_size("1.5G")        # 1610612736
    format_size(1610612736)   # "1.5G"
    parse_duration("1h30m")   # 5400.0
    format_duration(5400.0)   # "1h30m"
"""

from __future__ import annotations

__all__ = [
    "MAX_DURATION",
    "MAX_SIZE",
    "format_duration",
    "format_size",
    "parse_duration",
    "parse_size",
]

#: The largest size accepted, in bytes (the range of a signed 64-bit limit).
MAX_SIZE = (1 << 63) - 1

#: The largest duration accepted, in seconds (about 31 years).
MAX_DURATION = 1e9

_SIZE_EXAMPLE = 'a size such as "512M", "2G", "1.5G" or a number of bytes'
_DURATION_EXAMPLE = 'a duration such as "500ms", "30s", "10m", "1h30m" or a number of seconds'

_SIZE_UNITS: dict[str, int] = {"": 1, "b": 1}
for _exp, _letter in enumerate("kmgt", start=1):
    for _suffix in ("", "b", "ib"):
        _SIZE_UNITS[_letter + _suffix] = 1 << (10 * _exp)
del _exp, _letter, _suffix

#: Duration units, largest first, with their length in seconds.
_DURATION_UNITS: tuple[tuple[str, float], ...] = (
    ("h", 3600.0),
    ("m", 60.0),
    ("s", 1.0),
    ("ms", 0.001),
)

_DIGITS = "0123456789"
_MAX_TEXT = 64  # longer values are certainly mistakes; also bounds int() work


def _split_number(text: str, start: int) -> tuple[str, str, int]:
    """Read ``digits[.digits]`` at *start*; return (integer part, fraction, end index).

    Returns an empty integer part when there is no number at *start*; raises
    ValueError for a dangling ``.``.
    """
    i = start
    while i < len(text) and text[i] in _DIGITS:
        i += 1
    whole = text[start:i]
    fraction = ""
    if whole and i < len(text) and text[i] == ".":
        j = i + 1
        while j < len(text) and text[j] in _DIGITS:
            j += 1
        fraction = text[i + 1 : j]
        if not fraction:
            raise ValueError("a decimal point must be followed by digits")
        i = j
    return whole, fraction, i


def _describe(value: object) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def parse_size(value: object) -> int:
    """Return the number of bytes that *value* stands for.

    Args:
        value: a positive integer (bytes), an integral float, or a string such
            as ``"512M"`` (see the module docstring).

    Raises:
        ValueError: if *value* is not a valid, positive size.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected {_SIZE_EXAMPLE}, got {_describe(value)}")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"expected {_SIZE_EXAMPLE}, got {_describe(value)}")
        if not value.is_integer():
            raise ValueError(f"a size in bytes must be a whole number, got {value!r}")
        value = int(value)
    size = value if isinstance(value, int) else _parse_size_text(value)
    if size <= 0:
        raise ValueError(f"a size must be greater than zero, got {_describe(value)}")
    if size > MAX_SIZE:
        raise ValueError(f"size {_describe(value)} is too large")
    return size


def _parse_size_text(value: str) -> int:
    text = value.strip().lower()
    if len(text) > _MAX_TEXT:
        raise ValueError(f"expected {_SIZE_EXAMPLE}, got a {len(text)}-character string")
    if text.startswith("-"):
        raise ValueError(f"a size must be greater than zero, got {_describe(value)}")
    try:
        whole, fraction, end = _split_number(text, 0)
    except ValueError as exc:
        raise ValueError(f"invalid size {_describe(value)}: {exc}") from None
    if not whole:
        raise ValueError(f"expected {_SIZE_EXAMPLE}, got {_describe(value)}")
    unit = _SIZE_UNITS.get(text[end:])
    if unit is None:
        raise ValueError(
            f'unknown size unit "{value.strip()[end:]}" in {_describe(value)} '
            "(use k, M, G or T, optionally followed by B or iB)"
        )
    mantissa = int(whole + fraction)
    scale: int = 10 ** len(fraction)
    if unit == 1 and mantissa % scale:
        raise ValueError(f"a size in bytes must be a whole number, got {_describe(value)}")
    return mantissa * unit // scale


def parse_duration(value: object) -> float:
    """Return the number of seconds that *value* stands for.

    Args:
        value: a positive number of seconds, or a string such as ``"1h30m"``
            (see the module docstring).

    Raises:
        ValueError: if *value* is not a valid, positive duration.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected {_DURATION_EXAMPLE}, got {_describe(value)}")
    seconds = _parse_duration_text(value) if isinstance(value, str) else float(value)
    if not seconds > 0:  # also catches NaN
        raise ValueError(f"a duration must be greater than zero, got {_describe(value)}")
    if seconds > MAX_DURATION:
        raise ValueError(f"duration {_describe(value)} is too long")
    return seconds


def _parse_duration_text(value: str) -> float:
    text = value.strip().lower()
    if len(text) > _MAX_TEXT:
        raise ValueError(f"expected {_DURATION_EXAMPLE}, got a {len(text)}-character string")
    if text.startswith("-"):
        raise ValueError(f"a duration must be greater than zero, got {_describe(value)}")
    total = 0.0
    pos = 0
    next_unit = 0  # index into _DURATION_UNITS of the largest unit still allowed
    while True:
        try:
            whole, fraction, end = _split_number(text, pos)
        except ValueError as exc:
            raise ValueError(f"invalid duration {_describe(value)}: {exc}") from None
        if not whole:
            raise ValueError(f"expected {_DURATION_EXAMPLE}, got {_describe(value)}")
        number = float(f"{whole}.{fraction or 0}")
        if end == len(text):
            if pos == 0:
                return number  # a plain number of seconds
            raise ValueError(f'missing unit after "{whole}" in {_describe(value)}')
        unit_end = end
        while unit_end < len(text) and text[unit_end] not in _DIGITS:
            unit_end += 1
        unit = text[end:unit_end]
        index = next((i for i, (name, _) in enumerate(_DURATION_UNITS) if name == unit), -1)
        if index < 0:
            raise ValueError(
                f'unknown duration unit "{unit}" in {_describe(value)} (use ms, s, m or h)'
            )
        if index < next_unit:
            raise ValueError(
                f"duration parts must go from the largest unit to the smallest, each once "
                f'(e.g. "1h30m"), got {_describe(value)}'
            )
        factor = _DURATION_UNITS[index][1]
        total += number / 1000.0 if unit == "ms" else number * factor
        next_unit = index + 1
        pos = unit_end
        if pos == len(text):
            return total


def format_size(size: int) -> str:
    """Return *size* (bytes) in the shortest exact form :func:`parse_size` reads back.

    ``8589934592`` → ``"8G"``, ``1610612736`` → ``"1.5G"``, ``1000`` → ``"1000B"``.
    """
    for letter, unit in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= unit and (size * 100) % unit == 0:
            hundredths = size * 100 // unit
            text = f"{hundredths // 100}.{hundredths % 100:02d}".rstrip("0").rstrip(".")
            return text + letter
    return f"{size}B"


def _format_number(number: float) -> str:
    text = repr(float(number))
    return text[:-2] if text.endswith(".0") else text


def format_duration(seconds: float) -> str:
    """Return *seconds* in a form :func:`parse_duration` reads back.

    ``5400`` → ``"1h30m"``, ``0.5`` → ``"500ms"``, ``90.5`` → ``"1m30.5s"``.
    """
    if seconds < 1:
        milliseconds = round(seconds * 1000, 6)
        return _format_number(milliseconds) + "ms"
    whole = int(seconds)
    rest = seconds - whole
    hours, remainder = divmod(whole, 3600)
    minutes, secs = divmod(remainder, 60)
    parts = []
    if hours:
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}m")
    if secs or rest:
        parts.append(_format_number(round(secs + rest, 9)) + "s")
    return "".join(parts)
