"""A chat prompt the vocab cannot spell because of the chat format's own text, not the user's.

A tiny or unusual SentencePiece vocab without byte tokens can lack '<'. With no
tokenizer.chat_template in the GGUF, minfer falls back to a built-in format (chatml unless the
vocab holds another format's markers); when the vocab has no <|im_start|> token the markers are
plain text, and encoding them failed with "the text holds a character the vocab lacks ('<')"
although the user's message was plain "hello". This module re-words that error so it names the
template's text as the culprit and says what works instead (plain-text continuation).
"""

from __future__ import annotations

from collections.abc import Callable

from minfer.errors import MinferError
from minfer.tokenizer.spm import UnspellableText


def _in_contents(ch: str, messages: list[dict]) -> bool:
    for m in messages:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, str) and ch in c:
            return True
        if isinstance(c, list):   # OpenAI content parts: [{"type": "text", "text": ...}]
            if any(isinstance(p, dict) and isinstance(p.get("text"), str) and ch in p["text"] for p in c):
                return True
    return False


def encode_chat_text(tok, messages: list[dict], encode: Callable[[], list[int]]) -> list[int]:
    """encode() (the rendered chat's tokenization); an UnspellableText whose character is in no
    message's content is re-raised naming the chat format as its source."""
    try:
        return encode()
    except UnspellableText as e:
        if _in_contents(e.char, messages):
            raise
        fmt = tok.chat_format
        if fmt == "gguf":
            src = f"the chat template of {tok.path} (tokenizer.chat_template)"
            hint = ""
        else:
            src = (f"minfer's fallback {fmt} chat format ({tok.path} has no tokenizer.chat_template; "
                   "the format's turn markers are not tokens of this vocab, so they are spelled as text)")
            hint = "; a base model continues plain text instead (minfer run --raw, or the server's /v1/completions)"
        raise MinferError(f"{tok.path}: the chat prompt cannot be tokenized: the text that {src} "
                          f"writes around the messages holds {e.char!r}, a character the vocab cannot "
                          f"spell (no token for it, no byte token){hint}") from e
