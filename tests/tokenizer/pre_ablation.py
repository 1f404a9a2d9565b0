"""Shows that a pre-tokenizer rule is needed: the texts of a llama.cpp golden that minfer gets
wrong when one rule of a pre type is changed (the rest left as it is)."""

from __future__ import annotations

from dataclasses import replace


def golden_misses(gguf_file, pre: str, golden: dict, **changes) -> list[str]:
    """Texts (cases, and the Unicode sweep where the golden has one) whose ids without special
    tokens, or whose decoded text, differ from llama.cpp's when the PreRules of `pre` get
    `changes` (dataclasses.replace keywords)."""
    from minfer.tokenizer import Tokenizer, pretok

    saved = pretok.PRE_TYPES[pre]
    pretok.PRE_TYPES[pre] = replace(saved, **changes)
    try:
        tok = Tokenizer.from_gguf(gguf_file)
    finally:
        pretok.PRE_TYPES[pre] = saved
    bad = []
    for c in golden["cases"] + golden.get("sweep", []):
        want = c.get("ids_no_special", c["ids"])
        if tok.encode(c["text"], add_bos=False, parse_special=False) != want or \
                ("decode" in c and tok.decode(c["ids"]) != c["decode"]):
            bad.append(c["text"])
    return bad
