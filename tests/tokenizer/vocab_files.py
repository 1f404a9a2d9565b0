"""Small GGUF files that carry a real vocab under another tokenizer.ggml.pre.

The catalog models use the qwen2 and smollm pre-tokenizers; to test the llama3
('llama-bpe') and GPT-2 ('gpt-2') rules against llama.cpp too, SmolLM2's byte-level vocab
and merges are written into a vocab-only GGUF with a different pre value. Both
tools/gen_token_goldens.py (for llama.cpp) and the tests (for minfer) build the file with
this function, so they read the same bytes.
"""

from __future__ import annotations

from pathlib import Path

VARIANT_PRES = {"smollm2-as-llama-bpe": "llama-bpe", "smollm2-as-gpt-2": "gpt-2"}
# tokenizer.ggml.add_space_prefix = true on the gpt-2 variant: llama.cpp's BPE ignores it
# when encoding but strips one leading space of the first token when decoding
ADD_SPACE_PREFIX = {"gpt-2"}
BASE_MODEL = "smollm2-135m-instruct"
# pre types with no catalog model: a vocab of llama.cpp's suite (tools/fetch_llama_cpp.py) of the
# same family written under that pre -- DeepSeek-V3's vocab descends from deepseek-llm's, Kimi's
# is tiktoken-style like Qwen2's, Tiny Aya's is Cohere's (command-r). name -> (suite vocab, pre)
PRE_VARIANTS = {
    "deepseek-llm-as-deepseek-v3": ("deepseek-llm", "deepseek-v3"),
    "qwen2-as-kimi-k2": ("qwen2", "kimi-k2"),
    "command-r-as-tiny_aya": ("command-r", "tiny_aya"),
    # Tekken (Mistral NeMo / Small 3.x) is tiktoken-style like Llama 3's vocab: its flags
    # (ignore_merges, add_bos, clean_spaces off) on a real vocab
    "llama-bpe-as-tekken": ("llama-bpe", "tekken"),
}


def write_vocab_variant(base_metadata: dict, pre: str, out: Path) -> Path:
    """A vocab-only GGUF (arch llama, no tensors) with the base tokenizer and `pre`."""
    import gguf

    w = gguf.GGUFWriter(str(out), "llama")
    # the hyper-parameters llama.cpp's loader reads before it reaches the vocab
    w.add_context_length(2048)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_block_count(1)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(base_metadata["tokenizer.ggml.tokens"])
    w.add_token_types(base_metadata["tokenizer.ggml.token_type"])
    w.add_token_merges(base_metadata["tokenizer.ggml.merges"])
    w.add_bos_token_id(int(base_metadata["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(base_metadata["tokenizer.ggml.eos_token_id"]))
    if pre in ADD_SPACE_PREFIX:
        w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out

# the same pre types on a vocab that makes llama.cpp's split visible (write_piece_vocab)
PIECE_PRES = {"pieces-as-deepseek-v3": "deepseek-v3", "pieces-as-kimi-k2": "kimi-k2",
              "pieces-as-tiny_aya": "tiny_aya",
              # the same vocab without tokenizer.ggml.merges, which llama.cpp allows for kimi-k2
              "pieces-as-kimi-k2-no-merges": "kimi-k2"}
# the pre names added after those (minfer/tokenizer/pretok.py: the other names of llama.cpp's
# load() chain), each with a piece golden of its own (tests/tokenizer/test_tok_more_pres.py)
MORE_PRES = ("falcon-h1", "pixtral", "midm-2.0", "lfm2", "gigachat", "a.x-4.0", "mellum", "exaone4", "olmo",
             "jais", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2", "stablelm2", "hunyuan-dense",
             "joyai-llm", "hy_v4", "codeshell", "exaone", "minerva-7b", "mellum2", "minimax-m2", "dbrx",
             "smaug-bpe", "trillion", "granite-docling", "tekken", "seed-coder", "bailingmoe", "bailingmoe2",
             "llada-moe", "exaone-moe", "minicpm5", "ufakzeka", "spark2_5", "laguna", "poro-chat", "bloom",
             "gpt3-finnish", "viking", "chameleon")
PIECE_PRES.update({f"pieces-as-{p}": p for p in MORE_PRES})

_COPIED_KEYS = ("bos_token_id", "eos_token_id", "padding_token_id", "add_bos_token", "add_eos_token")


def write_pre_variant(base_metadata: dict, pre: str, out: Path) -> Path:
    """A vocab-only GGUF (arch llama, no tensors) with the base file's tokens, types, merges,
    special ids and add_bos/add_eos flags, and `pre` as tokenizer.ggml.pre."""
    import gguf

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_context_length(2048)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_block_count(1)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(base_metadata["tokenizer.ggml.tokens"])
    w.add_token_types(base_metadata["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.merges" in base_metadata:
        w.add_token_merges(base_metadata["tokenizer.ggml.merges"])
    for k in _COPIED_KEYS:
        v = base_metadata.get(f"tokenizer.ggml.{k}")
        if isinstance(v, bool):
            w.add_bool(f"tokenizer.ggml.{k}", v)
        elif v is not None:
            w.add_uint32(f"tokenizer.ggml.{k}", int(v))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _byte_chars() -> list[str]:
    """GPT-2's byte -> character map of byte-level BPE vocabs (openai/gpt-2 encoder.py)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def piece_vocab(texts: list[str]) -> tuple[list[str], list[str]]:
    """Tokens and merges under which every pre-token of these texts becomes one token: every
    byte, every byte substring of a text, and a merge for every way to cut such a substring in
    two. Whatever order the BPE merges in, two neighbouring symbols of one pre-token form a
    substring, so they merge, until the pre-token is one symbol; the ids then spell the split."""
    chars = _byte_chars()
    tokens = dict.fromkeys(chars)
    merges: dict[str, None] = {}
    for t in texts:
        e = "".join(chars[b] for b in t.encode("utf-8"))
        for i in range(len(e)):
            for j in range(i + 2, len(e) + 1):
                sub = e[i:j]
                tokens.setdefault(sub)
                for k in range(1, len(sub)):
                    merges.setdefault(f"{sub[:k]} {sub[k:]}")
    return list(tokens), list(merges)


def write_piece_vocab(texts: list[str], pre: str, out: Path, with_merges: bool = True) -> Path:
    """A vocab-only GGUF of piece_vocab(texts) under `pre` (all tokens NORMAL, no special ids;
    with_merges=False: no tokenizer.ggml.merges key)."""
    tokens, merges = piece_vocab(texts)
    meta = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [1] * len(tokens)}
    if with_merges:
        meta["tokenizer.ggml.merges"] = merges
    return write_pre_variant(meta, pre, out)
