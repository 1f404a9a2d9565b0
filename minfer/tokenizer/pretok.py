"""BPE pre-tokenizer rules per `tokenizer.ggml.pre`, as llama.cpp applies them.

Facts from llama.cpp's src/llama-vocab.cpp (commit 0c1e57098, vendored in llama-cpp-python
0.3.36): the regex list of each pre type (llm_tokenizer_bpe's constructor), and the flags
the loader sets per pre name (llama_vocab::impl::load: clean_spaces, ignore_merges,
add_bos, escape_whitespaces). The regexes are applied one after the other, each to every
piece the previous ones left, and the text between matches stays a piece of its own
(unicode.cpp: unicode_regex_split).

llama.cpp runs the regexes that use \\p{..} classes on a "collapsed" copy of the text with
std::regex (ECMAScript): ASCII stays as is, every other code point becomes one byte naming
its category (non-ASCII whitespace becomes \\v). minfer runs them with Oniguruma (in
`tokenizers`) on the real text; for the classes used here that matches the same code
points: \\s is ASCII whitespace plus Unicode White_Space in both, and \\p{L}/\\p{N}/\\p{P}/
\\p{M}/\\p{S} are the Unicode general categories in both -- but of different Unicode versions
(llama.cpp's table is 15.1, Oniguruma's 16.0), so bpe.py compiles every regex through
with_llama_cpp_tables, which takes the 5,185 code points new in 16.0 out of those classes.
ECMAScript's `$` (end of input) is written `\\z`, because Oniguruma's `$` also matches before
a newline. Pre types that llama.cpp splits with hand-written code (unicode_regex_split_custom_*)
are written here as regexes that split the same way (kimi-k2, tiny_aya's and afmoe's digits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# GPT-2's regex (llama.cpp runs its hand-written equivalent, unicode_regex_split_custom_gpt2)
GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp's "adapted" forms: case-insensitive contractions spelled out
LLAMA3_RE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
             r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
            r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_RE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
             r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+")
# LLAMA_VOCAB_PRE_TYPE_GPT4O (pre "gpt-4o", "llama4", "kanana2", "talkie"; tiktoken's o200k):
# llama.cpp's adapted form of the tokenizer.json regex, its \p{Lu}\p{Lt}.. classes written
# with lookaheads: "upper" = a letter other than a-z, "lower" = a letter other than A-Z.
# It differs from o200k on non-ASCII text: \p{M} is no longer part of a word (a combining
# mark starts a new piece: "re" + U+0301 "sume" ...), and a non-ASCII letter counts as both
# cases (Cyrillic/Greek case changes do not split). minfer follows llama.cpp.
GPT4O_RE = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
            r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# case LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM: latin/greek/cyrillic/... letters spelled as ranges
# (\u escapes: several of these code points are canonical singletons that an editor's NFC
# normalization would silently change, e.g. U+1F7D -> U+03CE)
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a"
    "\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d"
    "\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    "\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115"
    "\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943")
_DEEPSEEK_PUNCT = "!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002"
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# Gemma 4 (SPM-style BPE): only newline runs split the text (custom_newlines)
NEWLINES_RE = r"[^\n]+|[\n]+"

# case LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM (pre "deepseek-v3": DeepSeek-V3, V3.1, R1; llama.cpp's
# HUNYUAN_DENSE, JOYAI_LLM and HY_V4 share the list): digits
# in runs of at most three, then runs of Han (U+4E00-U+9FA5) and kana (U+3040-U+30FF), then a
# word regex in which an ASCII punctuation mark starts an ASCII word ("[A-Za-z]+") and combining
# marks stay in a word. llama.cpp runs the first and last on its collapsed text, the middle one
# with std::wregex on the code points (no \p{..} class in it); its \p{S}/\p{P} are the Unicode
# categories, as Oniguruma's.
DEEPSEEK_V3_RES = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    # (written with C++'s escapes, so CR and LF stand in the classes as themselves, as there)
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)
# Han as llama.cpp's unicode_cpt_is_han (unicode.cpp) counts it: CJK Unified Ideographs, Ext. A
# to F, the compatibility ideographs and their supplement (whole blocks, unassigned points too)
HAN = ("\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
       "\U0002b820-\U0002ceaf\U0002ceb0-\U0002ebef\uf900-\ufaff\U0002f800-\U0002fa1f")
# case LLAMA_VOCAB_PRE_TYPE_KIMI_K2 (pre "kimi-k2": Kimi-K2, Moonlight, Kimi-Linear): llama.cpp
# lists the placeholder "\p{Han}+", which unicode_regex_split_custom hands to a hand-written
# splitter (unicode_regex_split_custom_kimi_k2). That splitter, not Kimi's tokenizer.json regex,
# is the reference; written as one Oniguruma regex it is: a Han run; else an optional lead
# character (not CR/LF, letter or digit) and a run of non-Han letters -- upper/lower case play no
# part and combining marks (\p{M}) are not letters there -- with an optional ASCII contraction;
# else llama3's digit, punctuation and whitespace alternatives. (Its last resort, "one
# character", is unreachable: every code point has a category flag in unicode-data.cpp.)
KIMI_K2_RE = (rf"[{HAN}]+|[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}&&[^{HAN}]]+"
              r"(?:'[sS]|'[tT]|'[mM]|'[dD]|'[rR][eE]|'[vV][eE]|'[lL][lL])?"
              r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# case LLAMA_VOCAB_PRE_TYPE_TINY_AYA (pre "tiny_aya", "cohere2moe"): two steps.
# 1. "\d{1,3}(?=(?:\d{3})*\b)" is not run as a regex: unicode_regex_split_custom hands it to
#    the AFMoE digit splitter, which cuts each run of \p{N} into groups of three counted from the
#    right and glues the text before a run to the run's first group ("ab1234" -> "ab1" "234";
#    the text after the last run stays a piece). That is this regex with HF's
#    merged_with_previous behaviour (PreRules.glued).
TINY_AYA_DIGITS_RE = r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"
# 2. o200k's word regex, run on llama.cpp's collapsed text, where \p{Lu}, \p{Ll}, \p{Lt},
#    \p{Lm} and \p{Lo} all stand for "any letter": "[Lu Lt Lm Lo M]*[Ll Lm Lo M]+" is then just
#    a run of letters and marks, so a case change does not split ("HelloWorld" is one piece).
TINY_AYA_RE = (r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# case LLAMA_VOCAB_PRE_TYPE_TEKKEN (pre "tekken": Mistral NeMo, Mistral Small 3.x, Ministral,
# Devstral): llama.cpp's adapted form of Tekken's tokenizer.json regex, with GPT4O_RE's lookahead
# letter classes, single digits and no contractions
TEKKEN_RE = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
             r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
             r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# case LLAMA_VOCAB_PRE_TYPE_SEED_CODER (pre "seed-coder"): qwen2's with no CR/LF in a punctuation run
SEED_CODER_RE = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# case LLAMA_VOCAB_PRE_TYPE_BAILINGMOE (pre "bailingmoe", "bailingmoe2", "llada-moe"): the
# contractions after one apostrophe, and a newline run is one CR/LF (llama.cpp's greedy form of
# the possessive tokenizer.json regex)
BAILINGMOE_RE = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")
# case LLAMA_VOCAB_PRE_TYPE_EXAONE_MOE (pre "exaone-moe"): words with their marks, joined by
# single spaces into one piece
EXAONE_MOE_RE = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
# case LLAMA_VOCAB_PRE_TYPE_MINICPM5 (pre "minicpm5"): digit runs of at most three, then llama3's
# regex with whole digit runs
MINICPM5_RES = (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# case LLAMA_VOCAB_PRE_TYPE_UFAKZEKA (pre "ufakzeka"): qwen2's regex without the contractions
UFAKZEKA_RE = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# case LLAMA_VOCAB_PRE_TYPE_SPARK2_5 (pre "spark2_5"): deepseek-v3's three with one CR or LF a
# piece, then single digits
SPARK2_5_RES = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
    r"\p{N}",
)
# case LLAMA_VOCAB_PRE_TYPE_PORO / BLOOM / GPT3_FINNISH (and VIKING, then single digits): a run of
# anything but whitespace and these punctuation marks (the parentheses and bars are class members)
PORO_RE = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"


# Code points that Unicode 16.0 assigned (letters, digits, marks, punctuation, symbols) and that
# llama.cpp's category table (unicode-data.cpp, Unicode 15.1) leaves undefined: there they are in
# no \p{..} class (the collapsed text gives them the "other" byte), while the Oniguruma in
# `tokenizers` 0.23 already knows Unicode 16. Ranges may span code points that are unassigned in
# both. Measured by classifying every code point with both tables (2026-12-05): these 5,185 are
# the only differences, and \s agrees everywhere.
UNICODE16_ONLY = (
    "\u0897\u1b4e-\u1b4f\u1b7f\u1c89-\u1c8a\u2427-\u2429\u31e4-\u31e5\ua7cb-\ua7cd\ua7da-\ua7dc"
    "\U000105c0-\U000105f3\U00010d40-\U00010d8f\U00010ec2-\U00010efc\U00011380-\U000113e2"
    "\U000116d0-\U000116e3\U00011bc0-\U00011bf9\U00011f5a\U00013460-\U000143fa\U00016100-\U00016139"
    "\U00016d40-\U00016d79\U00018cff\U0001cc00-\U0001ceb3\U0001e5d0-\U0001e5ff\U0001f8b2-\U0001f8c1"
    "\U0001fa89-\U0001fa8f\U0001fabe\U0001fac6\U0001fadc-\U0001fadf\U0001fae9\U0001fbcb-\U0001fbef")
_CATEGORY = re.compile(r"\\p\{([LNMPS])\}")


def with_llama_cpp_tables(regex: str) -> str:
    """`regex` for Oniguruma with each \\p{L}, \\p{N}, \\p{M}, \\p{P}, \\p{S} cut down to the code
    points llama.cpp's table puts in that category (a nested class, valid inside brackets too)."""
    return _CATEGORY.sub(lambda m: f"[\\p{{{m[1]}}}&&[^{UNICODE16_ONLY}]]", regex)


