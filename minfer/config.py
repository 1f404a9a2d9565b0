"""ModelConfig: the hyper-parameters of a model, read once from GGUF metadata.

All GGUF key names live here. Keys are `{arch}.<suffix>` (gguf-py constants.py, class Keys).

RoPE conventions (llama.cpp src/llama-model.cpp, `llama_model_rope_type`):
- `llama` -> LLAMA_ROPE_TYPE_NORM: rotate adjacent pairs (x[2i], x[2i+1]). HF Llama rotates
  (x[i], x[i+d/2]) instead; convert_hf_to_gguf.py (LlamaModel.modify_tensors -> `permute`)
  reorders the rows of attn_q / attn_k inside each head so that the adjacent-pair rotation
  on the GGUF weights equals HF's half-split rotation on the original ones.
- `qwen2` -> LLAMA_ROPE_TYPE_NEOX: rotate (x[i], x[i+n_rot/2]); its q/k are not permuted.
Each model class declares its style (minfer/models/: `rope_style`); the registry there is the
one list of supported architectures.

Rope scaling: `{arch}.rope.scaling.type` none|linear (positions divided by
`rope.scaling.factor`, llama.cpp: freq_scale = 1/factor); Llama-3.1-style scaling is stored
by the converter as a per-frequency divisor tensor `rope_freqs.weight` (ggml_rope_ext's
`freq_factors`), read here when present. `yarn` is accepted only for the architectures in
YARN_ARCHITECTURES, whose model class applies YaRN itself from the rope.scaling.* keys (gpt-oss:
minfer/models/gpt_oss.py yarn_rope); here it then means no linear scale. For every other
architecture yarn (and longrope) is refused with a clear error, never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from minfer.errors import MinferError

# architectures whose model class reads rope.scaling.type yarn and applies YaRN itself
YARN_ARCHITECTURES = frozenset({"gpt-oss", "deepseek2", "mistral3", "arcee", "olmo2", "laguna", "mellum",
                                "mistral4"})
YARN_ARCHITECTURES |= {"glm4moe"}   # Solar Open (conversion/glm.py SolarOpenModel: HF's yarn rope_parameters)
YARN_ARCHITECTURES |= {"grok"}      # Grok-2 (conversion/grok.py writes rope_type "original" as yarn; models/grok.py)


@dataclass(frozen=True)
class RopeConfig:
    """What ops.rope needs. Hashable, so the reference caches its inverse frequencies on it."""

    theta: float                 # rope.freq_base
    style: str                   # 'normal' (adjacent pairs) or 'neox' (halves)
    n_rot: int                   # rotated dims per head (rope.dimension_count), <= head_dim
    freq_scale: float = 1.0      # linear scaling: position * freq_scale
    freq_factors: tuple[float, ...] | None = None  # (n_rot/2,) divisors of each frequency


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rms_eps: float               # the norms' epsilon: the key the model class names (Model.norm_eps_key)
    rope: RopeConfig
    context_length: int
    tied_output: bool            # no output.weight: the logits reuse token_embd.weight
    # n_layers: the trunk's layers, block_count less nextn_predict_layers (the MTP layers no graph runs)
    # Architecture-specific values (read by _arch_extras; defaults = absent). Each model class
    # decides which it uses (e.g. llama.cpp ignores phi3's sliding_window, uses gemma3's).
    sliding_window: int = 0                    # attention.sliding_window (0: none)
    swa_pattern: int | tuple | None = None     # attention.sliding_window_pattern (int, or per layer)
    rope_swa: RopeConfig | None = None         # the sliding-window layers' rope (rope.freq_base_swa)
    rope_long: RopeConfig | None = None        # phi3 LongRoPE: rope_factors_long (rope: the short ones)
    rope_orig_ctx: int = 0                     # rope.scaling.original_context_length
    rope_attn_factor: float = 1.0              # rope.scaling.attn_factor (cos/sin multiplier)
    final_logit_softcap: float = 0.0           # final_logit_softcapping (0: none)
    n_experts: int = 0                         # expert_count (MoE)
    n_experts_used: int = 0                    # expert_used_count
    expert_ffn: int = 0                        # expert_feed_forward_length
    expert_weights_norm: bool | None = None    # expert_weights_norm (None: absent, the model's default)
    expert_shared_ffn: int = 0                 # expert_shared_feed_forward_length (qwen2moe)
    expert_gating: str = "softmax"             # expert_gating_func: 1 softmax, 2 sigmoid (ops.moe_ffn gating)
    expert_weights_scale: float = 1.0          # expert_weights_scale (0 or absent: 1, as llama.cpp)
    expert_shared_count: int = 0               # expert_shared_count (deepseek2, glm4moe)
    expert_groups: int = 1                     # expert_group_count (group-limited routing; 1: none)
    expert_groups_used: int = 1                # expert_group_used_count
    leading_dense_blocks: int = 0              # leading_dense_block_count: first layers with a dense FFN
    heads_per_layer: tuple | None = None       # attention.head_count as an array (laguna); n_heads: its largest
    kv_heads_per_layer: tuple | None = None    # attention.head_count_kv as an array (gemma4; lfm2: 0 on conv layers); n_kv_heads: its largest
    ffn_per_layer: tuple | None = None         # feed_forward_length as an array (gemma4); ffn: its largest
    cache_v_in_k: int = 0                      # > 0: each cached V row is the first this-many dims of its K row,
                                               # stored once (deepseek2's MLA latent: attention.value_length;
                                               # runtime/kv_cache.py); 0: V apart, K's width
    pooling_type: int = -1                     # pooling_type (llama.h llama_pooling_type; -1: absent) for embeddings

    @property
    def rope_theta(self) -> float:
        return self.rope.theta

    @property
    def rope_style(self) -> str:
        return self.rope.style

    @classmethod
    def from_gguf(cls, gf) -> "ModelConfig":
        """Build from a minfer.gguf_file.GGUFFile. Missing keys raise MinferError naming them."""
        from minfer.models import ARCHITECTURES, unsupported   # the one list of architectures (and their rope styles)

        arch = gf.architecture
        if arch not in ARCHITECTURES:
            raise MinferError(f"{gf.path}: {unsupported(arch)}")

        from minfer import metadata_check

        # every key typed and range-checked before any is read (issue 15); the norm epsilon's key is the
        # model class's (LayerNorm graphs: attention.layer_norm_epsilon)
        eps_key = ARCHITECTURES[arch].norm_eps_key
        # a model class whose files carry no dense FFN width (qwen35moe, qwen3next: experts only; llama.cpp's
        # loaders read expert_feed_forward_length there) declares ffn_key_optional: cfg.ffn is then 0 when absent
        ffn_opt = getattr(ARCHITECTURES[arch], "ffn_key_optional", False)
        metadata_check.check(gf, tuple(eps_key if k == "attention.layer_norm_rms_epsilon" else k
                                       for k in metadata_check.REQUIRED_ARCH_KEYS
                                       if not (ffn_opt and k == "feed_forward_length")))

        def req(suffix):
            key = f"{arch}.{suffix}"
            if key not in gf.metadata:
                raise MinferError(f"{gf.path}: metadata key '{key}' is missing "
                                  f"(needed to build the {arch} model)")
            return gf.metadata[key]

        def opt(suffix, default):
            return gf.metadata.get(f"{arch}.{suffix}", default)

        n_layers = int(req("block_count"))
        # NextN/MTP layers (glm4moe, deepseek2): block_count counts them, but the model is the trunk,
        # llama.cpp's n_layer() = n_layer_all - n_layer_nextn (src/llama-hparams.h); the KV cache, the
        # memory preflight and inspect count the trunk's layers
        nextn = int(opt("nextn_predict_layers", 0) or 0)
        if not 0 <= nextn < n_layers:
            raise MinferError(f"{gf.path}: {arch}.nextn_predict_layers={nextn} with block_count={n_layers}: "
                              "expected 0 <= nextn_predict_layers < block_count")
        n_layers -= nextn
        d_model = int(req("embedding_length"))
        # head_count may be an array too (laguna: more query heads on its sliding-window layers); n_heads: the largest
        n_heads, heads_per_layer = _count_or_counts(gf, arch, "attention.head_count", req("attention.head_count"),
                                                    n_layers)
        # one count per layer (gemma4: head_count_kv, feed_forward_length arrays) only for a model class
        # that declares per_layer_counts; the config then holds the largest and the per-layer tuple
        n_kv, kv_per_layer = _count_or_counts(gf, arch, "attention.head_count_kv", opt("attention.head_count_kv", n_heads),
                                              n_layers)
        ffn, ffn_per_layer = _count_or_counts(gf, arch, "feed_forward_length",
                                              opt("feed_forward_length", 0) if ffn_opt else req("feed_forward_length"), n_layers)
        rms_eps = float(req(eps_key))
        ctx = int(req("context_length"))
        # llama.cpp hparams.causal_attn: default true, or the class's causal_key_default where its loader sets it
        # (gemma-embedding: load_arch_hparams causal_attn = false; its converter writes no key)
        causal = opt("attention.causal", getattr(ARCHITECTURES[arch], "causal_key_default", True))
        if ARCHITECTURES[arch].causal and causal is False:
            # an encoder / bidirectional embedding model's file (convert_hf_to_gguf writes the key for HF's
            # is_causal = false: LFM2's bidirectional ColBERT, Dream, LLaDA); run causally it would give other
            # numbers without an error. Only a model class that declares causal = False (an encoder: bert)
            # runs such a file
            raise MinferError(f"{gf.path}: {arch}.attention.causal is false (bidirectional attention, an encoder or "
                              f"diffusion model's file): minfer runs {arch} with causal attention only")
        if not ARCHITECTURES[arch].causal and causal is not False:
            # llama.cpp would mask such a file causally (causal_attn defaults to true); its converter always writes
            # false for an encoder (conversion/bert.py BertModel.set_gguf_parameters: add_causal_attention(False))
            said = repr(causal) if f"{arch}.attention.causal" in gf.metadata else "absent"
            raise MinferError(f"{gf.path}: {arch}.attention.causal is {said}: {arch} is an encoder (bidirectional "
                              "attention) whose files carry attention.causal = false")
        pooling = int(opt("pooling_type", -1))      # how an embeddings run pools (runtime/embed.py)
        if getattr(ARCHITECTURES[arch], "attention_free", False):
            # no attention and no MLP in any layer (mamba2: the converter writes head_count 0 and
            # feed_forward_length 0, which llama.cpp never reads): no heads, no rope
            if n_heads or n_kv:
                raise MinferError(f"{gf.path}: {arch}.attention.head_count={n_heads}: {arch} has no attention layers "
                                  "(expected 0)")
            emb = gf.tensor("token_embd.weight")
            vocab = int(opt("vocab_size", emb.shape[0]))
            if emb.shape != (vocab, d_model):
                raise MinferError(f"{gf.path}: tensor 'token_embd.weight' has shape {emb.shape}, "
                                  f"expected ({vocab}, {d_model})")
            return cls(arch=arch, n_layers=n_layers, d_model=d_model, n_heads=0, n_kv_heads=0, head_dim=0, ffn=ffn,
                       vocab=vocab, rms_eps=rms_eps, rope=RopeConfig(theta=10000.0, style="normal", n_rot=0),
                       context_length=ctx, tied_output="output.weight" not in gf.tensors, pooling_type=pooling)
        if n_heads <= 0 or n_kv <= 0 or n_heads % n_kv:
            raise MinferError(f"{gf.path}: {arch}.attention.head_count={n_heads} is not a multiple of "
                              f"head_count_kv={n_kv}")
        head_dim = int(opt("attention.key_length", d_model // n_heads))
        if head_dim * n_heads != d_model and f"{arch}.attention.key_length" not in gf.metadata:
            raise MinferError(f"{gf.path}: embedding_length {d_model} is not divisible by head_count {n_heads}")

        emb = gf.tensor("token_embd.weight")
        vocab = int(opt("vocab_size", emb.shape[0]))
        if emb.shape != (vocab, d_model):
            raise MinferError(f"{gf.path}: tensor 'token_embd.weight' has shape {emb.shape}, "
                              f"expected ({vocab}, {d_model})")

        n_rot = int(opt("rope.dimension_count", head_dim))
        # partial rotary (Phi-4-mini: 96 of 128): the first n_rot dims rotate, the rest pass
        # through (ggml_rope_ext with n_dims < head size)
        if not 0 < n_rot <= head_dim or n_rot % 2:
            raise MinferError(f"{gf.path}: {arch}.rope.dimension_count={n_rot}: expected an even number "
                              f"of rotated dims, at most the head size {head_dim}")
        rope = RopeConfig(theta=float(opt("rope.freq_base", 10000.0)), style=ARCHITECTURES[arch].rope_style, n_rot=n_rot,
                          freq_scale=_freq_scale(gf, arch), freq_factors=_freq_factors(gf, n_rot))
        tied = "output.weight" not in gf.tensors
        extras = _arch_extras(gf, arch, rope)
        rope = extras.pop("rope_short", rope)
        if kv_per_layer is not None and 0 in kv_per_layer and not getattr(ARCHITECTURES[arch], "attention_free_layers",
                                                                          False):
            raise MinferError(f"{gf.path}: {arch}.attention.head_count_kv {list(kv_per_layer)} has a 0 (a layer "
                              f"without attention); every {arch} layer has attention")
        # a class with attention_free_layers: a layer of kv 0 may carry any head count >= 0 (deci: 0 no attention,
        # H its "linear attention"; llama.cpp src/models/deci.cpp)
        free = getattr(ARCHITECTURES[arch], "attention_free_layers", False)
        if heads_per_layer is not None and any(h < 0 if free and kv == 0 else h <= 0 or h % kv for h, kv in
                                               zip(heads_per_layer, kv_per_layer or (n_kv,) * n_layers)):
            raise MinferError(f"{gf.path}: {arch}.attention.head_count {list(heads_per_layer)}: each layer's count must "
                              f"be a positive multiple of its head_count_kv")
        # (per-layer head counts: each layer's own ratio is checked just above; OpenELM-270M's max 20 over some 3s)
        if kv_per_layer is not None and heads_per_layer is None and any(h and n_heads % h for h in kv_per_layer):
            raise MinferError(f"{gf.path}: {arch}.attention.head_count={n_heads} is not a multiple of each "
                              f"head_count_kv {list(kv_per_layer)}")
        return cls(arch=arch, n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv,
                   head_dim=head_dim, ffn=ffn, vocab=vocab, rms_eps=rms_eps, rope=rope,
                   context_length=ctx, tied_output=tied, kv_heads_per_layer=kv_per_layer,
                   ffn_per_layer=ffn_per_layer, heads_per_layer=heads_per_layer, pooling_type=pooling, **extras)


def _count_or_counts(gf, arch, suffix, value, n_layers) -> tuple[int, tuple[int, ...] | None]:
    """(the count, None), or for an array of one count per layer (a model class with per_layer_counts)
    (the largest, the tuple)."""
    from minfer.models import ARCHITECTURES

    if not isinstance(value, list):
        return int(value), None
    if not getattr(ARCHITECTURES[arch], "per_layer_counts", False):
        raise MinferError(f"{gf.path}: {arch}.{suffix} is an array (one value per layer); "
                          f"{arch} takes a single value")
    if len(value) < n_layers:
        raise MinferError(f"{gf.path}: {arch}.{suffix} has {len(value)} entries, expected one per layer ({n_layers})")
    vals = tuple(int(v) for v in value[:n_layers])
    return max(vals), vals


def _freq_scale(gf, arch) -> float:
    kind = gf.metadata.get(f"{arch}.rope.scaling.type", "none")
    factor = gf.metadata.get(f"{arch}.rope.scaling.factor")
    if kind in ("none", None):
        # older files: rope.scale_linear (llama.cpp LLM_KV_ROPE_SCALE_LINEAR)
        lin = gf.metadata.get(f"{arch}.rope.scale_linear")
        return 1.0 / float(lin) if lin else 1.0
    if kind == "linear":
        if not factor:
            raise MinferError(f"{gf.path}: {arch}.rope.scaling.type is linear but "
                              f"'{arch}.rope.scaling.factor' is missing")
        return 1.0 / float(factor)
    if kind == "yarn" and arch in YARN_ARCHITECTURES:
        return 1.0   # the model applies YaRN (per-frequency divisors, mscale), not a linear scale
    from minfer.models import ARCHITECTURES
    if kind == "longrope" and getattr(ARCHITECTURES[arch], "longrope_factors", False):
        return 1.0   # the model picks rope_factors_short/long by context (_arch_extras; minicpm), no linear scale
    yarn = f"; yarn only for {', '.join(sorted(YARN_ARCHITECTURES))}" if kind == "yarn" else ""
    raise MinferError(f"{gf.path}: {arch}.rope.scaling.type '{kind}' is not supported "
                      f"(supported: none, linear, and llama3-style rope_freqs.weight{yarn})")


def _arch_extras(gf, arch, rope: RopeConfig) -> dict:
    """The optional keys of newer architectures (gemma3, phi3, qwen3moe): ModelConfig fields.
    Key names: llama.cpp src/llama-arch.cpp LLM_KV_NAMES; defaults: llama-hparams.h."""
    from dataclasses import replace

    md = gf.metadata

    def opt(suffix, default):
        return md.get(f"{arch}.{suffix}", default)

    out = dict(
        sliding_window=int(opt("attention.sliding_window", 0) or 0),
        # the local layers' rope: its own base, never the global layers' linear scaling
        # (llama_model::get_rope_freq_scale -> rope_freq_scale_train_swa = 1)
        rope_swa=RopeConfig(theta=float(opt("rope.freq_base_swa", 10000.0)), style=rope.style, n_rot=rope.n_rot),
        rope_orig_ctx=int(opt("rope.scaling.original_context_length", 0) or 0),
        rope_attn_factor=float(opt("rope.scaling.attn_factor", 1.0) or 1.0),
        final_logit_softcap=float(opt("final_logit_softcapping", 0.0) or 0.0),
        n_experts=int(opt("expert_count", 0) or 0),
        n_experts_used=int(opt("expert_used_count", 0) or 0),
        expert_ffn=int(opt("expert_feed_forward_length", 0) or 0),
        expert_weights_norm=None if opt("expert_weights_norm", None) is None else bool(opt("expert_weights_norm", None)),
        expert_shared_ffn=int(opt("expert_shared_feed_forward_length", 0) or 0),
        expert_weights_scale=float(opt("expert_weights_scale", 0.0) or 1.0),
        expert_shared_count=int(opt("expert_shared_count", 0) or 0),
        expert_groups=int(opt("expert_group_count", 1) or 1),
        expert_groups_used=int(opt("expert_group_used_count", 1) or 1),
        leading_dense_blocks=int(opt("leading_dense_block_count", 0) or 0),
    )
    from minfer.models import ARCHITECTURES

    if getattr(ARCHITECTURES[arch], "value_in_key", False):   # deepseek2: V = the latent, K's first dims
        out["cache_v_in_k"] = int(opt("attention.value_length", 0) or 0)
    pattern = opt("attention.sliding_window_pattern", None)
    out["swa_pattern"] = tuple(pattern) if isinstance(pattern, list) else pattern
    # llama.cpp llama_expert_gating_func_type: SOFTMAX = 1, SIGMOID = 2 (SOFTMAX_WEIGHT = 3 and
    # SQRT_SOFTPLUS = 4 belong to architectures minfer does not have). Each architecture names the
    # gatings its graph has (Model.expert_gatings).
    gating = opt("expert_gating_func", None)
    if gating is not None:
        name = {1: "softmax", 2: "sigmoid"}.get(int(gating))
        allowed = ARCHITECTURES[arch].expert_gatings
        if name not in allowed:
            names = ", ".join(f"{i} ({g})" for i, g in ((1, "softmax"), (2, "sigmoid")) if g in allowed)
            raise MinferError(f"{gf.path}: {arch}.expert_gating_func={gating} is not supported for {arch} "
                              f"(supported: {names})")
        out["expert_gating"] = name
    groups, used = out["expert_groups"], out["expert_groups_used"]
    if groups > 1 and (out["n_experts"] % groups or not 0 < used <= groups):
        raise MinferError(f"{gf.path}: {arch}.expert_group_count={groups}, expert_group_used_count={used}, "
                          f"expert_count={out['n_experts']}: expected groups that divide the experts and "
                          f"0 < used <= groups")
    # phi3 LongRoPE: per-frequency divisors, short within the original context, long past it
    if "rope_factors_short.weight" in gf.tensors or "rope_factors_long.weight" in gf.tensors:
        short = _factor_tensor(gf, "rope_factors_short.weight", rope.n_rot)
        long_ = _factor_tensor(gf, "rope_factors_long.weight", rope.n_rot)
        out["rope_long"] = replace(rope, freq_factors=long_)
        out["rope_short"] = replace(rope, freq_factors=short)
    return out


def _factor_tensor(gf, name, n_rot):
    if name not in gf.tensors:
        raise MinferError(f"{gf.path}: tensor '{name}' is missing (LongRoPE files carry both "
                          "rope_factors_short.weight and rope_factors_long.weight)")
    import numpy as np

    from minfer.quants import dequantize

    t = gf.tensors[name]
    if t.n_elements != n_rot // 2:
        raise MinferError(f"{gf.path}: tensor '{name}' has {t.n_elements} values, expected n_rot/2 = {n_rot // 2}")
    vals = np.asarray(dequantize(t.data, t.qtype, t.shape), dtype=np.float32).reshape(-1)
    return tuple(float(v) for v in vals)


def _freq_factors(gf, n_rot):
    if "rope_freqs.weight" not in gf.tensors:
        return None
    import numpy as np

    from minfer.quants import dequantize

    t = gf.tensors["rope_freqs.weight"]
    if t.n_elements != n_rot // 2:
        raise MinferError(f"{gf.path}: tensor 'rope_freqs.weight' has {t.n_elements} values, "
                          f"expected n_rot/2 = {n_rot // 2}")
    vals = np.asarray(dequantize(t.data, t.qtype, t.shape), dtype=np.float32).reshape(-1)
    return tuple(float(v) for v in vals)
