"""GenEvents -> OpenAI response objects (chat.completion, text_completion and their stream chunks).

Formats from OpenAI's API reference: chat logprobs are {"content": [{"token", "logprob", "bytes",
"top_logprobs": [...]}]}; legacy completions logprobs are parallel lists {"tokens",
"token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}.
"""

from __future__ import annotations

from typing import Any

from minfer.server.worker import Finished


def _alternatives(ev: Any) -> list[tuple[int, float]]:
    """The event's top alternatives as (token_id, logprob), best first, whatever container the
    engine used: a dict {id: logprob}, a list of pairs, or a list of objects with fields."""
    top = getattr(ev, "top_logprobs", None)
    if not top:
        return []
    if isinstance(top, dict):
        pairs = [(int(k), float(v)) for k, v in top.items()]
    else:
        pairs = []
        for item in top:
            if isinstance(item, (tuple, list)):
                pairs.append((int(item[0]), float(item[1])))
            else:
                pairs.append((int(item.token_id), float(item.logprob)))
    pairs.sort(key=lambda p: -p[1])
    return pairs


class Accumulator:
    """Collects one request's generated text and logprobs; `add` returns what is new for a chunk.

    n_top: None when the client asked for no logprobs, else the number of alternatives wanted.
    skip_special: the engine leaves control tokens' text out of the answer (skip_special_tokens),
    so their logprob entries take no room in it (completions' text_offset).
    """

    def __init__(self, tokenizer: Any, n_top: int | None, chat: bool, base_offset: int = 0,
                 skip_special: bool = False) -> None:
        self.tok = tokenizer
        self.skip_special = skip_special
        self.base_offset = base_offset  # completions' text_offset counts an echoed prompt
        self.n_top = n_top
        self.chat = chat
        self.text_parts: list[str] = []
        self.n_chars = 0
        self.logprobs: list[dict] = []  # chat: entries; completions: one dict per token
        self._piece_cache: dict[int, bytes] = {}
        # tokens whose text the engine still holds back (a possible stop string's start): their
        # logprobs go out with that text, and are dropped with it when it was a stop string
        self._pending: list[tuple[Any, int]] = []

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes (a piece of a multi-byte character stays a piece)."""
        b = self._piece_cache.get(token_id)
        if b is None:
            piece_bytes = getattr(self.tok, "piece_bytes", None)
            b = piece_bytes(token_id) if piece_bytes else self.tok.decode([token_id]).encode("utf-8")
            self._piece_cache[token_id] = b
        return b

    def token_str(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def shown_str(self, token_id: int) -> str:
        """The token's text as the answer holds it ('' for a skipped control token)."""
        if self.skip_special and hasattr(self.tok, "piece_bytes"):
            return self.tok.piece_bytes(token_id, True).decode("utf-8", errors="replace")
        return self.token_str(token_id)

    def completion_token(self, token_id: int) -> str:
        """Legacy completions' token string: a token that is not whole UTF-8 (a piece of a
        multi-byte character) is written "bytes:\\xe2\\x80", as OpenAI's completions API does."""
        b = self.token_bytes(token_id)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{x:02x}" for x in b)

    def add(self, ev: Any) -> tuple[str, list[dict]] | None:
        """Fold one GenEvent in; returns (new text, new logprob entries) or None if nothing new.

        A token's logprob entry is released with the text it produced: a token whose text is held
        back (it may start a stop string) waits, and one whose text turned out to be the stop
        string is dropped with that text, as llama.cpp's server does, so the tokens and
        text_offset always describe the text returned (they listed the stop string's tokens,
        past the text's end, and gave held-back tokens the offset of an earlier one)."""
        text = getattr(ev, "text", "") or ""
        tid = getattr(ev, "token_id", None)
        if self.n_top is not None and tid is not None:
            self._pending.append((ev, tid))
        finish = getattr(ev, "finish_reason", None)
        entries: list[dict] = []
        if self._pending and (text or finish is not None):
            if text or finish != "stop" or tid in getattr(self.tok, "eog_ids", ()):
                entries = self._release(len(text))
            self._pending = []   # at a stop string with no text: the stop string's tokens
        if text:
            self.text_parts.append(text)
            self.n_chars += len(text)
        self.logprobs.extend(entries)
        if not text and not entries:
            return None
        return text, entries

    def _release(self, n_text: int) -> list[dict]:
        """The pending tokens' entries, placed in the next n_text characters of the answer."""
        out, pos = [], 0
        for ev, tid in self._pending:
            out.append(self._entry(ev, tid, self.base_offset + self.n_chars + min(pos, n_text)))
            pos += len(self.shown_str(tid))
        return out

    def _entry(self, ev: Any, tid: int, offset: int) -> dict:
        lp = getattr(ev, "logprob", None)
        lp = float(lp) if lp is not None else None
        alts = _alternatives(ev)[: self.n_top]
        if self.chat:
            s = self.token_str(tid)
            return {"token": s, "logprob": lp, "bytes": list(self.token_bytes(tid)),
                    "top_logprobs": [{"token": self.token_str(i), "logprob": v,
                                      "bytes": list(self.token_bytes(i))} for i, v in alts]}
        return {"token": self.completion_token(tid), "logprob": lp, "offset": offset,
                "top": {self.completion_token(i): v for i, v in alts}}

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def usage(self, fin: Finished) -> dict:
        return {"prompt_tokens": fin.n_prompt, "completion_tokens": fin.n_generated,
                "total_tokens": fin.n_prompt + fin.n_generated}


def completion_logprobs(entries: list[dict]) -> dict:
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [e["top"] for e in entries], "text_offset": [e["offset"] for e in entries]}


def chat_response(rid: str, created: int, model: str, acc: Accumulator, fin: Finished) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": acc.text},
              "logprobs": {"content": acc.logprobs} if acc.n_top is not None else None,
              "finish_reason": fin.finish_reason}
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [choice], "usage": acc.usage(fin)}


def chat_chunk(rid: str, created: int, model: str, piece: tuple[str, list[dict]] | None,
               finish_reason: str | None, role: bool, include_usage: bool) -> dict:
    """The first chunk carries the role, the middle ones text/logprobs, the last the finish reason."""
    if role:
        delta: dict = {"role": "assistant", "content": ""}
    elif piece is not None:
        delta = {"content": piece[0]}
    else:
        delta = {}
    logprobs = {"content": piece[1]} if piece is not None and piece[1] else None
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}
    if include_usage:
        chunk["usage"] = None  # OpenAI: null on every chunk but the extra last one
    return chunk


def completion_response(rid: str, created: int, model: str, acc: Accumulator, fin: Finished,
                        echo: str) -> dict:
    choice = {"index": 0, "text": echo + acc.text,
              "logprobs": completion_logprobs(acc.logprobs) if acc.n_top is not None else None,
              "finish_reason": fin.finish_reason}
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [choice], "usage": acc.usage(fin)}


def completion_chunk(rid: str, created: int, model: str, piece: tuple[str, list[dict]] | str | None,
                     finish_reason: str | None, include_usage: bool) -> dict:
    if isinstance(piece, str):  # the echoed prompt
        text, logprobs = piece, None
    elif piece is not None:
        text, logprobs = piece[0], (completion_logprobs(piece[1]) if piece[1] else None)
    else:
        text, logprobs = "", None
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}]}
    if include_usage:
        chunk["usage"] = None
    return chunk