@dataclass(frozen=True)
class PreRules:
    regexes: tuple[str, ...]
    # clean_up_tokenization_spaces in detokenize(): llama.cpp's default for BPE is on
    clean_spaces: bool = True
    # a whole pre-token found in the vocab is one token, merges skipped (llama3 and kin)
    ignore_merges: bool = False
    # default before tokenizer.ggml.add_bos_token overrides it
    add_bos: bool = False
    # GPT-2 byte-to-unicode mapping of the pieces; False: raw UTF-8 with <0xXX> byte tokens
    byte_encode: bool = True
    # spaces become U+2581 before the BPE (SPM-style BPE vocabularies)
    escape_whitespace: bool = False
    # no BOS id unless the file names one (load(): special_bos_id = LLAMA_TOKEN_NULL instead of
    # the BPE default 11)
    no_default_bos: bool = False
    # indices of regexes whose matches are glued to the unmatched text just before them
    # (tokenizers' Split behaviour "merged_with_previous") instead of standing alone
    glued: tuple[int, ...] = ()
    # a piece of newlines only that is itself a token is taken whole, merges skipped
    # (llm_tokenizer_bpe_session::tokenize: tok_pre == LLAMA_VOCAB_PRE_TYPE_GEMMA4, PR 21343)
    whole_newline_runs: bool = False
    # llama_vocab_get_add_sep's default before tokenizer.ggml.add_sep_token overrides it; read only by
    # the rerank pair layout (llama-server's format_prompt_rerank: SEP between query and document)
    add_sep: bool = False


