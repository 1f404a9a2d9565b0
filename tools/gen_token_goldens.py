"""Write tests/tokenizer/goldens/<model>.json from llama.cpp's own tokenizer.

The goldens are the independent reference for minfer's tokenizer tests: token ids from
llama.cpp's `llama_tokenize`, text from `llama_detokenize` / `llama_token_to_piece`, the
end-of-generation set from `llama_vocab_is_eog`, attributes from `llama_vocab_get_attr`, and
ChatML renders from `llama_chat_apply_template` (llama.cpp's built-in, non-Jinja templates).
Nothing here imports minfer's tokenizer.

It needs llama.cpp's shared library with llama-cpp-python's ctypes bindings; build them as
in tests/tokenizer/README.md (a venv at /tmp/llcpp), then:

    /tmp/llcpp/bin/python tools/gen_token_goldens.py            # both catalog models + variants
    /tmp/llcpp/bin/python tools/gen_token_goldens.py PATH.gguf   # one file -> goldens/<stem>.json
    /tmp/llcpp/bin/python tools/gen_token_goldens.py gemma-3-270m  # a catalog model
    /tmp/llcpp/bin/python tools/gen_token_goldens.py llama-spm phi-3 gemma-4 bert-bge  # suite vocabs
    /tmp/llcpp/bin/python tools/gen_token_goldens.py --chat-builtin  # goldens/chat_builtin.json
    /tmp/llcpp/bin/python tools/gen_token_goldens.py --ids-only deepseek-llm ...  # <name>-ids.json
    /tmp/llcpp/bin/python tools/gen_token_goldens.py deepseek-llm-as-deepseek-v3  # a pre variant
    /tmp/llcpp/bin/python tools/gen_token_goldens.py pieces-as-deepseek-v3  # the split itself
    /tmp/llcpp/bin/python tools/gen_token_goldens.py $(python -c "import sys; sys.path.insert(0,
        'tests/tokenizer'); from vocab_files import MORE_PRES; print(*('pieces-as-' + p for p in MORE_PRES))")
    /tmp/llcpp/bin/python tools/gen_token_goldens.py llama-bpe-as-tekken
    /tmp/llcpp/bin/python tools/gen_token_goldens.py pieces-as-whitespace-lower
    /tmp/llcpp/bin/python tools/gen_token_goldens.py --embed-pres  # goldens/embed-pres.json

A pre variant (tests/tokenizer/vocab_files.py PRE_VARIANTS) is a suite vocab written under
another tokenizer.ggml.pre; its golden adds PRE_CASES, llama.cpp's suite texts
(tests/data/tokenizer/llama_cpp_vocab_texts.json) and a second fuzz set to the strings.

--chat-builtin renders conversations with llama.cpp's built-in chat formats by name
(llama_chat_apply_template("gemma", ...)), the formats minfer/tokenizer/templates.py gives
files without a template.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import sys
import tempfile
from pathlib import Path

LLAMA_CPP_VERSION = "ggml-org/llama.cpp@0c1e57098 (llama-cpp-python 0.3.36 sdist)"
MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
OUT_DIR = Path(__file__).resolve().parent.parent / "tests" / "tokenizer" / "goldens"
# recorded in each golden
COMMAND = " ".join([sys.executable, "tools/gen_token_goldens.py", *sys.argv[1:]])

# Hand-written cases: each names a behaviour the pre-tokenizers or the special-token
# partition must get right.
CASES = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", " \n", "\n ", "\r\n", "\r\n\r\n", "\t\t\n  \n",
    "Hello", " Hello", "Hello ", "  Hello  ", "Hello world", "Hello, world!", "hello\tworld",
    "The capital of France is", "The quick brown fox jumps over the lazy dog.",
    "I'm", "you'll", "he's", "we've", "they're", "I'd", "don't", "DON'T", "I'M YOU'LL THEY'RE",
    "'s 't 're 've 'm 'll 'd", "rock 'n' roll", "it ' s", "' hello '",
    "1", "12", "123", "1234", "1234567", "12345678901234567890", "3.14159", "1,000,000",
    "v1.2.3-rc4", "0x1F", "2024-01-01T12:34:56Z", "$100.00", "50%", "a1b2c3",
    "def main():\n\tprint('hi')\n\treturn 0\n",
    "if (x == 1) {\n    return y;\n}\n",
    "    indented with four spaces", "        eight", "a    b", "a  \n  b", "x = [1, 2, 3]  # comment",
    "for i in range(10):\n        pass\n\n\n",
    "<html><body>Hi</body></html>", "https://example.com/path?q=1&r=2#frag", "user@example.com",
    "snake_case_name CamelCaseName kebab-case-name", "!!!???...,,,", "(){}[]<>", "`code` **bold** _it_",
    "你好，世界", "我爱自然语言处理。", "日本語のテキストです", "こんにちは", "한국어 텍스트", "中文 mixed with English",
    "Привет, мир!", "Ελληνικά", "مرحبا بالعالم", "שלום עולם", "हिन्दी", "ภาษาไทย", "Tiếng Việt",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇩🇪", "I ❤️ Paris", "emoji😀in😀text", "🤖🦙🚀",
    "é", "e\u0301", "n\u0303o", "a\u0308\u0304", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d",
    "café naïve résumé", "ﬁ ligature", "\u00a0nbsp\u00a0", "zero\u200bwidth", "\u3000ideographic space",
    "\u2028line sep\u2029", "tab\u000bvtab\u000cff", "\u0085nel",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>\n",
    "<|im_start|>assistant\n", "text<|im_end|>more", "<|im_start|><|im_end|>", " <|im_start|> ",
    "<|im_start", "im_start|>", "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<tool_call>{\"name\": \"f\"}</tool_call>", "<repo_name>x<file_sep>y", "<s></s>", "<unk>",
    "ÀÁÂÃÄÅ", "\u0000", "\x7f", "\u00ad", "\ufeffBOM", "\U0001F600\U0001F601\U0001F602",
    "Mixed: English, 中文, русский, العربية, 😀, 123.",
    # bytes some vocabs lack (SmolLM2 has no token for 0x04, 0x06, 0x13 ... or lead bytes F1-F7)
    "\x04\x06\x13\x14\x16\x1d", "a\U00040000b", "\U000E0001tag", "\U0010FFFF", "\U0001F9FF\U0002A6D6",
]

# A deterministic fuzz set from a mixed alphabet: scripts, digits, spaces, punctuation,
# control-token fragments.
_ALPHABET = (list("abcXYZ019 \t\n'.,!?-_<|>") + list("éßøñ你好世界日本語한국어абвгд") +
             ["😀", "👍🏽", "\u0301", "\u200b", "\u00a0", "<|im_end|>", "<|im_start|>", "  ", "\r\n"])


def fuzz_cases(n: int, seed: int = 1234, alphabet: list[str] = _ALPHABET) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def sweep_cases() -> list[str]:
    """Code points across all of Unicode, each in the contexts the pre-tokenizer regexes
    tell apart (after a space, next to letters, digits, itself, a newline, a contraction):
    16 code points from every 0x800 in the BMP and every 0x2000 above it, plus plane 4
    (0x42000), where SmolLM2's missing lead byte F1 once made neighbours merge."""
    starts = list(range(0, 0x10000, 0x800)) + list(range(0x10000, 0x110000, 0x2000)) + [0x42010]
    out = []
    for st in starts:
        cps = [c for c in range(st, st + 16) if not 0xD800 <= c < 0xE000]
        if cps:
            out.append("".join(f" {chr(c)}a{chr(c)}1{chr(c)}{chr(c)}\n'{chr(c)}s" for c in cps))
    return out


