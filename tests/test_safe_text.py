"""safe_text: untrusted strings as one printable line of bounded length."""

from __future__ import annotations

import pytest

from minfer.safe_text import quoted, safe


@pytest.mark.parametrize("raw,shown", [
    ("blk.0.attn_q.weight", "blk.0.attn_q.weight"),
    ("a\nb\tc\rd", "a\\nb\\tc\\rd"),
    ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),       # OSC: retitles a terminal
    ("\x9b31m", "\\x9b31m"),                          # C1 CSI
    ("x\u202eevil", "x\\u202eevil"),                  # bidi override (Trojan Source)
    ("\u2028", "\\u2028"),
    ("a\\x1b", "a\\\\x1b"),                           # a literal backslash cannot fake an escape
    ("\ud800", "\\ud800"),                            # a lone surrogate would not print at all
    ("é中文", "é中文"),                                 # printable non-ASCII stays as it is
])
def test_escapes(raw, shown):
    assert safe(raw) == shown
    assert safe(raw).isprintable()


def test_truncates_before_escaping():
    s = safe("\x00" * 10**6, limit=10)
    assert s == "\\x00" * 10 + "... (999,990 more characters)"


def test_non_strings():
    assert safe(b"ab\xff\x1b") == "ab\\\\xff\\x1b"
    assert safe(2**5000).startswith("<an integer of 5001 bits>")
    assert safe(list(range(100))).endswith("... (100 items)]")
    assert quoted("x\ny") == "'x\\ny'"
