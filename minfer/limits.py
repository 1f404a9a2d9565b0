"""Limits on untrusted input that is not a file: server requests and command-line text.

The server checks a chat request against MAX_MESSAGES and MAX_REQUEST_CHARS before it
renders or tokenizes anything (issue 15: one 8 MiB request of 200,000 tiny messages cost 5 s
of CPU and 610 MB before its 400). Text a client or a shell hands over must be valid Unicode:
JSON can carry a lone surrogate ("\\ud800"), and Python turns invalid UTF-8 in argv into lone
surrogates (PEP 383), which the tokenizer cannot encode; both are refused with the field named.
"""

from __future__ import annotations

import re
import sys
from typing import Iterable

from minfer.errors import MinferError
from minfer.safe_text import safe

# Far above what a context of 128k tokens holds (~4 characters a token), far below what
# hurts: 200,000 messages cost seconds before these limits.
MAX_MESSAGES = 4096
MAX_REQUEST_CHARS = 4 << 20

_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in text, or None."""
    m = _SURROGATE.search(text)
    return None if m is None else m.start()


def check_text(text: str, what: str) -> str:
    """`text` itself, or MinferError when it holds a lone surrogate (invalid UTF-8 from argv)."""
    at = lone_surrogate(text)
    if at is not None:
        c = ord(text[at])
        why = (f"byte 0x{c - 0xDC00:02x} that is not valid UTF-8" if 0xDC80 <= c <= 0xDCFF
               else f"a lone surrogate \\u{c:04x}, which is not valid Unicode")
        raise MinferError(f"{what} has {why} at character {at}")
    return text


def read_stdin(what: str) -> str:
    """All of stdin as text; invalid UTF-8 is a one-line MinferError naming the byte offset."""
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    if isinstance(data, str):
        return check_text(data, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MinferError(f"{what} (stdin) is not UTF-8 text ({e.reason} at byte {e.start})") from None


def unescape_flag(value: str, flag: str) -> str:
    """A flag value with backslash escapes (\\n, \\t, \\x41, \\u00e9) turned into characters, as
    typed on a shell; non-ASCII text survives. A broken escape is a MinferError naming the flag."""
    check_text(value, flag)
    if "\\" not in value:
        return value
    try:
        return value.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError as e:
        raise MinferError(f"{flag} {safe(value, 40)}: a broken backslash escape ({e.reason}); "
                          "write a backslash itself as \\\\") from None


def request_problem(messages: Iterable[tuple[str, str]], n_messages: int,
                    max_messages: int = MAX_MESSAGES, max_chars: int = MAX_REQUEST_CHARS) -> tuple[str, str] | None:
    """(param, message) for the first limit a request breaks, else None.

    messages: (field path, text) of every string the request carries (content, names, stop).
    """
    if n_messages > max_messages:
        return "messages", (f"{n_messages:,} messages; this server accepts at most {max_messages:,} "
                            "per request")
    total = 0
    for where, text in messages:
        total += len(text)
        if total > max_chars:
            return where, (f"the request's text runs past {max_chars:,} characters (at {where}); "
                           "this server accepts at most that many per request")
        at = lone_surrogate(text)
        if at is not None:
            return where, (f"{where} has a lone surrogate \\u{ord(text[at]):04x} at character {at}, "
                           "which is not valid Unicode")
    return None


def request_texts(req) -> Iterable[tuple[str, str]]:
    """(field path, text) of every string in a pydantic request, in order (messages[0].content ...)."""
    stack: list[tuple[str, object]] = [("", req.model_dump() if hasattr(req, "model_dump") else req)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            yield where, v
        elif isinstance(v, dict):
            stack.extend((f"{where}.{k}" if where else str(k), x) for k, x in reversed(list(v.items())))
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{where}[{i}]", x) for i, x in reversed(list(enumerate(v))))


# A temperature this small is greedy in all but exact ties (vLLM's _SAMPLING_EPS); one below
# float32's range (1e-38 and under) divided the logits into inf and NaN probabilities, which
# the server answered with a 500 "generation failed" and the CLI with an error after the load.
GREEDY_BELOW = 1e-5


def effective_temperature(t):
    """The temperature to sample with: 0 (greedy, the limit) for 0 < t < GREEDY_BELOW, else t
    (a NaN or negative t is left for SamplingParams to refuse by name)."""
    return 0.0 if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < GREEDY_BELOW else t
