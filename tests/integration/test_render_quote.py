"""A value from the file is one shell word whatever it holds: bash reads back exactly that value, and the
rendering printed on a terminal carries no control character that could move the cursor over it."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from muse_launch.render_text import assignment, quote

pytestmark = pytest.mark.integration  # starts processes

HOSTILE = ["x\x1b[31mRED\x07\rOVER", "a'b\\c", "tab\there", "\u009b2J", "line\u2028sep", "$(reboot)", "", "-"]


def _bash_reads(words: list[str]) -> list[str]:
    script = "for a in " + " ".join(words) + "; do printf '%s\\0' \"$a\"; done"
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    return out.decode("utf-8", "surrogateescape").split("\0")[:-1]


def _printable(word: str) -> bool:
    return not any(ord(c) < 0x20 and c != "\t" or 0x7F <= ord(c) <= 0x9F for c in word)


def test_hostile_values_round_trip_through_bash_and_print_safely():
    words = [quote(v) for v in HOSTILE]
    assert all(_printable(w) for w in words), words
    assert _bash_reads(words) == HOSTILE
    assert quote("plain-value") == "plain-value" and quote("a b") == "'a b'"
    assert assignment("TOKEN", "x\ry") == "TOKEN=$'x\\x0dy'"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")), max_size=6)
)
def test_any_value_round_trips(values):
    words = [quote(v) for v in values]
    assert all(_printable(w) for w in words)
    assert _bash_reads(words) == values
