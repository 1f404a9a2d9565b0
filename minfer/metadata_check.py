"""Every GGUF metadata key minfer reads, typed and range-checked in one place.

A GGUF file is untrusted input: a count of the wrong type, a zero, a NaN epsilon or a token
type outside the enum used to surface as raw Python exceptions from int()/float() calls, or
as NaN logits mid-generation (issue 15). `problems(gf)` checks each key against the table
below and returns {key: what is wrong}; `check(gf)` raises the first as one MinferError
naming the file, the key and the (escaped, truncated) value. ModelConfig.from_gguf calls
check() before it reads anything, so the model and the tokenizer only see checked values;
`minfer inspect` shows problems() next to the values.

Sources of the rules: the key names and value types are gguf-py's constants.py (Keys,
TokenType); the ranges are what the engine needs (a count of zero makes an empty tensor, a
non-positive epsilon or rope base makes NaN/inf) and what llama.cpp checks in
llama-model.cpp (n_layer equal to the blocks loaded, via the missing-tensor errors) and
llama-vocab.cpp (token types 0..6).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from minfer.errors import MinferError
from minfer.safe_text import safe

# llama.cpp's TokenType / llama_token_type: UNDEFINED 0 .. BYTE 6 (gguf-py constants.TokenType)
TOKEN_TYPE_MAX = 6
TOKEN_TYPE_BYTE = 6
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>\Z")
_BLOCK = re.compile(r"blk\.(\d+)\.")


def _count(lo: int, hi: int) -> Callable[[Any], str | None]:
    def check(v):
        if not isinstance(v, int) or isinstance(v, bool):
            return f"expected an integer in {lo}..{hi:,}, got {_kind(v)}"
        if not lo <= v <= hi:
            return f"expected an integer in {lo}..{hi:,}"
        return None
    return check


def _count_or_counts(lo: int, hi: int, item_lo: int | None = None) -> Callable[[Any], str | None]:
    """A count, or an array of counts (one per layer: gemma4's head_count_kv, feed_forward_length;
    the model class says whether it takes one, ModelConfig.from_gguf). item_lo: the least an array
    item may be (default lo; head_count_kv's 0 marks a layer without attention, lfm2's conv
    layers, the model class says whether it has such layers), with at least one item >= lo."""
    one, item = _count(lo, hi), _count(lo if item_lo is None else item_lo, hi)

    def check(v):
        if isinstance(v, list):
            bad = next((i for i, x in enumerate(v) if item(x)), None)
            if not v:
                return "expected a count or a non-empty array of counts"
            if bad is not None:
                return f"item {bad}: {item(v[bad])}"
            return None if any(not one(x) for x in v) else f"expected at least one item in {lo}..{hi:,}"
        return one(v)
    return check


def _positive_float(hi: float = math.inf) -> Callable[[Any], str | None]:
    def check(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"expected a number, got {_kind(v)}"
        if not math.isfinite(v) or v <= 0 or v >= hi:
            return "expected a finite number > 0" + (f" and < {hi:g}" if hi != math.inf else "")
        return None
    return check


def _nonnegative_float() -> Callable[[Any], str | None]:
    def check(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"expected a number, got {_kind(v)}"
        if not math.isfinite(v) or v < 0:
            return "expected a finite number >= 0"
        return None
    return check


def _of(typ: type, name: str) -> Callable[[Any], str | None]:
    def check(v):
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            return f"expected {name}, got {_kind(v)}"
        return None
    return check


def _list_of(typ: type, name: str) -> Callable[[Any], str | None]:
    def check(v):
        if not isinstance(v, list):
            return f"expected an array of {name}, got {_kind(v)}"
        bad = next((i for i, x in enumerate(v) if not isinstance(x, typ)), None)
        if bad is not None:
            return f"expected an array of {name}; item {bad} is {_kind(v[bad])}"
        return None
    return check


def _kind(v: Any) -> str:
    """The value's kind after "got" ("a string", "an array")."""
    kind = {bool: "bool", int: "integer", float: "float", str: "string", list: "array"}.get(type(v), type(v).__name__)
    return ("an " if kind[0] in "aeiou" else "a ") + kind


