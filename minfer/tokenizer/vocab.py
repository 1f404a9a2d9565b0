"""Token attributes, special tokens and end-of-generation ids, as llama.cpp derives them.

Every rule here is a fact of llama.cpp's `src/llama-vocab.cpp` (llama_vocab::impl::load,
commit 0c1e57098 vendored in llama-cpp-python 0.3.36); the line of reasoning is cited at
each rule so that a later llama.cpp change can be followed.
"""

from __future__ import annotations

from dataclasses import dataclass

# Token attribute bits (include/llama.h: enum llama_token_attr).
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7   # whitespace before the token's text is dropped when partitioning
ATTR_RSTRIP = 1 << 8   # whitespace after it is dropped

# tokenizer.ggml.token_type values (gguf-py constants: TokenType) -> attribute bits
# (llama-vocab.cpp: the switch over toktypes[i] in load()).
_TYPE_TO_ATTR = {0: ATTR_UNDEFINED, 1: ATTR_NORMAL, 2: ATTR_UNKNOWN, 3: ATTR_CONTROL,
                 4: ATTR_USER_DEFINED, 5: ATTR_UNUSED, 6: ATTR_BYTE}

# Texts that llama.cpp recognizes as special ids when the metadata does not name them
# (llama-vocab.cpp: "auto-detect special tokens by text"): EOT, EOM and the FIM tokens;
# each found token is also forced to CONTROL.
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# End-of-generation texts (llama-vocab.cpp: "maintain a list of tokens that cause
# end-of-generation ... determined based on the token text", ref llama.cpp issue 9606).
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
))

# metadata key suffix (tokenizer.ggml.<suffix>) -> special id name
_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id",
            "eom": "eom_token_id", "unk": "unknown_token_id", "pad": "padding_token_id",
            "sep": "seperator_token_id", "mask": "mask_token_id",  # (sic: gguf's spelling)
            "fim_pre": "fim_pre_token_id", "fim_suf": "fim_suf_token_id",
            "fim_mid": "fim_mid_token_id", "fim_pad": "fim_pad_token_id",
            "fim_rep": "fim_rep_token_id", "fim_sep": "fim_sep_token_id"}


