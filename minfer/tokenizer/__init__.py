"""Tokenizer from GGUF metadata: byte-level BPE matching llama.cpp, and chat templates.

    from minfer.gguf_file import GGUFFile
    from minfer.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(GGUFFile(path))
    ids = tok.encode("Hello")           # BOS as tokenizer.ggml.add_bos_token says
    text = tok.decode(ids)
"""

from minfer.tokenizer.bpe import PRE_TYPES, StreamDecoder, Tokenizer
from minfer.tokenizer.chat_template import CHATML_TEMPLATE, render_chat

__all__ = ["Tokenizer", "StreamDecoder", "PRE_TYPES", "render_chat", "CHATML_TEMPLATE"]