# {arch}.<suffix> -> check. Counts are capped far above any real model (Llama-3.1-405B:
# 126 blocks, 16,384 wide, 53,248 ffn, 131,072 context) so that only nonsense is refused.
ARCH_KEYS: dict[str, Callable[[Any], str | None]] = {
    "block_count": _count(1, 4096),
    "embedding_length": _count(1, 1 << 20),
    "attention.head_count": _count(1, 1 << 14),
    "attention.head_count_kv": _count_or_counts(1, 1 << 14, item_lo=0),
    "attention.key_length": _count(1, 1 << 14),
    "attention.value_length": _count(1, 1 << 14),
    "feed_forward_length": _count_or_counts(1, 1 << 22),
    "context_length": _count(1, 1 << 30),
    "vocab_size": _count(1, 1 << 24),
    "rope.dimension_count": _count(1, 1 << 14),
    "attention.layer_norm_rms_epsilon": _positive_float(1.0),
    "attention.layer_norm_epsilon": _positive_float(1.0),
    "rope.freq_base": _positive_float(),
    "rope.scaling.factor": _positive_float(),
    "rope.scale_linear": _positive_float(),
    "rope.scaling.type": _of(str, "a string"),
    "hidden_activation": _of(str, "a string"),      # gguf-py Keys.LLM.HIDDEN_ACT (bitnet: silu / relu2)
    # mixture of experts (gguf-py Keys.LLM EXPERT_*, LEADING_DENSE_BLOCK_COUNT)
    "expert_count": _count(1, 1 << 16),
    "expert_used_count": _count(1, 1 << 16),
    "expert_feed_forward_length": _count(1, 1 << 22),
    "expert_shared_feed_forward_length": _count(0, 1 << 22),
    "expert_shared_count": _count(0, 1 << 16),
    "expert_group_count": _count(1, 1 << 16),
    "expert_group_used_count": _count(1, 1 << 16),
    "expert_gating_func": _count(1, 255),
    "moe_latent_size": _count(0, 1 << 20),           # nemotron_h_moe (Nemotron-3 Super): 0 or absent, none
    "expert_weights_scale": _nonnegative_float(),
    "leading_dense_block_count": _count(0, 4096),
    # deepseek2's MLA (gguf-py Keys.Attention Q_LORA_RANK, KV_LORA_RANK, KEY/VALUE_LENGTH_MLA; Keys.Rope
    # SCALING_YARN_LOG_MUL)
    "attention.q_lora_rank": _count(0, 1 << 20),
    "attention.kv_lora_rank": _count(1, 1 << 20),
    "attention.key_length_mla": _count(1, 1 << 14),
    "attention.value_length_mla": _count(1, 1 << 14),
    "rope.scaling.yarn_log_multiplier": _nonnegative_float(),
    "nextn_predict_layers": _count(0, 4096),
    # mistral3's Llama-4 attention temperature (gguf-py Keys.Attention.TEMPERATURE_SCALE)
    "attention.temperature_scale": _nonnegative_float(),
    # how an embeddings run pools the hidden rows (gguf-py Keys.LLM.POOLING_TYPE; llama.h enum
    # llama_pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank; runtime/embed.py)
    "pooling_type": _count(0, 4),
    "attention.causal": _of(bool, "a bool"),      # gguf-py Keys.Attention.CAUSAL
}
REQUIRED_ARCH_KEYS = ("block_count", "embedding_length", "attention.head_count",
                      "feed_forward_length", "attention.layer_norm_rms_epsilon", "context_length")

TOKENIZER_KEYS: dict[str, Callable[[Any], str | None]] = {
    "tokenizer.ggml.model": _of(str, "a string"),
    "tokenizer.ggml.pre": _of(str, "a string"),
    "tokenizer.ggml.tokens": _list_of(str, "strings"),
    "tokenizer.ggml.merges": _list_of(str, "strings"),
    "tokenizer.ggml.token_type": _list_of(int, "integers"),
    "tokenizer.ggml.add_bos_token": _of(bool, "a bool"),
    "tokenizer.ggml.add_eos_token": _of(bool, "a bool"),
    "tokenizer.ggml.add_space_prefix": _of(bool, "a bool"),
    "tokenizer.chat_template": _of(str, "a string"),
    # "seperator" (sic) is gguf-py's spelling (constants.py Keys.Tokenizer.SEP_ID), the key
    # converters write and minfer/tokenizer/vocab.py reads; "separator" is checked as well
    # in case a hand-made file spells it correctly
    **{f"tokenizer.ggml.{k}_token_id": _of(int, "an integer token id")
       for k in ("bos", "eos", "eot", "eom", "unknown", "padding", "seperator", "separator",
                 "mask", "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")},
}
GENERAL_KEYS: dict[str, Callable[[Any], str | None]] = {
    "general.architecture": _of(str, "a string"),
    "general.file_type": _of(int, "an integer"),
    "general.name": _of(str, "a string"),
}


