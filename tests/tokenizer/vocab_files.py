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
MORE_PRES = ("falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano", "gigachat", "a.x-4.0", "mellum", "exaone4", "olmo",
             "jais", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2", "stablelm2", "hunyuan-dense",
             "joyai-llm", "hy_v4", "codeshell", "exaone", "minerva-7b", "mellum2", "minimax-m2", "dbrx",
             "smaug-bpe", "trillion", "granite-docling", "tekken", "seed-coder", "bailingmoe", "bailingmoe2",
             "llada-moe", "exaone-moe", "minicpm5", "ufakzeka", "spark2_5", "laguna", "poro-chat", "bloom",
             "gpt3-finnish", "viking", "chameleon", "jais-2", "granite-embed-multi-97m", "youtu",
             "afmoe", "superbpe")
# the embedding / reranker models' names (pretok.py: GPT-2's rules; add_sep on for jina-v1-en, jina-v2-code,
# roberta-bpe; <mask> LSTRIP for jina-v2-de / -es / -code): their piece vocabs end with EMBED_SPECIALS as
# control tokens (BOS <s>, EOS and SEP </s>, <mask>: a RoBERTa-style vocab), so llama.cpp's partition
# (<mask> eating the space before it or not) and rerank flags show in the goldens
EMBED_PRES = ("jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "modern-bert", "jina-v1-en", "jina-v2-code",
              "roberta-bpe")
EMBED_SPECIALS = ("<s>", "</s>", "<mask>")
# pre names whose BPE runs on raw UTF-8 (byte_encode false): their piece vocab is raw (raw_piece_vocab),
# under tokenizer.ggml.model 'whitespace', the pair llama.cpp's converter writes (jina-embeddings-v2-base-zh)
RAW_PRES = ("whitespace",)
# SPM-style BPE pre names (escape_whitespace, byte_encode false: pretok.py "sarvam-moe"): the raw_piece_vocab of
# the texts with their spaces escaped to U+2581, and its byte tokens, under tokenizer.ggml.model 'gpt2'
SPM_BPE_PRES = ("sarvam-moe",)
MORE_PRES = MORE_PRES + EMBED_PRES + RAW_PRES + SPM_BPE_PRES
PIECE_PRES.update({f"pieces-as-{p}": p for p in MORE_PRES})
# piece goldens of a pre under other write_piece_vocab options: name -> (pre, options)
PIECE_OPTIONS = {
    # (pre 'whitespace' under tokenizer.ggml.model 'gpt2' has none: llama.cpp aborts on a run of white space
    # with a space in it there, llama_vocab::find_bpe_rank's GGML_ASSERT; minfer refuses the pair)
    # tokenizer.ggml.normalizer.lowercase true: the 'whitespace' session lowercases each code point
    "pieces-as-whitespace-lower": ("whitespace", {"extra_kv": {"normalizer.lowercase": True}}),
}
PIECE_PRES.update({k: v[0] for k, v in PIECE_OPTIONS.items()})

_COPIED_KEYS = ("bos_token_id", "eos_token_id", "padding_token_id", "add_bos_token", "add_eos_token")


def write_pre_variant(base_metadata: dict, pre: str, out: Path, model: str = "gpt2",
                      extra_kv: dict | None = None, name: str | None = None) -> Path:
    """A vocab-only GGUF (arch llama, no tensors) with the base file's tokens, types, merges,
    special ids and add_bos/add_eos flags, and `pre` as tokenizer.ggml.pre; `model` as
    tokenizer.ggml.model; extra_kv: more tokenizer.ggml.<key> values (bool or int); name: general.name."""
    import gguf

    w = gguf.GGUFWriter(str(out), "llama")
    if name is not None:
        w.add_name(name)
    w.add_context_length(2048)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_block_count(1)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(model)
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
    for k, v in (extra_kv or {}).items():
        if isinstance(v, bool):
            w.add_bool(f"tokenizer.ggml.{k}", v)
        else:
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


# llama.cpp's unicode_set_whitespace (White_Space): the 'whitespace' session cuts there
WHITE_SPACE = frozenset(map(chr, [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                                  0x2028, 0x2029, 0x202F, 0x205F, 0x3000]))
# characters no token of a raw piece vocab holds (spelled with <0xXX> byte tokens), and a byte with no
# byte token (0x82, in the UTF-8 of U+20AC: dropped)
RAW_MISSING, RAW_NO_BYTE = frozenset("\U0001F600\u20ac\u0301"), 0x82


def raw_piece_vocab(texts: list[str]) -> tuple[list[str], list[str]]:
    """piece_vocab for a raw-UTF-8 BPE (byte_encode false): every character of the texts and of their
    lowercase forms, every substring of each White_Space-free run and of its lowercase form, a merge
    for every cut of those
    (so no merge holds a space), then <0xXX> byte tokens; RAW_MISSING stays out of every token."""
    tokens: dict[str, None] = {}
    merges: dict[str, None] = {}
    for t in texts:
        tokens.update((c, None) for c in t if c not in RAW_MISSING)
        runs = "".join(" " if c in WHITE_SPACE else c for c in t).split(" ")
        for run in runs + ["".join(c.lower()[:1] for c in r) for r in runs]:
            tokens.update((c, None) for c in run if c not in RAW_MISSING)
            for i in range(len(run)):
                for j in range(i + 2, len(run) + 1):
                    sub = run[i:j]
                    if RAW_MISSING.isdisjoint(sub):
                        tokens.setdefault(sub)
                        for k in range(1, len(sub)):
                            merges.setdefault(f"{sub[:k]} {sub[k:]}")
    return list(tokens), list(merges)


def write_piece_vocab(texts: list[str], pre: str, out: Path, with_merges: bool = True, model: str | None = None,
                      extra_kv: dict | None = None) -> Path:
    """A vocab-only GGUF of piece_vocab(texts) under `pre` (all tokens NORMAL, no special ids;
    with_merges=False: no tokenizer.ggml.merges key). A pre of EMBED_PRES gets EMBED_SPECIALS after
    them (CONTROL, with bos / eos / seperator / mask ids); one of RAW_PRES the raw_piece_vocab and its
    byte tokens (BYTE) under tokenizer.ggml.model 'whitespace' (SPM_BPE_PRES: that of the escaped texts, under
    'gpt2'). model: another tokenizer.ggml.model;
    extra_kv: more tokenizer.ggml.<key> values."""
    spm = pre in SPM_BPE_PRES
    tokens, merges = (raw_piece_vocab([t.replace(" ", "\u2581") for t in texts]) if spm else
                      raw_piece_vocab(texts) if pre in RAW_PRES else piece_vocab(texts))
    types = [1] * len(tokens)
    kv = {}
    if pre in RAW_PRES or spm:
        tokens += [f"<0x{b:02X}>" for b in range(256) if b != RAW_NO_BYTE]
        types += [6] * 255
    if pre in EMBED_PRES:  # (llama.cpp refuses a vocab with a text twice: the normal "<s>" etc. go)
        tokens = [t for t in tokens if t not in EMBED_SPECIALS]
        types = types[:len(tokens)]
        n = len(tokens)
        tokens += list(EMBED_SPECIALS)
        types += [3] * len(EMBED_SPECIALS)
        kv = {"bos_token_id": n, "eos_token_id": n + 1, "seperator_token_id": n + 1, "mask_token_id": n + 2}
    meta = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    if with_merges:
        meta["tokenizer.ggml.merges"] = merges
    return write_pre_variant(meta, pre, out, model or ("whitespace" if pre in RAW_PRES else "gpt2"),
                             {**kv, **(extra_kv or {})})