# For the pre types that split Han/kana runs, group digits, let punctuation lead an ASCII word,
# ignore letter case or treat combining marks apart: texts at those boundaries.
PRE_CASES = [
    # Han and kana runs, range edges (U+9FA5/U+9FA6, Ext. A/B, compatibility ideographs), mixes
    "中文ひらがなカタカナ漢字", "日本語のテキスト、カタカナ。", "龥龦鿿", "㐀㐁中", "𠀀𠀁字",
    "\uf900\uf901\U0002f800\U0002f801",
    "中文English混合123", "。，！？「引用」", "한국어와中文", "ㄅㄆㄇ", "ｱｲｳｴｵ", "ゟ゠ヿ・ー",
    " 中文", "a中b", "中1文", "中'文", "\n中文\n", "中文 mixed ひらがな text カタカナ",
    # digit runs and their neighbours
    "1", "12", "123", "1234", "12345", "123456", "1234567", "a1234b5678", "x  1234", "  1234",
    "a  12", "\n1234", "1,234,567.89", "٣٤٥٦٧", "²³⁴⁵", "ⅫⅢ", "12abc", "abc12", "abc  12345 def",
    "...123", "v12345678", "x 1 22 333 4444 55555", "½1234", "１２３４５",
    # punctuation before letters, symbols, quotes
    ".net", " .net", "(hello)", "#include <stdio.h>", "__init__", "a.b.c", "-flag", "@user",
    "$HOME", "+abc", "=value", "“quoted” ‘single’", "«ä»", "·x", ".é", "!Ab", "...and",
    "¿Qué?", "a/b/c", "x/\ny", "€100 £5 ¥3", "∑x≤y", "<<a>>", "`cmd`x", "~/dir", "^caret|pipe",
    # letter case, combining marks, scripts
    "HelloWorld", "camelCaseWord", "XMLHttpRequest", "ПриветМир", "ΑβΓδ", "I'M WE'LL", "O'Neil's",
    "e\u0301", "\u0301abc", " \u0301", "a\u0308b", "नमस्ते दुनिया", "ภาษาไทย", "ﷺ", "ǅungla",
    # newlines and whitespace
    "a\n\nb", "a \n b", "x.\n\ny", "!\n", "!\r\n", "a/\nb", "  \n\n  x", "\r\r\n",
    "a\u3000b", "\u3000\u3000x", "\u00a0\u00a0", "\t\tx", "x   ", "x \t ", " \u2003y",
    # emoji and contractions
    "😀😀", "👍🏽ok", " 😀x", "😀123", "❤️", "#️⃣", "a😀b", "'S", "'Re", "x'", "x'l", "x'll",
    "'ll", "it's", "IT'S", "we'Ve", "ab'dd",
]