# Architectures whose dense files carry expert_count = expert_used_count = 0: granitehybrid's converter
# writes HF's num_local_experts 0 for granite-4.0-h-micro (conversion/base.py set_gguf_parameters), and
# llama.cpp reads n_expert 0 as a dense FFN (granite-hybrid.cpp load_arch_tensors: `if (n_expert > 0)`)
DENSE_ZERO_EXPERTS = frozenset({"granitehybrid"})


def _dense_zero(arch: str, suffix: str, v: Any) -> bool:
    return arch in DENSE_ZERO_EXPERTS and suffix in ("expert_count", "expert_used_count") and type(v) is int and v == 0


# Architectures whose feed_forward_length array has 0 on the layers without an MLP: nemotron_h's converter
# writes n_ff on its MLP blocks only (conversion/nemotron.py NemotronHModel.set_gguf_parameters), and
# llama.cpp reads n_ff(il) == 0 as a Mamba-2 or attention block (nemotron-h.cpp load_arch_hparams)
ZERO_FFN_LAYERS = frozenset({"nemotron_h", "nemotron_h_moe"})   # nemotron_h_moe: its MoE blocks
_ZERO_FFN_ITEMS = _count_or_counts(1, 1 << 22, item_lo=0)


# Architectures with no attention and no MLP at all: mamba2's converter writes head_count 0 and
# feed_forward_length 0 ("unused, but seemingly required when loading": conversion/mamba.py
# Mamba2Model.set_gguf_parameters; MambaModel's the same for `mamba`); llama.cpp's loaders read neither
ATTENTION_FREE = frozenset({"mamba", "mamba2"})
_ZERO_COUNT = _count(0, 1 << 22)


# Architectures whose converter writes head_count as one count per layer (conversion/laguna.py LagunaModel: HF
# num_attention_heads_per_layer, the sliding-window layers with more query heads; llama.cpp hparams.n_head(il))
PER_LAYER_HEADS = frozenset({"laguna", "openelm"})   # openelm: conversion/openelm.py writes num_query_heads per layer
_HEAD_COUNTS = _count_or_counts(1, 1 << 14)


# deci (conversion/deci.py DeciModel): head_count per layer, 0 on its attention-free layers; feed_forward_length per
# layer, 0 on its FFN-free ones (llama.cpp src/models/deci.cpp n_head(il) == 0, n_ff(il) == 0)
ZERO_ITEMS_PER_LAYER = frozenset({"deci"})


