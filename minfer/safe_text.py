"""Untrusted strings made safe to print: one line, no terminal control, bounded length.

Names and values that come from a GGUF file or a request (tensor names, metadata keys and
values, template error texts) can hold newlines, ESC/OSC terminal sequences (which a terminal
obeys: retitle the window, rewrite the screen, hide text) or megabytes of text. Every message
and `minfer inspect` line that shows such a string passes it through `safe()` first:

- C0/C1 control characters, DEL, and the Unicode line/paragraph separators and bidirectional
  overrides (which reorder what a terminal shows, CVE-2021-42574 "Trojan Source") are written
  as Python escapes (`\\n`, `\\x1b`, `\\u202e`);
- a backslash is doubled, so an escape in the output always means "this was escaped";
- the result is cut at `limit` characters with a note of how much was left out.
"""

from __future__ import annotations

import re
from typing import Any

DEFAULT_LIMIT = 120

# C0 controls, DEL, C1 controls; U+2028/2029 (line/paragraph separators); the bidi embedding,
# override and isolate controls U+202A..U+202E and U+2066..U+2069; U+200E/200F marks;
# lone surrogates (cannot be encoded to UTF-8, so printing them raises); the backslash.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f"
                     "\ud800-\udfff\\\\]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _escape(m: re.Match) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def safe(value: Any, limit: int = DEFAULT_LIMIT) -> str:
    """`value` as one printable line of at most about `limit` characters (plus the cut note).

    Non-strings are shown with str(); bytes are decoded with backslash escapes for the
    non-UTF-8 ones. The length is cut before escaping, so a 1 MiB name costs O(limit).
    """
    if isinstance(value, bytes):
        value = value[: limit * 4].decode("utf-8", errors="backslashreplace")
    elif not isinstance(value, str):
        value = _short_str(value, limit)
    n = len(value)
    cut = value[:limit]
    out = _UNSAFE.sub(_escape, cut)
    if n > limit:
        out += f"... ({n - limit:,} more characters)"
    return out


def _short_str(value: Any, limit: int) -> str:
    """str() of a value without building a huge string for a huge list or int."""
    if isinstance(value, (list, tuple)):
        head = ", ".join(_short_str(v, limit) for v in value[:8])
        more = f", ... ({len(value)} items)" if len(value) > 8 else ""
        return f"[{head}{more}]"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<an integer of {value.bit_length()} bits>"
    try:
        s = str(value)
    except Exception as e:  # a value whose str() fails is still shown as something
        return f"<{type(value).__name__}: {type(e).__name__}>"
    return s


def quoted(value: Any, limit: int = DEFAULT_LIMIT) -> str:
    """safe() inside single quotes, for names in messages: tensor 'blk.0.attn_q.weight'."""
    return f"'{safe(value, limit)}'"