_LLAMA3 = PreRules((LLAMA3_RE,), ignore_merges=True, add_bos=True)
_QWEN2 = PreRules((QWEN2_RE,), clean_spaces=False)
_GPT2 = PreRules((GPT2_RE,))
_GPT4O = PreRules((GPT4O_RE,), clean_spaces=False)
_DIGIT_THEN_GPT2 = (r"\p{N}", GPT2_RE)  # STARCODER, REFACT, COMMAND_R, SMOLLM, ...

# tokenizer.ggml.pre -> rules, for the names llama.cpp maps to the pre types below. Any
# other name is refused rather than guessed.
PRE_TYPES: dict[str, PreRules] = {
    # LLAMA_VOCAB_PRE_TYPE_DEFAULT: what a BPE vocab with pre "default" gets
    "default": PreRules((r"[\p{P}\$\+<=>\^~\|]+", GPT2_RE, r"\p{N}+", r"[0-9][0-9][0-9]")),
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "falcon3": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
    # LLAMA_VOCAB_PRE_TYPE_CHATGLM4 (GLM-4, GLM-4.5/4.6/4.7, GLM-5): llama3's regex, word by word
    # (ignore_merges) for "glm4"/"glm5" but not "chatglm-bpe"; no BOS (special_bos_id is null
    # unless the file names one; the chat template writes [gMASK]<sop> itself)
    "glm4": PreRules((LLAMA3_RE,), ignore_merges=True, no_default_bos=True),
    "glm5": PreRules((LLAMA3_RE,), ignore_merges=True, no_default_bos=True),
    "chatglm-bpe": PreRules((LLAMA3_RE,), no_default_bos=True),
    "megrez": PreRules((QWEN2_RE,)),  # QWEN2 rules, clean_spaces left on
    "qwen35": PreRules((QWEN35_RE,), clean_spaces=False),
    "gpt-4o": _GPT4O, "llama4": _GPT4O, "kanana2": _GPT4O, "talkie": _GPT4O,
    "smollm": PreRules(_DIGIT_THEN_GPT2, clean_spaces=False),
    "starcoder": PreRules(_DIGIT_THEN_GPT2),
    "refact": PreRules(_DIGIT_THEN_GPT2),
    "command-r": PreRules(_DIGIT_THEN_GPT2, clean_spaces=False),
    "gpt-2": _GPT2, "phi-2": _GPT2, "mpt": _GPT2,
    "falcon": PreRules((r"[\p{P}\$\+<=>\^~\|`]+", GPT2_RE, r"[0-9][0-9][0-9]")),
    "deepseek-llm": PreRules((r"[\r\n]", rf"\s?[{_DEEPSEEK_LETTERS}]+",
                              rf"\s?[{_DEEPSEEK_PUNCT}]+", r"\s+\z", _CJK, r"\p{N}+"),
                             clean_spaces=False),
    "deepseek-coder": PreRules((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
                               clean_spaces=False),
    # DEEPSEEK3_LLM, KIMI_K2, TINY_AYA: clean_spaces off, merges used, BOS per the file
    "deepseek-v3": PreRules(DEEPSEEK_V3_RES, clean_spaces=False),
    "kimi-k2": PreRules((KIMI_K2_RE,), clean_spaces=False),
    "tiny_aya": PreRules((TINY_AYA_DIGITS_RE, TINY_AYA_RE), clean_spaces=False, glued=(0,)),
    "cohere2moe": PreRules((TINY_AYA_DIGITS_RE, TINY_AYA_RE), clean_spaces=False, glued=(0,)),
    # tokenizer.ggml.model 'gemma4' sets this pre itself (load(): tokenizer_pre = "gemma4");
    # a 'gpt2' vocab may name it too
    "gemma4": PreRules((NEWLINES_RE,), byte_encode=False, escape_whitespace=True, whole_newline_runs=True),
}
PRE_TYPES["granite-embed-multi-311m"] = PRE_TYPES["gemma4"]
# The other names of llama_vocab::impl::load's chain whose rules are one of the above (the same
# regex list and flags); each has a llama.cpp golden (tests/tokenizer/test_tok_more_pres.py)
for _names, _same in (
        (("falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"), "llama3"),       # LLAMA3, ignore_merges, add_bos
        (("gigachat", "a.x-4.0", "mellum", "exaone4", "olmo", "jais"), "gpt-2"),   # GPT2 / OLMO / JAIS
        (("kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2"), "qwen2"),   # QWEN2 regex, clean off
        (("stablelm2",), "megrez"),                                        # QWEN2 regex, clean on
        (("hunyuan-dense", "joyai-llm", "hy_v4"), "deepseek-v3"),          # DEEPSEEK3_LLM's regexes
        (("codeshell", "exaone", "minerva-7b", "mellum2"), "starcoder"),   # STARCODER's two
        (("minimax-m2",), "gpt-4o")):                                      # GPT4O's, clean off
    for _n in _names:
        PRE_TYPES[_n] = PRE_TYPES[_same]
PRE_TYPES.update({
    # DBRX / SMAUG: llama3's regex with llama.cpp's BPE defaults (merges used, no default BOS)
    "dbrx": PreRules((LLAMA3_RE,)), "smaug-bpe": PreRules((LLAMA3_RE,)),
    # TRILLION / GRANITE_DOCLING: GPT-2's regex, clean_spaces off
    "trillion": PreRules((GPT2_RE,), clean_spaces=False),
    "granite-docling": PreRules((GPT2_RE,), clean_spaces=False),
    "tekken": PreRules((TEKKEN_RE,), clean_spaces=False, ignore_merges=True, add_bos=True),
    "seed-coder": PreRules((SEED_CODER_RE,), clean_spaces=False),
    "bailingmoe": PreRules((BAILINGMOE_RE,), clean_spaces=False),
    "exaone-moe": PreRules((EXAONE_MOE_RE,)),
    "minicpm5": PreRules(MINICPM5_RES, ignore_merges=True),
    "ufakzeka": PreRules((UFAKZEKA_RE,), clean_spaces=False),
    "spark2_5": PreRules(SPARK2_5_RES, clean_spaces=False),
    # LAGUNA: newline runs apart first (unicode.cpp's custom newline splitter), then qwen2's regex
    "laguna": PreRules((NEWLINES_RE, QWEN2_RE), clean_spaces=False),
    "poro-chat": PreRules((PORO_RE,), clean_spaces=False),
    "bloom": PreRules((PORO_RE,)), "gpt3-finnish": PreRules((PORO_RE,)),
    "viking": PreRules((PORO_RE, r"\p{N}"), clean_spaces=False),
    # CHAMELEON (Chameleon 7B / 30B): the sentinel and image-token texts, tabs / newlines and 4- or 2-space runs,
    # single digits and single punctuation apart, then GPT-2's regex; BOS on, clean_spaces off (load())
    "chameleon": PreRules((r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )",
                           r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2_RE), clean_spaces=False, add_bos=True),
})
PRE_TYPES["bailingmoe2"] = PRE_TYPES["llada-moe"] = PRE_TYPES["bailingmoe"]

