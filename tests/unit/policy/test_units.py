"""Sizes and durations: parsing, formatting, round trips."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from corral.policy import format_duration, format_size, parse_duration, parse_size
from corral.policy._units import MAX_DURATION, MAX_SIZE

GIB = 1 << 30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (1, 1),
        (4096.0, 4096),
        ("100", 100),
        ("7B", 7),
        ("100k", 100 << 10),
        ("100K", 100 << 10),
        ("3kb", 3 << 10),
        ("512M", 512 << 20),
        ("512MiB", 512 << 20),
        ("2G", 2 * GIB),
        ("2gib", 2 * GIB),
        ("1.5G", GIB + GIB // 2),
        ("1T", 1 << 40),
        (" 8G ", 8 * GIB),
        ("0.5k", 512),
        ("1.1k", 1126),  # fractional bytes round down
    ],
)
def test_parses_sizes(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "greater than zero"),
        (-5, "greater than zero"),
        ("0", "greater than zero"),
        ("0.0G", "greater than zero"),
        ("0.0001k", "greater than zero"),
        ("-1G", "greater than zero"),
        ("1.5", "whole number"),
        (1.5, "whole number"),
        (float("nan"), "expected a size"),
        (float("inf"), "expected a size"),
        ("1.", "decimal point must be followed by digits"),
        ("", "expected a size"),
        ("G", "expected a size"),
        (".5G", "expected a size"),
        ("12Q", 'unknown size unit "Q"'),
        ("1e3", "unknown size unit"),
        ("1 G", "unknown size unit"),
        ("1" * 70, "70-character string"),
        (True, "expected a size"),
        (None, "got null"),
        ([1], "expected a size"),
        (MAX_SIZE + 1, "too large"),
        ("9999999999T", "too large"),
    ],
)
def test_rejects_invalid_sizes(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_size(value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (30, 30.0),
        (0.25, 0.25),
        ("45", 45.0),
        ("0.5", 0.5),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("1H30M", 5400.0),
        ("1h30m15s250ms", 5415.25),
        ("2m500ms", 120.5),
        ("0h1m", 60.0),
    ],
)
def test_parses_durations(text: object, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "greater than zero"),
        ("0s", "greater than zero"),
        ("-1s", "greater than zero"),
        (-3, "greater than zero"),
        (float("nan"), "greater than zero"),
        (float("inf"), "too long"),
        (MAX_DURATION * 2, "too long"),
        ("2d", 'unknown duration unit "d"'),
        ("1e3", 'unknown duration unit "e"'),
        ("1m1h", "largest unit to the smallest"),
        ("1h1h", "largest unit to the smallest"),
        ("1h30", 'missing unit after "30"'),
        ("", "expected a duration"),
        ("s", "expected a duration"),
        ("1.s", "decimal point"),
        ("x" * 80, "80-character string"),
        (False, "expected a duration"),
        (None, "got null"),
        ({}, "expected a duration"),
    ],
)
def test_rejects_invalid_durations(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_duration(value)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (8 * GIB, "8G"),
        (GIB + GIB // 2, "1.5G"),
        (1000, "1000B"),
        (1024, "1K"),
        (1 << 40, "1T"),
        (512 << 20, "512M"),
        (1, "1B"),
    ],
)
def test_formats_sizes_in_the_largest_exact_unit(size: int, text: str) -> None:
    assert format_size(size) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5400.0, "1h30m"),
        (3600.0, "1h"),
        (30.0, "30s"),
        (0.5, "500ms"),
        (90.5, "1m30.5s"),
        (2.0, "2s"),
        (3661.0, "1h1m1s"),
        (0.0001, "0.1ms"),
    ],
)
def test_formats_durations(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=1, max_value=MAX_SIZE))
def test_size_formatting_round_trips(size: int) -> None:
    assert parse_size(format_size(size)) == size


@given(st.floats(min_value=1e-6, max_value=MAX_DURATION, allow_nan=False))
def test_duration_formatting_round_trips(seconds: float) -> None:
    assert math.isclose(
        parse_duration(format_duration(seconds)), seconds, rel_tol=1e-9, abs_tol=1e-9
    )


@given(
    st.integers(0, 99),
    st.integers(0, 59),
    st.integers(0, 59),
    st.integers(0, 999),
)
def test_duration_parts_add_up(hours: int, minutes: int, seconds: int, millis: int) -> None:
    parts = [(hours, "h"), (minutes, "m"), (seconds, "s"), (millis, "ms")]
    text = "".join(f"{n}{unit}" for n, unit in parts if n)
    total = hours * 3600 + minutes * 60 + seconds + millis / 1000
    assume(total > 0)
    assert math.isclose(parse_duration(text), total, rel_tol=1e-12)