def _arch_check(arch: str, suffix: str, check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    if arch in ZERO_ITEMS_PER_LAYER and suffix in ("attention.head_count", "feed_forward_length"):
        return _count_or_counts(1, 1 << 14, item_lo=0) if suffix == "attention.head_count" else _ZERO_FFN_ITEMS
    if arch in PER_LAYER_HEADS and suffix == "attention.head_count":
        return _HEAD_COUNTS
    if arch in ATTENTION_FREE and suffix in ("attention.head_count", "feed_forward_length"):
        return _ZERO_COUNT
    return _ZERO_FFN_ITEMS if arch in ZERO_FFN_LAYERS and suffix == "feed_forward_length" else check


def blocks_present(gf) -> list[int]:
    """The N of every `blk.N.` tensor name, sorted."""
    return sorted({int(m.group(1)) for name in gf.tensors if (m := _BLOCK.match(name))})


def problems(gf) -> dict[str, str]:
    """{metadata key: what is wrong with its value}; empty when every key minfer reads is fine."""
    meta = gf.metadata
    out: dict[str, str] = {}
    for key, check in GENERAL_KEYS.items():
        if key in meta and (msg := check(meta[key])):
            out[key] = msg
    arch = meta.get("general.architecture")
    if isinstance(arch, str):
        for suffix, check in ARCH_KEYS.items():
            key = f"{arch}.{suffix}"
            if key in meta and (msg := _arch_check(arch, suffix, check)(meta[key])) \
                    and not _dense_zero(arch, suffix, meta[key]):
                out[key] = msg
        _check_blocks(gf, f"{arch}.block_count", out)
        heads, kv = meta.get(f"{arch}.attention.head_count"), meta.get(f"{arch}.attention.head_count_kv")
        if f"{arch}.attention.head_count" not in out and f"{arch}.attention.head_count_kv" not in out \
                and isinstance(heads, int) and isinstance(kv, int) and heads % kv:
            out[f"{arch}.attention.head_count_kv"] = f"expected a divisor of head_count ({heads})"
    for key, check in TOKENIZER_KEYS.items():
        if key in meta and (msg := check(meta[key])):
            out[key] = msg
    _check_token_types(meta, out)
    return out


def _check_blocks(gf, key: str, out: dict[str, str]) -> None:
    n = gf.metadata.get(key)
    if key in out or not isinstance(n, int):
        return
    present = blocks_present(gf)
    if not present:
        return  # a file without blk.* tensors (a vocab-only GGUF): nothing to compare
    if key == "deci.block_count":
        # a deci layer with neither attention nor FFN (head_count 0, feed_forward_length 0) has no tensors at all;
        # models/deci.py loads each layer's tensors by name
        if present[-1] >= n:
            out[key] = f"expected more than {present[-1]}: the file has tensors for block {present[-1]}"
        return
    if present != list(range(len(present))):
        missing = sorted(set(range(present[-1] + 1)) - set(present))
        out[key] = (f"the tensors' blocks are not numbered 0..{present[-1]} without gaps "
                    f"(no blk.{missing[0]}.*)")
    elif n != len(present):
        # NextN/MTP layers (glm4moe, deepseek2): block_count counts them, and a file may lack their
        # tensors (llama.cpp glm4-moe.cpp load_arch_tensors: trunk_only)
        nextn = gf.metadata.get(key[:-len("block_count")] + "nextn_predict_layers")
        if isinstance(nextn, int) and not isinstance(nextn, bool) and 0 < nextn <= n and n - nextn == len(present):
            return
        # hrm_text: block_count is the KV-cache slot count, the file holds the two stacks' 2 * hrm.layers_per_stack
        # blocks (llama.cpp src/models/hrm-text.cpp): models/hrm_text.py checks both against the hrm.* keys by name
        if key == "hrm_text.block_count":
            return
        out[key] = f"expected {len(present)}: the file has tensors for blocks 0..{len(present) - 1}"


def _check_token_types(meta: dict, out: dict[str, str]) -> None:
    key = "tokenizer.ggml.token_type"
    types, tokens = meta.get(key), meta.get("tokenizer.ggml.tokens")
    if key in out or not isinstance(types, list):
        return
    bad = next((i for i, t in enumerate(types) if not 0 <= t <= TOKEN_TYPE_MAX), None)
    if bad is not None:
        out[key] = f"item {bad} is {safe(types[bad], 24)}; expected a token type in 0..{TOKEN_TYPE_MAX}"
        return
    if not isinstance(tokens, list) or "tokenizer.ggml.tokens" in out:
        return
    if len(types) < len(tokens):
        out[key] = f"has {len(types):,} entries, expected {len(tokens):,} (one per token)"
        return
    # a BYTE token is rendered from its text <0xXX> (llama-vocab.cpp: token_to_byte)
    for i, t in enumerate(types[:len(tokens)]):
        if t == TOKEN_TYPE_BYTE and not _BYTE_TOKEN.match(tokens[i]):
            out[key] = (f"token {i} {safe(tokens[i], 40)!s} has type BYTE ({TOKEN_TYPE_BYTE}), "
                        "but its text is not of the form <0xXX>")
            return


def check(gf, required: tuple[str, ...] = REQUIRED_ARCH_KEYS) -> None:
    """Raise one MinferError for the first problem (and say how many more there are)."""
    arch = gf.metadata.get("general.architecture")
    if isinstance(arch, str):
        for suffix in required:
            if f"{arch}.{suffix}" not in gf.metadata:
                raise MinferError(f"{safe(gf.path, 200)}: metadata key '{arch}.{suffix}' is missing "
                                  f"(needed to build the {safe(arch, 40)} model)")
    found = problems(gf)
    if not found:
        return
    key, msg = next(iter(found.items()))
    value = gf.metadata.get(key)
    shown = "" if key not in gf.metadata else f" = {safe(value, 60)}"
    more = f" (and {len(found) - 1} more bad keys; `minfer inspect` lists them)" if len(found) > 1 else ""
    raise MinferError(f"{safe(gf.path, 200)}: metadata '{safe(key, 80)}'{shown}: {msg}{more}")