# The embedding / reranker models' names (llama_vocab::impl::load's chain):
# - "jina-es", "jina-de", "jina-v2-es", "jina-v2-de" and "modern-bert" sit in the list with "gpt-2"
#   and "phi-2": LLAMA_VOCAB_PRE_TYPE_GPT2 and nothing else (clean_spaces stays on);
# - "jina-v1-en", "jina-v2-code", "roberta-bpe": LLAMA_VOCAB_PRE_TYPE_GPT2 with `add_sep = true`, the
#   default of llama_vocab_get_add_sep (the "Handle add_bos, add_eos and add_sep" block lets
#   tokenizer.ggml.add_sep_token override it; the tokenizer itself never reads it);
# - "whitespace" (jina-embeddings-v2-base-zh; the converter pins it with tokenizer.ggml.model
#   'whitespace'): case LLAMA_VOCAB_PRE_TYPE_WHITESPACE, one regex "\S+" run with std::wregex (no
#   \p{..} class; non-ASCII White_Space becomes \v first, so \s is White_Space as Oniguruma's) and
#   byte_encode = false: the pieces stay raw UTF-8, a symbol the vocab lacks becomes <0xXX> byte
#   tokens; normalizer_opts.lowercase = false (read by the 'whitespace' model's session only:
#   tokenizer.py). Decoding stays the BPE one (llama_decode_text, clean_spaces on).
# The `<mask>` LSTRIP rule of the jina-v2-de / -es / -code names is a token attribute: vocab.py.
WHITESPACE_RE = r"\S+"
for _n in ("jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "modern-bert"):
    PRE_TYPES[_n] = PRE_TYPES["gpt-2"]
_GPT2_SEP = PreRules((GPT2_RE,), add_sep=True)
PRE_TYPES.update({"jina-v1-en": _GPT2_SEP, "jina-v2-code": _GPT2_SEP, "roberta-bpe": _GPT2_SEP,
                  "whitespace": PreRules((WHITESPACE_RE,), byte_encode=False)})

# case LLAMA_VOCAB_PRE_TYPE_JAIS2 (pre "jais-2"; load() sets nothing else: merges used, clean_spaces
# on): llama3's regex whose whitespace tail cascades through runs of 512, 256, ..., 4, then 1-2, spaces
JAIS2_RE = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
            r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
            r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}")
