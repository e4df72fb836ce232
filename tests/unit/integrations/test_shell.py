"""POSIX quoting for the command lines corral writes."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.integrations._shell import join, quote


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        ("plain", "plain"),
        ("/usr/bin/corral", "/usr/bin/corral"),
        ("", "''"),
        ("two words", "'two words'"),
        ("it's", "'it'\\''s'"),
        ("$HOME", "'$HOME'"),
        ("a\nb", "'a\nb'"),
    ],
)
def test_quote(word: str, quoted: str) -> None:
    assert quote(word) == quoted


def test_nul_bytes_are_refused() -> None:
    with pytest.raises(ValueError, match="NUL"):
        quote("a\x00b")


@given(
    st.lists(
        st.text(alphabet=st.characters(exclude_characters="\x00", exclude_categories=("Cs",))),
        max_size=4,
    )
)
def test_sh_reads_back_exactly_the_words(words: list[str]) -> None:
    out = subprocess.run(
        ["sh", "-c", f"printf '%s\\0' {join(words)}" if words else "true"],
        capture_output=True,
        check=True,
    )
    assert out.stdout.decode().split("\0")[:-1] == words