# a second fuzz alphabet for those rules
_ALPHABET2 = (list("aZ0123456789 \t\n'.,/-(\"#") + list("中文字龥龦㐀ひらカター、。「」！１２ｱ") +
              ["\U00020000", "\uf900", "é", "\u0301", "Ω", "ß", "٣", "²", "😀", "€", "\u3000", "\u00a0", "  ",
               "\r\n", "HTTP", "Word", "<|im_end|>"])


def pre_extra_cases() -> list[str]:
    texts = json.loads((OUT_DIR.parent.parent / "data" / "tokenizer" / "llama_cpp_vocab_texts.json")
                       .read_text(encoding="utf-8"))
    out = []
    for t in PRE_CASES + texts + fuzz_cases(60, seed=4321, alphabet=_ALPHABET2):
        if t not in out and t not in CASES:
            out.append(t)
    return out


CHAT_MESSAGES = [
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?\nExplain."}],
]


# conversations for the built-in formats: whitespace around contents (some formats trim),
# a system turn (Gemma merges it into the next user turn), several turns
BUILTIN_MESSAGES = CHAT_MESSAGES + [
    [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi\n"},
     {"role": "assistant", "content": " Hello!"}, {"role": "user", "content": "Bye"}],
    [{"role": "user", "content": "  only user  "}],
]
BUILTIN_FORMATS = ("gemma", "llama3", "command-r", "phi3")


def builtin_chat_golden() -> dict:
    import llama_cpp.llama_cpp as L

    cases = []
    for fmt in BUILTIN_FORMATS:
        for msgs in BUILTIN_MESSAGES:
            for add_ass in (True, False):
                arr = (L.llama_chat_message * len(msgs))(
                    *[L.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in msgs])
                buf = ctypes.create_string_buffer(8192)
                n = L.llama_chat_apply_template(fmt.encode(), arr, len(msgs), add_ass, buf, 8192)
                if n < 0:
                    raise SystemExit(f"llama.cpp has no built-in chat format {fmt!r}")
                cases.append({"format": fmt, "messages": msgs, "add_generation_prompt": add_ass,
                              "text": buf.raw[:n].decode("utf-8")})
    return {"llama_cpp": LLAMA_CPP_VERSION, "cases": cases}


