"""Write a GGUF with random weights at a real model's geometry (`minfer synth`).

The file is what llama.cpp's convert + quantize would produce for that model, minus the
trained values: the same tensor names, shapes, per-tensor types (the recipe rule below),
metadata keys and a byte-level BPE tokenizer, so that minfer and other engines load it
and time it like the real thing.

Speed: the 7B geometry holds 7.6e9 weights; running the reference k-quant search on all of
them in numpy would take hours. Quantized blocks are self-contained (each carries its own
scales), so we quantize a pool of random blocks per type once, for real, and fill each
tensor by drawing pool blocks at random (seeded). Every block in the file is a genuine
quantization of N(0, std^2) floats; the file is written tensor by tensor, never held whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

from minfer.bench.presets import Preset
from minfer.errors import MinferError

RECIPES = ("q4_k_m", "q4_0", "q8_0", "f16")

# general.file_type values: llama.cpp include/llama.h enum llama_ftype
# (= gguf.LlamaFileType): MOSTLY_F16 = 1, MOSTLY_Q4_0 = 2, MOSTLY_Q8_0 = 7, MOSTLY_Q4_K_M = 15.
FILE_TYPE = {"f16": 1, "q4_0": 2, "q8_0": 7, "q4_k_m": 15}

QK_K = 256
WEIGHT_STD = 0.02      # std of the random 2-D weights (typical of trained LLM layers)
POOL_BLOCKS = 4096     # distinct quantized 256-value runs per type (1M floats quantized for real)


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]   # numpy order: (rows, row_len) for 2-D weights
    qtype: T
    kind: str                # 'weight' (2-D), 'norm' (1-D, ~1), 'bias' (random), 'rope_freqs'
    experts: int = 0         # > 0: a stacked expert tensor, written 3-D (experts, rows/experts, row_len)


# ---------------------------------------------------------------- the type rule

def use_more_bits(i: int, n: int) -> bool:
    """MODELS.md's Q4_K_M rule (llama.cpp src/llama-quant.cpp use_more_bits): the layers whose
    attn_v and ffn_down get Q6_K -- the first and last eighth and every third one between.
    llama-quantize's i is the tensor's position among the attn_v (ffn_down) tensors in file
    order; synth writes layers in numeric order, so i is the layer number here. (Files whose
    layers are stored in string order, 0, 1, 10, ..., like the real Qwen2.5-Coder-0.5B, get
    the Q6_K on other layers: see tests/bench/test_synth.py.)"""
    e = n // 8
    return i < e or i >= 7 * n // 8 or (i - e) % 3 == 2


def k_quant_fallback(qtype: T, row_len: int) -> T:
    """llama.cpp src/llama-quant.cpp llama_tensor_get_type, `convert_incompatible_tensor`: a
    k-quant needs rows (ne[0]) that are a multiple of 256; otherwise Q4_K -> Q5_0 and
    Q6_K -> Q8_0, and if the row is not a multiple of the new block (32) either, F16."""
    if qtype not in (T.Q4_K, T.Q6_K) or row_len % QK_K == 0:
        return qtype
    new = T.Q5_0 if qtype == T.Q4_K else T.Q8_0
    return new if row_len % 32 == 0 else T.F16


def weight_type(recipe: str, name: str, layer: int | None, n_layers: int, row_len: int,
                tied: bool) -> T:
    """The ggml type of a 2-D weight under `recipe`."""
    if recipe == "q4_k_m":
        # llama-quant.cpp: output.weight -- or token_embd when there is no output.weight --
        # gets Q6_K; everything else starts from the ftype's default Q4_K.
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            t = T.Q6_K
        elif layer is not None and name.split(".")[2] in ("attn_v", "ffn_down", "ffn_down_exps") \
                and use_more_bits(layer, n_layers):
            t = T.Q6_K
        else:
            t = T.Q4_K
        return k_quant_fallback(t, row_len)
    # The uniform recipes put every 2-D weight in one type (llama-quantize --pure); a row
    # that is not a multiple of the 32-value block falls back to F16 like above.
    t = {"q4_0": T.Q4_0, "q8_0": T.Q8_0, "f16": T.F16}[recipe]
    if t != T.F16 and row_len % 32 != 0:
        return T.F16
    return t


def plan_tensors(p: Preset, recipe: str) -> list[TensorPlan]:
    """Every tensor of the file, in llama.cpp's order, with its shape and type."""
    if recipe not in RECIPES:
        raise MinferError(f"--recipe {recipe!r}: unknown recipe (expected one of {', '.join(RECIPES)})")
    if p.arch not in SYNTH_ARCHS:
        raise MinferError(f"--arch {p.arch!r}: expected one of {', '.join(SYNTH_ARCHS)}")
    if (p.arch == "qwen3moe") != (p.n_expert > 0):
        raise MinferError(f"--arch {p.arch!r}: experts go with qwen3moe only (preset {p.name} has {p.n_expert})")
    plans: list[TensorPlan] = []

    def w(name: str, rows: int, cols: int, layer: int | None = None, experts: int = 0) -> None:
        plans.append(TensorPlan(name, (rows, cols),
                                weight_type(recipe, name, layer, p.n_layers, cols, p.tied), "weight", experts))

    def norm(name: str, n: int) -> None:
        plans.append(TensorPlan(name, (n,), T.F32, "norm"))

    w("token_embd.weight", p.vocab, p.hidden)
    if p.rope_scaling and p.rope_scaling[0] == "llama3":   # converter: generate_extra_tensors
        plans.append(TensorPlan("rope_freqs.weight", (p.head_dim // 2,), T.F32, "rope_freqs"))
    for i in range(p.n_layers):
        b = f"blk.{i}."
        if p.arch != "olmo2":   # OLMo 2 has no pre-norms (llama_model_olmo2::load_arch_tensors)
            plans.append(TensorPlan(b + "attn_norm.weight", (p.hidden,), T.F32, "norm"))
        w(b + "attn_q.weight", p.q_dim, p.hidden, i)
        w(b + "attn_k.weight", p.kv_dim, p.hidden, i)
        w(b + "attn_v.weight", p.kv_dim, p.hidden, i)
        if p.arch in ("qwen2", "glm4"):  # q/k/v biases (F32, like every 1-D tensor)
            plans.append(TensorPlan(b + "attn_q.bias", (p.q_dim,), T.F32, "bias"))
            plans.append(TensorPlan(b + "attn_k.bias", (p.kv_dim,), T.F32, "bias"))
            plans.append(TensorPlan(b + "attn_v.bias", (p.kv_dim,), T.F32, "bias"))
        if p.arch in ("qwen3", "qwen3moe", "gemma3"):      # per-head q/k RMSNorm
            norm(b + "attn_q_norm.weight", p.head_dim)
            norm(b + "attn_k_norm.weight", p.head_dim)
        elif p.arch == "olmo2":                             # q/k RMSNorm over the whole projection
            norm(b + "attn_q_norm.weight", p.q_dim)
            norm(b + "attn_k_norm.weight", p.kv_dim)
        w(b + "attn_output.weight", p.hidden, p.q_dim, i)
        if p.arch in ("gemma2", "gemma3", "olmo2", "glm4"):
            norm(b + "post_attention_norm.weight", p.hidden)
        if p.arch != "olmo2":
            plans.append(TensorPlan(b + "ffn_norm.weight", (p.hidden,), T.F32, "norm"))
        if p.n_expert:
            E, F = p.n_expert, p.expert_ffn
            plans.append(TensorPlan(b + "ffn_gate_inp.weight", (E, p.hidden), T.F32, "bias"))
            w(b + "ffn_gate_exps.weight", E * F, p.hidden, i, experts=E)
            w(b + "ffn_up_exps.weight", E * F, p.hidden, i, experts=E)
            w(b + "ffn_down_exps.weight", E * p.hidden, F, i, experts=E)
        elif p.arch == "glm4":   # gate and up in one matrix, gate first (glm4.cpp load_arch_tensors)
            w(b + "ffn_up.weight", 2 * p.ffn, p.hidden, i)
            w(b + "ffn_down.weight", p.hidden, p.ffn, i)
        else:
            w(b + "ffn_gate.weight", p.ffn, p.hidden, i)
            w(b + "ffn_up.weight", p.ffn, p.hidden, i)
            w(b + "ffn_down.weight", p.hidden, p.ffn, i)
        if p.arch in ("gemma2", "gemma3", "olmo2", "glm4"):
            norm(b + "post_ffw_norm.weight", p.hidden)
    plans.append(TensorPlan("output_norm.weight", (p.hidden,), T.F32, "norm"))
    if not p.tied:
        w("output.weight", p.vocab, p.hidden)
    return plans


SYNTH_ARCHS = ("qwen2", "llama", "qwen3", "gemma2", "gemma3", "qwen3moe", "olmo2", "granite", "smollm3", "ernie4_5",
               "glm4")


def llama3_rope_factors(p: Preset) -> np.ndarray:
    """rope_freqs.weight as convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors computes it
    from rope_scaling (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)."""
    import math

    _, factor, low, high, old_ctx = p.rope_scaling
    freqs = 1.0 / (p.rope_base ** (np.arange(0, p.head_dim, 2, dtype=np.float32) / p.head_dim))
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def tensor_nbytes(t: TensorPlan) -> int:
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[t.qtype]
    n = int(np.prod(t.shape))
    return n // block * size


# ---------------------------------------------------------------- weights

def quantize_rows(x: np.ndarray, qtype: T) -> np.ndarray:
    """(rows, n) float32 -> (rows, row_bytes) uint8 through minfer.quants, else the gguf
    package (which quantizes Q4_0/Q5_0/Q8_0/F16 but not the k-quants)."""
    try:
        from minfer.quants import quantize
    except ImportError:
        quantize = None
    if quantize is not None:
        try:
            return np.asarray(quantize(x, int(qtype)), dtype=np.uint8).reshape(x.shape[0], -1)
        except (MinferError, NotImplementedError, KeyError, ValueError, TypeError):
            pass  # this type is not (yet) in minfer.quants: try gguf below
    import gguf.quants

    try:
        return np.asarray(gguf.quants.quantize(x, qtype), dtype=np.uint8).reshape(x.shape[0], -1)
    except (NotImplementedError, gguf.quants.QuantError) as e:
        raise MinferError(f"cannot quantize to {qtype.name}: neither minfer.quants nor the gguf "
                          f"package has a quantizer for it ({e})") from e


class BlockPool:
    """Per type, POOL_BLOCKS runs of 256 random floats quantized for real; tensors are filled
    by drawing runs at random. A 256-run holds whole blocks of every type (32 or 256 values)."""

    def __init__(self, rng: np.random.Generator, std: float = WEIGHT_STD, n_runs: int = POOL_BLOCKS):
        self.rng, self.std, self.n_runs = rng, std, n_runs
        self.pools: dict[T, np.ndarray] = {}   # qtype -> (n_blocks, type_size) uint8

    def pool(self, qtype: T) -> np.ndarray:
        if qtype not in self.pools:
            from gguf import GGML_QUANT_SIZES
            import gguf.quants

            x = (self.rng.standard_normal((self.n_runs, QK_K), dtype=np.float32) * self.std)
            q = quantize_rows(x, qtype)                             # (n_runs, run_bytes)
            # every block must decode to finite values (checked by the independent gguf decoder)
            back = gguf.quants.dequantize(q, qtype)
            if not np.isfinite(back).all():
                raise MinferError(f"quantizing random floats to {qtype.name} gave non-finite blocks")
            self.pools[qtype] = q.reshape(-1, GGML_QUANT_SIZES[qtype][1])
        return self.pools[qtype]

    def fill(self, t: TensorPlan) -> np.ndarray:
        """The bytes of one tensor: uint8 (rows, row_bytes) for quantized types, else float."""
        if t.kind == "norm":   # RMSNorm gains near 1, as trained models have
            return (1.0 + self.rng.standard_normal(t.shape, dtype=np.float32) * self.std).astype(np.float32)
        if t.kind == "bias":
            return self.rng.standard_normal(t.shape, dtype=np.float32) * self.std
        if t.qtype in (T.F16, T.F32):
            x = self.rng.standard_normal(t.shape, dtype=np.float32) * self.std
            return x.astype(np.float16 if t.qtype == T.F16 else np.float32)
        pool = self.pool(t.qtype)
        rows, row_len = t.shape
        from gguf import GGML_QUANT_SIZES

        block = GGML_QUANT_SIZES[t.qtype][0]
        idx = self.rng.integers(0, pool.shape[0], size=rows * row_len // block, dtype=np.int32)
        return pool[idx].reshape(rows, -1)


# ---------------------------------------------------------------- tokenizer

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def minimal_tokenizer(arch: str, vocab: int) -> dict:
    """A small valid byte-level gpt2 vocab: 256 byte tokens, a few merges, ChatML special
    tokens, padded to `vocab` with unused '[PAD{i}]' tokens (convert_hf_to_gguf's padding)."""
    from minfer.tokenizer.bpe import bytes_to_unicode

    to_char = bytes_to_unicode()                    # GPT-2's byte alphabet, as the tokenizer reads it
    byte = [to_char[b] for b in range(256)]
    merges = [("Ġ", "t"), ("Ġ", "a"), ("h", "e"), ("i", "n"), ("t", "h"), ("Ġt", "he")]
    tokens = byte + [a + b for a, b in merges]
    types = [1] * len(tokens)                       # gguf.TokenType.NORMAL
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    first_special = len(tokens)
    tokens += specials
    types += [3] * len(specials)                    # CONTROL
    if len(tokens) > vocab:
        raise MinferError(f"vocab {vocab} is too small for the minimal tokenizer ({len(tokens)} tokens)")
    return {
        "tokenizer.ggml.model": "gpt2",
        # a pre-tokenizer of the catalog models (so minfer's tokenizer knows it)
        "tokenizer.ggml.pre": "qwen2" if arch in ("qwen2", "qwen3", "qwen3moe") else "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": [f"{a} {b}" for a, b in merges],
        "tokenizer.ggml.bos_token_id": first_special,        # <|endoftext|>
        "tokenizer.ggml.eos_token_id": first_special + 2,    # <|im_end|>
        "tokenizer.ggml.padding_token_id": first_special,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML,
    }


TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                  "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
                  "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                  "tokenizer.ggml.eot_token_id", "tokenizer.ggml.unknown_token_id",
                  "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                  "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix",
                  "tokenizer.chat_template")


def copied_tokenizer(model_path: Path) -> dict:
    """The tokenizer metadata of a real GGUF model, as plain values."""
    from minfer.gguf_file import GGUFFile

    src = GGUFFile(model_path)
    if src.get("tokenizer.ggml.model") != "gpt2":
        raise MinferError(f"{model_path}: tokenizer.ggml.model is {src.get('tokenizer.ggml.model')!r}; "
                          "--tokenizer-from expects a byte-level BPE ('gpt2') model")
    return {k: src.metadata[k] for k in TOKENIZER_KEYS if k in src.metadata}


def pad_vocab(tok: dict, vocab: int, source: str) -> dict:
    """Pad the token list (and types, scores) to `vocab` entries with unique '[PAD{i}]'."""
    tok = dict(tok)
    tokens = list(tok["tokenizer.ggml.tokens"])
    n = len(tokens)
    if n > vocab:
        raise MinferError(f"{source}: its tokenizer has {n} tokens, more than the vocab of {vocab} "
                          "rows being written (pick a preset of the same family or --vocab)")
    tokens += [f"[PAD{i}]" for i in range(n, vocab)]
    tok["tokenizer.ggml.tokens"] = tokens
    types = list(tok.get("tokenizer.ggml.token_type", [1] * n))
    tok["tokenizer.ggml.token_type"] = types + [5] * (vocab - n)       # gguf.TokenType.UNUSED
    if "tokenizer.ggml.scores" in tok:
        tok["tokenizer.ggml.scores"] = list(tok["tokenizer.ggml.scores"]) + [-1e9] * (vocab - n)
    return tok


# ---------------------------------------------------------------- the file

def arch_metadata(p: Preset) -> dict:
    """The hyper-parameter keys convert_hf_to_gguf.py writes for qwen2 / llama."""
    a = p.arch
    md = {
        f"{a}.context_length": ("u32", p.ctx),
        f"{a}.embedding_length": ("u32", p.hidden),
        f"{a}.block_count": ("u32", p.n_layers),
        f"{a}.feed_forward_length": ("u32", p.ffn),
        f"{a}.attention.head_count": ("u32", p.n_head),
        f"{a}.attention.head_count_kv": ("u32", p.n_kv_head),
        f"{a}.rope.freq_base": ("f32", p.rope_base),
        f"{a}.attention.layer_norm_rms_epsilon": ("f32", p.rms_eps),
    }
    if p.n_expert:
        md[f"{a}.expert_count"] = ("u32", p.n_expert)
        md[f"{a}.expert_used_count"] = ("u32", p.n_expert_used)
        md[f"{a}.expert_feed_forward_length"] = ("u32", p.expert_ffn)
    if p.sliding_window:
        md[f"{a}.attention.sliding_window"] = ("u32", p.sliding_window)
    if a == "gemma2":   # Gemma2Config's soft-caps (every released size), as the converter writes them
        md[f"{a}.attn_logit_softcapping"] = ("f32", 50.0)
        md[f"{a}.final_logit_softcapping"] = ("f32", 30.0)
    if p.rope_swa_base:
        md[f"{a}.rope.freq_base_swa"] = ("f32", p.rope_swa_base)
    if p.rope_scaling and p.rope_scaling[0] == "linear":
        md[f"{a}.rope.scaling.type"] = "linear"
        md[f"{a}.rope.scaling.factor"] = ("f32", p.rope_scaling[1])
    if a in ("llama", "granite", "smollm3"):  # the llama converter (and its subclasses') also writes these two
        md[f"{a}.vocab_size"] = ("u32", p.vocab)
        md[f"{a}.rope.dimension_count"] = ("u32", p.head_dim)
    if p.rope_dims:
        md[f"{a}.rope.dimension_count"] = ("u32", p.rope_dims)
    if p.multipliers:   # conversion/granite.py: the _multiplier configs as _scale keys
        for key, v in zip(("embedding_scale", "attention.scale", "residual_scale", "logit_scale"), p.multipliers):
            md[f"{a}.{key}"] = ("f32", v)
    if p.head_dim * p.n_head != p.hidden:  # only needed when head_dim is not hidden / n_head
        md[f"{a}.attention.key_length"] = ("u32", p.head_dim)
        md[f"{a}.attention.value_length"] = ("u32", p.head_dim)
    return md


def _add_kv(writer, key: str, value) -> None:
    """Write one metadata value with the GGUF type llama.cpp uses for that key."""
    if isinstance(value, tuple):                 # ("u32" | "f32", number) from arch_metadata
        kind, v = value
        (writer.add_uint32 if kind == "u32" else writer.add_float32)(key, v)
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):                 # token ids
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, (list, np.ndarray)):
        writer.add_array(key, list(value))       # str -> STRING, int -> INT32, float -> FLOAT32
    else:
        raise MinferError(f"metadata key {key!r}: cannot write a value of type {type(value).__name__}")


@dataclass
class SynthResult:
    path: Path
    n_tensors: int
    n_bytes: int                 # tensor data bytes
    type_counts: dict[str, int]  # ggml type name -> tensors


def write_synth(out: Path, p: Preset, recipe: str, seed: int = 0, tokenizer: dict | None = None,
                std: float = WEIGHT_STD, progress: bool = True,
                plans: list[TensorPlan] | None = None) -> SynthResult:
    """Write the synthetic model to `out`, tensor by tensor (peak memory ~ the largest tensor).
    `plans`: plan_tensors(p, recipe), when the caller has it already (`minfer synth` sized the
    file with it); planned here otherwise."""
    import gguf
    from tqdm import tqdm

    if plans is None:
        plans = plan_tensors(p, recipe)
    tok = pad_vocab(tokenizer if tokenizer is not None else minimal_tokenizer(p.arch, p.vocab),
                    p.vocab, "tokenizer")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), p.arch)   # writes general.architecture
    writer.add_string("general.type", "model")
    writer.add_string("general.name", f"minfer synth {p.name} {recipe} (random weights, seed {seed})")
    writer.add_uint32("general.file_type", FILE_TYPE[recipe])
    writer.add_uint32("general.quantization_version", 2)  # ggml.h GGML_QNT_VERSION
    for k, v in arch_metadata(p).items():
        _add_kv(writer, k, v)
    for k, v in tok.items():
        _add_kv(writer, k, v)

    total = 0
    counts: dict[str, int] = {}
    for t in plans:
        n = tensor_nbytes(t)
        total += n
        counts[t.qtype.name] = counts.get(t.qtype.name, 0) + 1
        lead = (t.experts, t.shape[0] // t.experts) if t.experts else (t.shape[0],)
        if t.qtype in (T.F32, T.F16):
            shape = (*lead, *t.shape[1:]) if len(t.shape) > 1 else t.shape
            writer.add_tensor_info(t.name, shape, np.dtype(np.float32 if t.qtype == T.F32 else np.float16), n)
        else:
            row_bytes = n // t.shape[0]
            writer.add_tensor_info(t.name, (*lead, row_bytes), np.dtype(np.uint8), n, raw_dtype=t.qtype)

    rng = np.random.default_rng(seed)
    pool = BlockPool(rng, std)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"synth {out.name}",
                  disable=not progress) as bar:
            for t in plans:
                data = llama3_rope_factors(p) if t.kind == "rope_freqs" else pool.fill(t)
                if data.nbytes != tensor_nbytes(t):
                    raise MinferError(f"tensor {t.name}: produced {data.nbytes} bytes, expected "
                                      f"{tensor_nbytes(t)}")
                writer.write_tensor_data(data)
                bar.update(data.nbytes)
    finally:
        writer.close()
    return SynthResult(out, len(plans), total, counts)