# case LLAMA_VOCAB_PRE_TYPE_GRANITE_EMB_MULTI (pre "granite-embed-multi-97m"; clean_spaces off,
# ignore_merges on): GPT4O_RE with \p{M} in the lookahead classes, so a combining mark stays in its word
GRANITE_EMB_MULTI_RE = GPT4O_RE.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")
# case LLAMA_VOCAB_PRE_TYPE_YOUTU (pre "youtu"; clean_spaces off, ignore_merges on): first runs of Hangul,
# of CJK punctuation, of Bopomofo, of Han / kana (no \p{..} class: std::wregex on the code points), then
# o200k's word regex on the collapsed text, where \p{Lu}/\p{Lt}/\p{Lm}/\p{Lo}/\p{Ll} are all "a letter"
# (as TINY_AYA_RE: "[Lu Lt Lm Lo M]*[Ll Lm Lo M]+" is a run of letters and marks), digits one by one
YOUTU_RES = (
    "[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f"
    "\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+" + _CONTRACTIONS + r"?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
)
PRE_TYPES.update({
    "jais-2": PreRules((JAIS2_RE,)),
    "granite-embed-multi-97m": PreRules((GRANITE_EMB_MULTI_RE,), clean_spaces=False, ignore_merges=True),
    "youtu": PreRules(YOUTU_RES, clean_spaces=False, ignore_merges=True),
})
# case LLAMA_VOCAB_PRE_TYPE_AFMOE (pre "afmoe"; clean_spaces off): "\p{AFMoE_digits}" is
# unicode_regex_split_custom_afmoe, the digit splitter tiny_aya's first step uses (TINY_AYA_DIGITS_RE,
# glued); then runs of CJK / kana / Thai / Lao / Khmer / Myanmar / Hangul blocks (no \p{..} class:
# std::wregex on the code points; llama.cpp's literal third range starts at U+8C48, not U+F900, and so
# takes in Hangul and everything up to U+FAFF); then deepseek-v3's word regex
AFMOE_RES = (
    TINY_AYA_DIGITS_RE,
    "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf\u0e40-\u0e7f"
    "\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+",
    DEEPSEEK_V3_RES[2],
)
PRE_TYPES["afmoe"] = PreRules(AFMOE_RES, clean_spaces=False, glued=(0,))
# case LLAMA_VOCAB_PRE_TYPE_SARVAM_MOE (pre "sarvam-moe"): gemma4's shape -- escape_whitespaces (spaces
# -> U+2581, and back on decode), newline runs apart, raw-UTF-8 BPE (byte_encode = false) -- with
# clean_spaces off, and without gemma4's whole-newline-run rule and BOS workaround (both keyed to
# LLAMA_VOCAB_PRE_TYPE_GEMMA4)
PRE_TYPES["sarvam-moe"] = PreRules((NEWLINES_RE,), clean_spaces=False, byte_encode=False, escape_whitespace=True)
# case LLAMA_VOCAB_PRE_TYPE_SUPERBPE (pre "superbpe"; clean_spaces off): digit runs apart, then each cut
# before every group of three ASCII digits that ends the run (a zero-width regex; no \p{..} class, so
# std::wregex on the code points, where \d is [0-9]); nothing else splits: words and spaces stay together
SUPERBPE_RES = (r"\p{N}+", r"(?=([0-9]{3})+(?![0-9]))")
PRE_TYPES["superbpe"] = PreRules(SUPERBPE_RES, clean_spaces=False)