class LlamaVocab:
    """llama.cpp's vocab of one GGUF file (vocab_only load) through its C API."""

    def __init__(self, path: Path):
        import llama_cpp.llama_cpp as L

        self.L = L
        L.llama_backend_init()
        params = L.llama_model_default_params()
        params.vocab_only = True
        self.model = L.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        b = text.encode("utf-8")
        cap = len(b) + 8
        buf = (self.L.llama_token * cap)()
        n = self.L.llama_tokenize(self.vocab, b, len(b), buf, cap, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"llama_tokenize needs {-n} slots for {text!r}")
        return list(buf[:n])

    def detokenize(self, ids: list[int], unparse_special: bool) -> str:
        arr = (self.L.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        n = self.L.llama_detokenize(self.vocab, arr, len(ids), buf, cap, False, unparse_special)
        if n < 0:  # -n: the bytes needed (raw-UTF-8 vocabs render "[UNK_BYTE_0x..]" pieces, longer)
            cap = -n
            buf = ctypes.create_string_buffer(cap)
            n = self.L.llama_detokenize(self.vocab, arr, len(ids), buf, cap, False, unparse_special)
        if n < 0:
            raise RuntimeError("detokenize buffer too small")
        return buf.raw[:n].decode("utf-8", errors="replace")

    def piece(self, tid: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = self.L.llama_token_to_piece(self.vocab, tid, buf, 256, 0, special)
        if n < 0:
            raise RuntimeError(f"piece of {tid} longer than 256 bytes")
        return buf.raw[:n]

    def chat(self, messages: list[dict], add_ass: bool) -> str | None:
        tmpl = self.L.llama_model_chat_template(self.model, None)
        if tmpl is None:
            return None
        arr = (self.L.llama_chat_message * len(messages))(
            *[self.L.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in messages])
        cap = 4096
        buf = ctypes.create_string_buffer(cap)
        n = self.L.llama_chat_apply_template(tmpl, arr, len(messages), add_ass, buf, cap)
        if n < 0:  # the template is not one of llama.cpp's built-ins
            return None
        return buf.raw[:n].decode("utf-8")


def golden_for(path: Path, extra: list[str] = ()) -> dict:
    v = LlamaVocab(path)
    L = v.L
    strings = CASES + fuzz_cases(60) + list(extra)
    cases = []
    used: set[int] = set()
    for s in strings:
        ids = v.tokenize(s, True, True)
        plain = v.tokenize(s, False, False)
        used.update(ids)
        used.update(plain)
        cases.append({"text": s, "ids": ids, "ids_no_special": plain,
                      "decode": v.detokenize(ids, True), "decode_skip_special": v.detokenize(ids, False)})
    sweep = [{"text": s, "ids": v.tokenize(s, False, False)} for s in sweep_cases()]
    attrs = {str(i): L.llama_vocab_get_attr(v.vocab, i) for i in range(v.n)}
    normal = 1 << 2
    special = {k: int(a) for k, a in attrs.items() if a != normal}
    # pieces of every special / used token and a stride through the vocab
    sample = sorted(used | {int(k) for k in special} | set(range(0, v.n, 97)))
    pieces = {str(i): [v.piece(i, True).hex(), v.piece(i, False).hex()] for i in sample}

    def opt(x: int) -> int | None:
        return None if x < 0 else int(x)

    chats = []
    for msgs in CHAT_MESSAGES:
        for add_ass in (True, False):
            chats.append({"messages": msgs, "add_generation_prompt": add_ass,
                          "text": v.chat(msgs, add_ass)})
    return {
        "llama_cpp": LLAMA_CPP_VERSION,
        "command": COMMAND,
        "file": path.name,
        "n_vocab": v.n,
        "bos": opt(L.llama_vocab_bos(v.vocab)), "eos": opt(L.llama_vocab_eos(v.vocab)),
        "eot": opt(L.llama_vocab_eot(v.vocab)),
        "add_bos": bool(L.llama_vocab_get_add_bos(v.vocab)),
        "add_eos": bool(L.llama_vocab_get_add_eos(v.vocab)),
        "eog": sorted(i for i in range(v.n) if L.llama_vocab_is_eog(v.vocab, i)),
        "non_normal_attrs": special,
        "pieces_hex": pieces,
        "cases": cases,
        "sweep": sweep,
        "chat": chats,
    }


def lite_golden_for(path: Path) -> dict:
    """Ids only (with and without special tokens) of the same strings and the Unicode sweep:
    for the pre-tokenizer rules of llama.cpp's suite vocabs (goldens/<name>-ids.json)."""
    v = LlamaVocab(path)
    cases = [{"text": s, "ids": v.tokenize(s, True, True), "ids_no_special": v.tokenize(s, False, False)}
             for s in CASES + fuzz_cases(60)]
    sweep = [{"text": s, "ids": v.tokenize(s, False, False)} for s in sweep_cases()]
    return {"llama_cpp": LLAMA_CPP_VERSION, "command": COMMAND, "file": path.name, "cases": cases,
            "sweep": sweep}


# texts for a pre type's own regexes that PRE_CASES and CASES do not reach: chameleon's sentinel and image-token
# texts (llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_CHAMELEON's first two regexes) and its tab / space-run regex
PRE_OWN_CASES = {"chameleon": ["<sentinel:3>x", "a<sentinel:12> b", "<sentinel:>", "<sentinel:7", "IMGIMGABZ",
                               "xIMGIMGABCDZy", "IMGIMGABCDEZ", "IMGIMGZ", "IMGIMGJZ", "\t\tx", "a    b  c",
                               "a   b", "  \n  x", "x1,2.3!?", "(a)[b]{c}", "IMGIMGAZ<sentinel:0>1"]}
# the embedding models' names (vocab_files.EMBED_PRES, whose piece vocabs have <s>, </s> and <mask> control
# tokens): <mask> after spaces, tabs, newlines and non-C-isspace white space (LSTRIP strips what isspace()
# says), at the start, twice, glued, and next to <s> / </s>
MASK_CASES = ["a <mask>", "a  <mask> b", "a\t\n <mask>", " <mask>", "<mask>", "<mask> a", "a<mask>b",
              "Paris is the <mask> of France.", "a <mask> <mask> b", "<s> a <mask></s>", "a\u3000<mask>",
              "a\u00a0<mask>", "a\u0085<mask>", "a\x0b\x0c\r<mask>", "x <mask>'s", "  <mask>  ", "<mask>\n<mask>"]
# pre 'whitespace' (a raw-UTF-8 piece vocab, vocab_files.raw_piece_vocab): White_Space and what C's / ECMAScript's
# \s is not (U+001C-U+001F, U+200B, U+FEFF, U+180E), characters and a byte the vocab lacks (its RAW_MISSING,
# RAW_NO_BYTE), case for the lowercase variant (U+0130, U+1E9E, title case, final sigma)
WHITESPACE_CASES = ["a\u1680b\u2007c\u202fd\u205fe", "a\x1cb\x1dc\x1ed\x1ff", "a\u200bb\ufeffc\u180ed",
                    "x\u2028y\u2029z", "\u0085a\u0085", "😀", "a😀b 😀", "€5 5€", "e\u0301 \u0301", "İstanbul ẞ",
                    "ǅUNGLA ǈ", "ΟΔΟΣ Σ", "ABC def GHI", "  lead and trail  ", "\t\n\r\x0b\x0c",
                    "中文 字\u3000ひら"]
PRE_OWN_CASES.update({p: MASK_CASES for p in ("jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "modern-bert",
                                              "jina-v1-en", "jina-v2-code", "roberta-bpe")})
PRE_OWN_CASES["whitespace"] = WHITESPACE_CASES
# jais-2: white-space runs of 3 to 40 (the cascade 4 / 8 / 16 / 32 / 1-2 / 1), before a word and at the end
# granite-embed-multi-97m: combining marks inside and at the start of words, case changes next to them;
# youtu: Hangul / jamo, CJK punctuation, Bopomofo, Han / kana runs, digits one by one, "/" after punctuation
PRE_OWN_CASES.update({
    "jais-2": ["a   b", "a     b", "a         b", "a" + " " * 17 + "b", "a" + " " * 33 + "b", "x" + " " * 40,
               "a\t\t\t\t\tb", " \n      x", "a \u3000\u3000 b", "a      ", "1 2  3   4    5"],
    "granite-embed-multi-97m": ["re\u0301sume\u0301 Cafe\u0301", "\u0301abc A\u0301Bc", "नमस्ते दुनिया",
                                "বাংলা ভাষা", "ภาษาไทย", "తెలుగు", "e\u0301E\u0301e HelloWorld"],
    "youtu": ["안녕하세요 세계", "ㄱㄴㄷ abc", "你好，世界！…“引号”", "ㄅㄆㄇㄈ 注音", "日本語のテキスト",
              "中文abc한국어", "a1234 ６７", "ok!/path//x\n", "‘quote’—dash：；", "︰﹏x", "AbC's DEF'LL"],
    # afmoe: digit runs cut from the right and glued to the text before them, then its script blocks
    "afmoe": ["1234567", "ab12345cd", "x1 22 333 4444", "١٢٣٤٥", "ภาษาไทย๑๒๓๔", "ພາສາລາວ", "ភាសាខ្មែរ",
              "မြန်မာ", "한국어 테스트", "ｶﾀｶﾅ ⼀⼆", "豈更 中文abc", ".Hello,World", "\uac00\uf900x"],
    # sarvam-moe: spaces (escaped) inside and at the ends of lines, newline runs, "\u2581" itself, a character
    # and a byte the piece vocab lacks (byte fallback), and decode's unescaping with clean_spaces off
    "sarvam-moe": ["a b\n\nc d", "  lead\n\n\ntrail  ", "\n\n", "x \u2581 y", "it ' s . net ,x",
                   "a\tb\r\nc", "\u3000wide space", "e\u0301 😀", "€5\n 5€"],
    # superbpe: digit runs cut into threes from the right (ASCII digits only), words and spaces together
    "superbpe": ["1234567", "12 345 6789", "x1234y", "١٢٣٤٥٦", "1２345", "the quick brown fox", "a, b. c!"],
})


def piece_golden_for(pre: str, with_merges: bool = True, with_decode: bool = False, **options) -> dict:
    """llama.cpp's split itself: PRE_CASES and the short CASES on a vocab where each pre-token
    is one token (tests/tokenizer/vocab_files.py write_piece_vocab); ids without specials;
    with_decode: also each case's detokenized text and the pre's default add_bos. For the
    embedding models' names and RAW_PRES (vocab_files.EMBED_PRES / RAW_PRES) also each case's ids with
    special tokens parsed (no BOS / EOS), add_eos, add_sep and <mask>'s attribute bits; options:
    write_piece_vocab's model / extra_kv (vocab_files.PIECE_OPTIONS)."""
    from vocab_files import EMBED_PRES, RAW_PRES, write_piece_vocab

    texts = [t for t in dict.fromkeys(PRE_CASES + CASES + PRE_OWN_CASES.get(pre, []))
             if 0 < len(t.encode("utf-8")) <= 48]
    v = LlamaVocab(write_piece_vocab(texts, pre, Path(tempfile.mkdtemp()) / "pieces.gguf",
                                     with_merges, **options))
    embed = pre in EMBED_PRES or pre in RAW_PRES
    cases = []
    for t in texts:
        ids = v.tokenize(t, False, False)
        # decode (clean_spaces shows there) only where asked: the older piece goldens have none
        cases.append({"text": t, "ids": ids, **({"decode": v.detokenize(ids, True)} if with_decode else {}),
                      **({"ids_special": v.tokenize(t, False, True)} if embed else {})})
    L, flags = v.L, {}
    if embed:
        flags = {"add_eos": bool(L.llama_vocab_get_add_eos(v.vocab)), "add_sep": bool(L.llama_vocab_get_add_sep(v.vocab))}
        mask = L.llama_vocab_mask(v.vocab)
        if mask >= 0:
            flags.update(mask=int(mask), mask_attr=int(L.llama_vocab_get_attr(v.vocab, mask)))
    return {"llama_cpp": LLAMA_CPP_VERSION, "command": COMMAND, "pre": pre, "n_vocab": v.n,
            **({"add_bos": bool(L.llama_vocab_get_add_bos(v.vocab))} if with_decode else {}), **flags,
            "cases": cases}


# query / document pairs for the rerank layout, and the add_* keys each embedding name's vocab is written with
RERANK_PAIRS = [("what is the capital of France?", "Paris is the capital of France."), ("a <mask> b", " x  y\n"),
                ("", "empty query"), ("Grüße 😀", "")]
RERANK_KEYS = [{}, {"add_sep_token": False}, {"add_sep_token": True}, {"add_bos_token": True, "add_eos_token": True},
               {"add_bos_token": True, "add_eos_token": True, "add_sep_token": False}]


# the per-token attribute chain (load(), "Handle per token attributes"): pre, general.name -> the specials' bits
ATTR_RULES = [("gpt-2", "ModernBERT-base"), ("gpt-2", "modern-bert-base"), ("jina-v2-de", "phi-3-mini"),
              ("gpt-2", "Phi-3-mini"), ("jina-v1-en", "modern-bert"), ("jina-v2-code", None), ("gpt-2", None)]
ATTR_SPECIALS = ["<s>", "</s>", "<mask>", "[MASK]", "<|endoftext|>", "<unk>"]  # (Phi-3's rule needs all four it names)
ATTR_TEXTS = ["a <mask> b [MASK] c</s> d", "x  [MASK]  <mask>  <s>  y", "<|endoftext|> z \n<mask>\t"]


def attr_rules_golden() -> list[dict]:
    """For each of ATTR_RULES: a vocab of GPT-2's 256 byte characters, "ab" and ATTR_SPECIALS (CONTROL) under
    that pre and general.name: llama.cpp's attribute bits of the specials and the ids of ATTR_TEXTS with
    special tokens parsed (LSTRIP / RSTRIP show as eaten white space)."""
    from vocab_files import _byte_chars, write_pre_variant

    toks = _byte_chars() + ["ab"] + ATTR_SPECIALS   # (one merge: llama.cpp needs the merges key)
    meta = {"tokenizer.ggml.tokens": toks, "tokenizer.ggml.token_type": [1] * 257 + [3] * len(ATTR_SPECIALS),
            "tokenizer.ggml.merges": ["a b"]}
    out = []
    for pre, name in ATTR_RULES:
        v = LlamaVocab(write_pre_variant(meta, pre, Path(tempfile.mkdtemp()) / "attr.gguf", name=name))
        out.append({"pre": pre, "name": name,
                    "attrs": {t: int(v.L.llama_vocab_get_attr(v.vocab, toks.index(t))) for t in ATTR_SPECIALS},
                    "cases": [{"text": t, "ids": v.tokenize(t, False, True)} for t in ATTR_TEXTS]})
    return out


def rerank_golden() -> dict:
    """llama.cpp's add_bos / add_eos / add_sep (llama_vocab_get_add_*) of each embedding name's piece vocab
    (vocab_files.write_piece_vocab of the RERANK_PAIRS texts) under each of RERANK_KEYS, and the pair
    layout llama-server's format_prompt_rerank (tools/server/server-common.cpp, no rerank template) builds
    from them: [BOS] query [EOS] [SEP] document [EOS], query / document by llama_tokenize(text, false,
    false), EOS falling back to SEP. The layout is written here from llama.cpp's flags and ids (the
    server is not in libllama); minfer's runtime/embed.py pair_ids must give the same ids."""
    from vocab_files import EMBED_PRES, write_piece_vocab

    texts = sorted({t for pair in RERANK_PAIRS for t in pair if t})
    out = []
    for pre in EMBED_PRES:
        for keys in RERANK_KEYS:
            v = LlamaVocab(write_piece_vocab(texts, pre, Path(tempfile.mkdtemp()) / "rank.gguf", extra_kv=keys))
            L = v.L
            add = {k: bool(f(v.vocab)) for k, f in (("add_bos", L.llama_vocab_get_add_bos),
                                                    ("add_eos", L.llama_vocab_get_add_eos),
                                                    ("add_sep", L.llama_vocab_get_add_sep))}
            bos, eos, sep = L.llama_vocab_bos(v.vocab), L.llama_vocab_eos(v.vocab), L.llama_vocab_sep(v.vocab)
            eos = eos if eos >= 0 else sep
            pairs = []
            for q, d in RERANK_PAIRS:
                ids = ([bos] if add["add_bos"] else []) + v.tokenize(q, False, False) + \
                    ([eos] if add["add_eos"] else []) + ([sep] if add["add_sep"] else []) + \
                    v.tokenize(d, False, False) + ([eos] if add["add_eos"] else [])
                pairs.append({"query": q, "document": d, "ids": ids})
            out.append({"pre": pre, "keys": keys, **add, "pairs": pairs})
    return {"llama_cpp": LLAMA_CPP_VERSION, "command": COMMAND, "texts": texts, "vocabs": out,
            "attr_rules": attr_rules_golden()}


def dump_golden(g: dict) -> str:
    """JSON with one top-level key per line and one case per line (readable diffs, small)."""
    def one(v):
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))

    lines = []
    for k, v in g.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            body = ",\n  ".join(one(x) for x in v)
            lines.append(f"{one(k)}: [\n  {body}\n ]")
        else:
            lines.append(f"{one(k)}: {one(v)}")
    return "{\n " + ",\n ".join(lines) + "\n}\n"


