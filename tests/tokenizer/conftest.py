"""Fixtures: tokenizers of the real catalog models and of the pre-type variants, loaded once.

Goldens (goldens/<name>.json) come from llama.cpp itself (tools/gen_token_goldens.py).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from vocab_files import BASE_MODEL, PRE_VARIANTS, VARIANT_PRES, write_pre_variant, write_vocab_variant

GOLDEN_DIR = Path(__file__).parent / "goldens"
CHATML_MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]  # ChatML templates
CATALOG_MODELS = CHATML_MODELS
# vocabs of llama.cpp's suite (tools/fetch_llama_cpp.py) with goldens of their own: one of
# each family that no catalog model covers
SUITE_GOLDENS: list[str] = []
# catalog models with a llama.cpp golden of their own but no ChatML template (gemma-3-270m: its
# SentencePiece vocab; test_tok_gemma3.py checks it against Google's sentencepiece too)
OTHER_CATALOG_GOLDENS = ["gemma-3-270m"]
ALL_VOCABS = CATALOG_MODELS + list(VARIANT_PRES) + list(PRE_VARIANTS) + SUITE_GOLDENS + OTHER_CATALOG_GOLDENS

_TOOL = Path(__file__).resolve().parents[2] / "tools" / "fetch_llama_cpp.py"
_spec = importlib.util.spec_from_file_location("fetch_llama_cpp", _TOOL)
fetch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fetch)


def load_golden(name: str) -> dict:
    """goldens/<name>.json, or <name>.json.gz where tools/gen_token_goldens.py stored a large one gzipped."""
    packed = GOLDEN_DIR / f"{name}.json.gz"
    if packed.exists():
        return json.loads(gzip.decompress(packed.read_bytes()).decode("utf-8"))
    return json.loads((GOLDEN_DIR / f"{name}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def gguf_files(tmp_path_factory):
    """name (catalog model, pre variant or llama.cpp suite vocab) -> GGUFFile, opened on first
    use (the Qwen vocab takes seconds to read)."""
    from minfer.catalog import resolve_model
    from minfer.gguf_file import GGUFFile

    cache: dict = {}
    tmp = tmp_path_factory.mktemp("vocab_variants")

    def get(name: str):
        if name in fetch.SUITE:  # one of llama.cpp's ggml-vocab-<name>.gguf: not kept (the
            # tokenizers fixture keeps the Tokenizer; 15 files' metadata would hold ~400 MB)
            return GGUFFile(fetch.suite_dir() / f"ggml-vocab-{name}.gguf")
        if name not in cache:
            if name in PRE_VARIANTS:  # a suite vocab under another pre (vocab_files.py)
                suite, pre = PRE_VARIANTS[name]
                base = GGUFFile(fetch.suite_dir() / f"ggml-vocab-{suite}.gguf")
                cache[name] = GGUFFile(write_pre_variant(base.metadata, pre, tmp / f"{name}.gguf"))
            elif name in VARIANT_PRES:
                base = get(BASE_MODEL)
                path = write_vocab_variant(base.metadata, VARIANT_PRES[name], tmp / f"{name}.gguf")
                cache[name] = GGUFFile(path)
            else:
                cache[name] = GGUFFile(resolve_model(name))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def tokenizers(gguf_files):
    """name -> minfer Tokenizer, built on first use."""
    from minfer.tokenizer import Tokenizer

    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = Tokenizer.from_gguf(gguf_files(name))
        return cache[name]

    return get