# Default special ids per vocab type, used where the metadata names none (load(): the
# "default special tokens" of each tokenizer_model branch; gemma4 has none).
DEFAULT_IDS = {
    "spm": {"bos": 1, "eos": 2, "unk": 0},
    "wpm": {"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103},
    "bpe": {"bos": 11, "eos": 11},
    "gemma4": {},
}


@dataclass
class SpecialIds:
    ids: dict[str, int | None]     # bos, eos, eot, eom, unk, pad, fim_* -> id or None
    attrs: list[int]               # per token id, ATTR_* bits
    eog: set[int]                  # end-of-generation ids
    partition_order: list[int]     # ids matched in text before BPE, longest text first
    by_text: dict[str, int]        # token text -> id (the last id of a duplicated text)
    # harmony's turn markers (<|start|>, <|channel|>, <|message|>, <|constrain|>, and <|end|>
    # where it leaves the EOG set): llama.cpp makes them USER_DEFINED so that they render and
    # are always parsed; minfer's chat prompt still keeps a client's copy of them as text
    turn_markers: frozenset[int] = frozenset()


def token_texts(tokens: list[str]) -> list[str]:
    """Vocab texts with llama.cpp's placeholder for empty entries (load(): "[EMPTY_<i>]"). load() reads
    each text as a C string (gguf_get_arr_str: c_str()), so a text ends at its first NUL (a raw-UTF-8
    vocab's "\\x00" token is empty there, and the text "\\x00" falls back to its byte token)."""
    if "\x00" in "".join(tokens):
        tokens = [t.split("\x00", 1)[0] for t in tokens]
    if all(tokens):
        return list(tokens)
    return [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]


def derive_special(texts: list[str], token_types: list[int] | None, meta: dict,
                   kind: str = "bpe", model_name: str = "", arch: str = "") -> SpecialIds:
    """Attributes, special ids and the EOG set of a vocab, following llama_vocab::impl::load.

    `meta` maps a key suffix (e.g. 'eos_token_id') to its metadata value, where present;
    `kind` is the vocab type ('spm', 'bpe', 'wpm', 'gemma4') whose default ids apply;
    `model_name` is general.name, `arch` general.architecture (llama.cpp sets per-token
    attributes by them and by meta['pre']).
    """
    n = len(texts)
    if token_types is None:
        attrs = [ATTR_NORMAL] * n
    else:  # one table lookup per token (262,144 of them for Gemma 3: keep this loop lean)
        table = [_TYPE_TO_ATTR.get(t, ATTR_UNDEFINED) for t in range(7)]
        attrs = [table[t] if 0 <= t < 7 else ATTR_UNDEFINED for t in map(int, token_types[:n])]
    ids: dict[str, int | None] = {}
    defaults = DEFAULT_IDS[kind]
    for name, key in _ID_KEYS.items():
        d = defaults.get(name)
        d = d if d is not None and d < n else None  # a default outside the vocab is disabled
        v = meta.get(key)
        # an out-of-range id in the metadata is ignored by llama.cpp ("bad special token")
        ids[name] = int(v) if v is not None and 0 <= int(v) < n else d

    # llama.cpp walks an unordered_map here, so when several texts of one list are present
    # the one it picks is not defined; we take the lowest id. Every EOT/EOM candidate is also
    # an EOG text, so the EOG set does not depend on that choice.
    # a duplicated text maps to its last id, as token_to_id[word] = i does
    by_text: dict[str, int] = dict(zip(texts, range(n)))

    def detect(name: str, candidates: tuple[str, ...]) -> None:
        if ids[name] is not None:
            return
        found = sorted(by_text[t] for t in candidates if t in by_text)
        if found:
            ids[name] = found[0]
            attrs[found[0]] |= ATTR_CONTROL

    detect("eot", _EOT_TEXTS)
    detect("eom", _EOM_TEXTS)
    for name, cands in _FIM_TEXTS.items():
        detect(name, cands)

    # control tokens whose text says "unused" become UNUSED too (auto-detect unused tokens)
    for i in [i for i, a in enumerate(attrs) if a & ATTR_CONTROL]:
        if "unused" in texts[i] and by_text[texts[i]] == i:
            attrs[i] |= ATTR_UNUSED

    eog: set[int] = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids[k] is not None}
    for t in _EOG_TEXTS:
        if t in by_text:
            eog.add(by_text[t])
            attrs[by_text[t]] |= ATTR_CONTROL
    # gpt-oss: these always render ("quick hack for gpt-oss", set before the sanity checks)
    markers: set[int] = set()
    for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
        if t in by_text:
            attrs[by_text[t]] = ATTR_USER_DEFINED
            markers.add(by_text[t])
    for k in ("eos", "eot", "eom"):  # "sanity checks": these are always end-of-generation
        if ids[k] is not None:
            eog.add(ids[k])
    eog_texts = {texts[i]: i for i in eog if 0 <= i < n}
    # o200k_harmony / solar-open: <|end|> is not EOG when <|return|> and <|call|> (or <|calls|>
    # and <|flush|>) are; it becomes a user-defined token
    has = eog_texts.__contains__
    if "<|end|>" in eog_texts and ((has("<|return|>") and (has("<|call|>") or has("<|calls|>")))
                                   or ((has("<|call|>") or has("<|calls|>")) and has("<|flush|>"))):
        eog.discard(eog_texts["<|end|>"])
        attrs[eog_texts["<|end|>"]] = ATTR_USER_DEFINED
        markers.add(eog_texts["<|end|>"])
    # gemma4 and plamo have a normal </s> token: it leaves the EOG set and is plain text
    if "</s>" in eog_texts and (has("<|tool_response>") or has("<|plamo:eos|>")):
        eog.discard(eog_texts["</s>"])
        attrs[eog_texts["</s>"]] = ATTR_NORMAL

    # special tokens cache: control, user-defined and unknown tokens, longest text first
    # (llama-vocab.cpp: "build special tokens cache"; std::sort by text size, descending)
    special = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
    order = [i for i, a in enumerate(attrs) if a & special]
    order.sort(key=lambda i: -len(texts[i].encode("utf-8")))

    # per-token attributes set by pre / architecture / model name, after the cache above (load(),
    # "Handle per token attributes": one if / else-if chain of substring matches, _contains_any):
    # 1. tokenizer.ggml.pre jina-v2-de / -es / -code or arch nomic-bert-moe / jina-bert-v3: <mask>
    #    (token_to_id.at: the last id of that text; none: only a warning) eats the whitespace before it
    # 2. else Phi-3's special tokens swallow the whitespace after them
    # 3. else a model named "modern-bert": [MASK] eats the whitespace before it
    name, pre = model_name.lower(), str(meta.get("pre") or "")
    if any(p in pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
            any(a in arch for a in ("nomic-bert-moe", "jina-bert-v3")):
        if "<mask>" in by_text:
            attrs[by_text["<mask>"]] |= ATTR_LSTRIP
    elif "phi-3" in name or "phi3" in name:
        for i in order:
            attrs[i] |= ATTR_RSTRIP
        for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if t in by_text:
                attrs[by_text[t]] = attrs[by_text[t]] | ATTR_RSTRIP if on else \
                    attrs[by_text[t]] & ~ATTR_RSTRIP
    elif "modern-bert" in name and "[MASK]" in by_text:
        attrs[by_text["[MASK]"]] |= ATTR_LSTRIP
    return SpecialIds(ids, attrs, eog, order, by_text, frozenset(markers))