# a golden this large is stored gzipped (deterministic: no name, mtime 0), as goldens/<stem>.json.gz: the repository
# travels to the GPU machine whole, under a size limit; tests/tokenizer/conftest.load_golden reads either form
GZIP_OVER = 8_000


def write_golden(stem: str, text: str) -> Path:
    import gzip

    plain, packed = OUT_DIR / f"{stem}.json", OUT_DIR / f"{stem}.json.gz"
    if len(text.encode("utf-8")) <= GZIP_OVER:
        packed.unlink(missing_ok=True)
        plain.write_text(text, encoding="utf-8")
        return plain
    plain.unlink(missing_ok=True)
    with open(packed, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as z:
        z.write(text.encode("utf-8"))
    return packed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="GGUF paths or catalog names (default: both catalog models)")
    ap.add_argument("--ids-only", action="store_true",
                    help="write goldens/<name>-ids.json (ids of the strings and the sweep only)")
    ap.add_argument("--chat-builtin", action="store_true",
                    help="write goldens/chat_builtin.json (llama.cpp's built-in chat formats) only")
    ap.add_argument("--embed-pres", action="store_true",
                    help="write goldens/embed-pres.json (the embedding pre names' add_* flags and rerank layout, "
                         "the per-token attribute chain) only")
    args = ap.parse_args()
    if args.embed_pres:
        sys.path.insert(0, str(OUT_DIR.parent))
        g = rerank_golden()
        (OUT_DIR / "embed-pres.json").write_text(dump_golden(g), encoding="utf-8")
        print(f"{OUT_DIR / 'embed-pres.json'}: {len(g['vocabs'])} vocabs, {len(g['attr_rules'])} attribute rules")
        return 0
    if args.chat_builtin:
        out = OUT_DIR / "chat_builtin.json"
        g = builtin_chat_golden()
        out.write_text(dump_golden(g), encoding="utf-8")
        print(f"{out}: {len(g['cases'])} renders")
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from minfer.catalog import resolve_model  # only to find (or pull) the files

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    jobs = []
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fetch_llama_cpp  # llama.cpp's suite vocabs: goldens/<name>.json for e.g. 'llama-spm'

    sys.path.insert(0, str(OUT_DIR.parent))
    from vocab_files import MORE_PRES, PIECE_OPTIONS, PIECE_PRES, PRE_VARIANTS, write_pre_variant

    extra: dict[str, list[str]] = {}
    for name in args.models or MODELS:
        if name in PIECE_PRES:  # the split of a pre type, on a vocab that spells it out
            g = piece_golden_for(PIECE_PRES[name], not name.endswith("-no-merges"),
                                 with_decode=PIECE_PRES[name] in MORE_PRES, **PIECE_OPTIONS.get(name, ("", {}))[1])
            (OUT_DIR / f"{name}.json").write_text(dump_golden(g), encoding="utf-8")
            print(f"{OUT_DIR / name}.json: {len(g['cases'])} strings, vocab {g['n_vocab']}")
            continue
        if name in PRE_VARIANTS:  # a suite vocab under another pre (tests/tokenizer/vocab_files.py)
            from minfer.gguf_file import GGUFFile

            suite, pre = PRE_VARIANTS[name]
            base = GGUFFile(fetch_llama_cpp.suite_dir() / f"ggml-vocab-{suite}.gguf").metadata
            jobs.append((name, write_pre_variant(base, pre, Path(tempfile.mkdtemp()) / f"{name}.gguf")))
            extra[name] = pre_extra_cases()
            continue
        if name in fetch_llama_cpp.SUITE:
            jobs.append((name, fetch_llama_cpp.suite_dir() / f"ggml-vocab-{name}.gguf"))
            continue
        path = Path(resolve_model(name))
        jobs.append((name if name in MODELS else path.stem, path))
    if not args.models:
        # the llama3 and GPT-2 pre-tokenizers, on SmolLM2's vocab (tests/tokenizer/vocab_files.py)
        sys.path.insert(0, str(OUT_DIR.parent))
        from minfer.gguf_file import GGUFFile
        from vocab_files import BASE_MODEL, VARIANT_PRES, write_vocab_variant

        base = GGUFFile(resolve_model(BASE_MODEL)).metadata
        tmp = Path(tempfile.mkdtemp())
        for stem, pre in VARIANT_PRES.items():
            jobs.append((stem, write_vocab_variant(base, pre, tmp / f"{stem}.gguf")))
    for stem, path in jobs:
        if args.ids_only:
            g = lite_golden_for(path)
            out = OUT_DIR / f"{stem}-ids.json"
            out.write_text(dump_golden(g), encoding="utf-8")
            print(f"{out}: {len(g['cases'])} strings, {len(g['sweep'])} sweep texts")
            continue
        g = golden_for(path, extra.get(stem, ()))
        out = write_golden(stem, dump_golden(g))
        print(f"{out}: {len(g['cases'])} strings, {len(g['eog'])} eog ids, "
              f"{len(g['pieces_hex'])} pieces")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
