"""Write tests/tokenizer/goldens/nomic-bert-moe.json from llama.cpp's own Unigram tokenizer.

The vocab is llama.cpp's suite file models/ggml-vocab-nomic-bert-moe.gguf (XLM-RoBERTa's
250,048-token SentencePiece Unigram vocab with its precompiled_charsmap, tokenizer.ggml.model
't5', llama.cpp's UGM type), fetched by tools/fetch_llama_cpp.py (EXTRA). Everything in the
golden comes from llama.cpp through llama-cpp-python's ctypes bindings (gen_token_goldens'
LlamaVocab: llama_tokenize, llama_detokenize, llama_token_to_piece, llama_vocab_get_attr);
nothing here imports minfer's tokenizer.

    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_ugm_goldens.py

(/tmp/llcpp-site: llama-cpp-python 0.3.36's package with libllama built from its vendored
llama.cpp, as in tests/tokenizer/README.md.)

Per text: ids of llama_tokenize for the four (add_special, parse_special) combinations;
llama_detokenize (remove_special=false) of the (true, true) ids with and without
unparse_special, and of the (false, false) ids with it. The texts: gen_token_goldens' CASES,
PRE_CASES and 60 fuzz strings, the Unigram cases below (whitespace runs, NFKC-sensitive
characters, the vocab's special-token texts), every other text of its Unicode sweep (ids
without specials only), and one long text of ~6 KB. Then the same for two variants of the
vocab (VARIANTS below, fewer texts: ids with and without specials, detokenized text) and the
pieces of the tokens they add.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fetch_llama_cpp  # noqa: E402
import gen_token_goldens as G  # noqa: E402

NAME = "nomic-bert-moe"
OUT = G.OUT_DIR / f"{NAME}.json"
COMMAND = "PYTHONPATH=/tmp/llcpp-site " + " ".join([sys.executable, "tools/gen_ugm_goldens.py", *sys.argv[1:]])

# What the Unigram normalizer and its Viterbi must get right: XLM-R's charsmap is nmt_nfkc
# (NFKC plus whitespace and control-character rules), and remove_extra_whitespaces is on.
UGM_CASES = [
    # whitespace: runs, leading / trailing, tabs and newlines, only whitespace, other spaces
    " ", "  ", "\t", "\n", " \n ", "a", " a", "a ", "  a  ", "a  b", "a\tb", "a\nb", "a\n\nb",
    "a \t\n b", "\t\tindent", "line1\r\nline2", "trailing\n", "\u00a0a\u00a0b\u00a0", "a\u2002b\u2003c",
    "a\u3000b", "a\u200bb", "a\u200db", "a\ufeffb", "a\u2028b", "a\x0bb\x0cc", "\x00a", "a\x01\x02b",
    "a\u00adb", "\u2581", "\u2581\u2581a", "a\u2581b", " \u2581 ",
    # NFKC: full-width letters and digits, ligatures, compatibility forms, composed sequences
    "ＡＢＣａｂｃ１２３", "Ｈｅｌｌｏ　Ｗｏｒｌｄ！", "ﬁne ﬂow ﬀ ﬃ ﬄ ﬅ ﬆ", "Ⅻ ⅻ ① ⑩ ㈱ ㎏ ㎞ ℃ № ™",
    "½ ¼ ¾ ² ³ ¹ ⁿ ₂", "ｶﾀｶﾅ ﾊﾟﾋﾟ", "ガ か\u3099", "e\u0301 é ñ n\u0303", "Å A\u030a Ω Ω",
    "ǅ ǆ Ǆ", "ſt ẛ", "…", "‥ ‼ ⁇", "µ μ", "ｰ－—–", "﹏﹐﹑", "㌀㌔", "ℌℍℎ", "𝐀𝐁𝐂 𝟏𝟐𝟑",
    "\u1100\u1161\u11a8 한", "Ａ\u0301", "\uff21\uff22\u3000\uff23",
    # mixed scripts, emoji, bytes the vocab lacks
    "Ünïcödé façade coöperate", "Straße STRASSE", "İstanbul ıi", "日本語テキスト", "中文分词测试",
    "한국어 문장입니다", "ไทย", "עברית", "العربية", "हिन्दी", "🦙🦙 llama", "😀😃😄", "👨\u200d👩\u200d👧",
    "\U0001F1EF\U0001F1F5", "\U000E0041", "\U0010FFFD", "\U00020000\U0002A6D6", "ᚠᛇᚻ",
    # the vocab's special-token texts, alone, joined and next to spaces
    "<s>", "</s>", "<pad>", "<unk>", "<mask>", "<s>hello</s>", "<s> hello </s>", "a<mask>b",
    "a <mask> b", "The capital of France is <mask>.", "<s></s><mask>", "<mask><mask>", "<s", "mask>",
    "</s> x", "x </s>", "  <mask>  ", "<MASK>", "[PAD250001]", "▁<mask>",
]


# Variants of the vocab for the rules XLM-R's own settings do not reach (both tools and
# tests/tokenizer/test_tok_ugm.py write them with write_variant, so both read the same bytes):
# remove_extra_whitespaces off (spaces kept, each escaped), add_space_prefix on or off, no
# charsmap; appended tokens: user-defined ones (score 0; matched on the raw text before the
# charsmap, even part way: 'ＡＢ' keeps 'Ａ' of 'ＡＣ' full-width, 'é!' cuts 'è' after its
# first byte), an unused one scored 5 below the normal minimum (the unknown token's penalty
# decides '🀄,'), a control token and two byte tokens.
VARIANTS = {
    "spaces": {"remove_extra_whitespaces": False, "add_space_prefix": True, "charsmap": True},
    "raw": {"remove_extra_whitespaces": False, "add_space_prefix": False, "charsmap": False},
}
EXTRA_TOKENS = [("ＡＢ", 4), ("é!", 4), ("<tag>", 4), ("ab c", 4), ("🀄,", 5), ("<ctl>", 3),
                ("<0xE2>", 6), ("<0x41>", 6)]
VARIANT_CASES = [
    "ＡＢ ＡＣ Ａ", "xＡＢy", "é! è é", "è", "<tag> <ta <tag", "ab c abc ab  c", "🀄, 🀄 ,", "🀄🀄,",
    "x<ctl>y", "x <ctl> y", "<ctl>", " <tag> ", "Á", "a  b   c", "  lead", "trail  ", "	 tab",
]


def write_variant(base: dict, name: str, out: Path) -> Path:
    """A vocab-only GGUF (arch llama, no tensors): the base file's Unigram vocab with VARIANTS[name]
    and EXTRA_TOKENS appended. base: the metadata of ggml-vocab-nomic-bert-moe.gguf."""
    import gguf

    spec = VARIANTS[name]
    tokens = list(base["tokenizer.ggml.tokens"]) + [t for t, _ in EXTRA_TOKENS]
    types = list(base["tokenizer.ggml.token_type"]) + [ty for _, ty in EXTRA_TOKENS]
    scores = list(base["tokenizer.ggml.scores"])
    low = min(s for s, ty in zip(scores, base["tokenizer.ggml.token_type"]) if ty == 1)
    scores += [low - 5.0 if ty == 5 else 0.0 for _, ty in EXTRA_TOKENS]
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_block_count(1)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(spec["add_space_prefix"])
    w.add_remove_extra_whitespaces(spec["remove_extra_whitespaces"])
    if spec["charsmap"]:
        w.add_precompiled_charsmap(bytes(x & 0xFF for x in base["tokenizer.ggml.precompiled_charsmap"]))
    for k in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        w.add_uint32(f"tokenizer.ggml.{k}", int(base[f"tokenizer.ggml.{k}"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def long_text() -> str:
    """~6 KB: the hand-written cases joined by spaces and newlines (the speed test's text)."""
    parts = [c for c in G.CASES + UGM_CASES if c and "\x00" not in c]
    s = ""
    i = 0
    while len(s.encode("utf-8")) < 6000:
        s += parts[i % len(parts)] + (" " if i % 3 else "\n")
        i += 1
    return s


def main() -> int:
    path = fetch_llama_cpp.suite_dir() / f"ggml-vocab-{NAME}.gguf"
    v = G.LlamaVocab(path)
    L = v.L
    texts: list[str] = []
    for t in G.CASES + G.PRE_CASES + UGM_CASES + G.fuzz_cases(60):
        if t not in texts:
            texts.append(t)
    cases, used = [], set()
    for s in texts:
        ids = v.tokenize(s, True, True)
        plain = v.tokenize(s, False, False)
        add_only = v.tokenize(s, True, False)
        parse_only = v.tokenize(s, False, True)
        used.update(ids + plain + add_only + parse_only)
        cases.append({"text": s, "ids": ids, "ids_no_special": plain, "ids_add_only": add_only,
                      "ids_parse_only": parse_only,
                      "decode": v.detokenize(ids, True), "decode_skip_special": v.detokenize(ids, False),
                      "decode_no_special": v.detokenize(plain, True)})
    # every other text of the sweep (the whole one would take the golden past 300 KB)
    sweep = [{"text": s, "ids": v.tokenize(s, False, False)} for s in G.sweep_cases()[::2]]
    big = long_text()
    big_ids = v.tokenize(big, True, True)
    attrs = {str(i): int(L.llama_vocab_get_attr(v.vocab, i)) for i in range(v.n)}
    normal = 1 << 2
    special = {k: a for k, a in attrs.items() if a != normal}
    sample = sorted(used | {int(k) for k in special} | set(range(0, v.n, 997)))
    pieces = {str(i): [v.piece(i, True).hex(), v.piece(i, False).hex()] for i in sample}

    def opt(x: int) -> int | None:
        return None if x < 0 else int(x)

    g = {
        "llama_cpp": G.LLAMA_CPP_VERSION,
        "command": COMMAND,
        "file": path.name,
        "n_vocab": v.n,
        "bos": opt(L.llama_vocab_bos(v.vocab)), "eos": opt(L.llama_vocab_eos(v.vocab)),
        "sep": opt(L.llama_vocab_sep(v.vocab)), "pad": opt(L.llama_vocab_pad(v.vocab)),
        "add_bos": bool(L.llama_vocab_get_add_bos(v.vocab)),
        "add_eos": bool(L.llama_vocab_get_add_eos(v.vocab)),
        "eog": sorted(i for i in range(v.n) if L.llama_vocab_is_eog(v.vocab, i)),
        "non_normal_attrs": special,
        "pieces_hex": pieces,
        "long": {"text": big, "ids": big_ids, "decode": v.detokenize(big_ids, True)},
        "cases": cases,
        "sweep": sweep,
    }
    # the variants: ids with and without specials, detokenized text; pieces of the new tokens
    import tempfile

    from minfer.gguf_file import GGUFFile  # the file reader only, to copy the base vocab

    base = GGUFFile(path).metadata
    vtexts = list(dict.fromkeys(VARIANT_CASES + UGM_CASES + [t for t in G.CASES if t.strip() != t or "  " in t]))
    for name in VARIANTS:
        vv = G.LlamaVocab(write_variant(base, name, Path(tempfile.mkdtemp()) / f"{name}.gguf"))
        vcases = []
        for t in vtexts:
            ids = vv.tokenize(t, True, True)
            vcases.append({"text": t, "ids": ids, "ids_no_special": vv.tokenize(t, False, False),
                           "decode": vv.detokenize(ids, True)})
        g[f"variant_{name}"] = vcases
        g[f"variant_{name}_pieces_hex"] = {str(i): [vv.piece(i, True).hex(), vv.piece(i, False).hex()]
                                           for i in range(v.n, vv.n)}
    OUT.write_text(G.dump_golden(g), encoding="utf-8")
    print(f"{OUT}: {len(cases)} strings, {len(vtexts)} per variant, {len(sweep)} sweep texts, long text {len(big.encode())} bytes "
          f"-> {len(big_ids)} ids, {len(pieces)} pieces, {OUT.stat().st_size} bytes")
    json.loads(OUT.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
