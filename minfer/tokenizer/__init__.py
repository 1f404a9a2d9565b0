"""Tokenizer from GGUF metadata, matching llama.cpp: byte-level BPE, Gemma 4 BPE,
SentencePiece and WordPiece vocabs; chat templates.

    from minfer.gguf_file import GGUFFile
    from minfer.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(GGUFFile(path))
    ids = tok.encode("Hello")           # BOS as tokenizer.ggml.add_bos_token says
    text = tok.decode(ids)
"""

from minfer.tokenizer.chat_template import CHATML_TEMPLATE, render_chat
from minfer.tokenizer.pretok import PRE_TYPES
from minfer.tokenizer.tokenizer import StreamDecoder, Tokenizer

__all__ = ["Tokenizer", "StreamDecoder", "PRE_TYPES", "render_chat", "CHATML_TEMPLATE"]
