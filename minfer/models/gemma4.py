"""Google Gemma 4 (text): the GGUF arch `gemma4`: the 31B's dense form, E2B/E4B's per-layer
embeddings, shared-KV layers and double-wide MLPs, and the 26B-A4B's MoE layers (minfer/models/
gemma4_moe.py: the CPU reference only, a CUDA load of an MoE file is refused by name).

    x_0 = E[tokens] * sqrt(D)                                             token_embd (V, D), tied lm head
    for each layer l (head size Dh_l, kv heads Hkv_l, rope_l, window_l by the layer's kind):
        q = rope_l(qn(W_q n(x)))                                          n  = RMSNorm(attn_norm)
        k = rope_l(kn(W_k n(x)));   v = rms(W_v n(x))   (v = rms(W_k n(x)) where attn_v is absent)
        a = W_o softmax(q k^T * 1.0 [+ window mask]) v
        x = x + pn(a)                                                     pn = RMSNorm(post_attention_norm)
        x = x + fn(W_down(gelu_tanh(W_gate n'(x)) * W_up n'(x)))          n' = ffn_norm, fn = post_ffw_norm
                                                   (MoE layers: fn(mlp + experts), gemma4_moe.py)
        x = x + pln(W_proj(gelu_tanh(W_gate' x) * ple[l]))             per-layer embeddings (if present, below)
        x = x * s_l                                                       s_l = layer_output_scale (if present)
    logits = cap * tanh(W_out RMSNorm(x; output_norm) / cap)              cap = final_logit_softcapping

Facts from llama.cpp src/models/gemma4.cpp (load_arch_hparams, load_arch_tensors, the graph),
src/llama-hparams.cpp and the converter (conversion/gemma.py Gemma4Model):
- Norm weights are stored as they are (Gemma4Model.norm_shift = 0: HF Gemma4RMSNorm is x * w, not
  gemma3's x * (1 + w)). q/k norms are per head ((Dh_l,) weights); v gets an RMSNorm without a
  weight (ggml_rms_norm; HF v_norm with_scale=False).
- `attention.sliding_window_pattern` is an array, one bool per layer (true: sliding window of
  `attention.sliding_window`, LLAMA_SWA_TYPE_STANDARD: a query at p sees p - W < j <= p).
- Head sizes: `attention.key_length` for the global layers, `attention.key_length_swa` for the
  window layers (llama.cpp requires key == value length for each kind, and so does minfer).
  `attention.head_count_kv` may be an array (the 31B: 16 on window layers, 4 on global ones).
- RoPE is NEOX. Window layers: base `rope.freq_base_swa`, `rope.dimension_count_swa` dims. Global
  layers: base `rope.freq_base`, all Dh dims with the per-frequency divisors `rope_freqs.weight`
  (the converter writes 1 for the rotated quarter and 1e30 for the rest: HF's "proportional"
  rope, partial_rotary_factor 0.25).
- The attention scale is 1.0 (hparams.f_attention_scale = 1; HF scaling = 1.0).
- No v projection (attn_v absent, HF attention_k_eq_v): V is the k projection before the k
  norm and rope, RMS-normed (gemma4.cpp: `Vcur = wv ? wv*cur : Kcur`).
- `blk.N.layer_output_scale.weight` (1 value, optional) multiplies the layer's output.
- FFN: GELU (tanh approximation), gate * up; final_logit_softcapping optional. feed_forward_length
  may be an array (HF use_double_wide_mlp: twice the width on the shared-KV layers).
- Shared KV (`attention.shared_kv_layers` = S > 0): the last S layers compute q only and attend
  over the cache of an earlier layer, llama.cpp's reuse rule (llama-model.cpp, GEMMA3N/GEMMA4):
  layer n_kv - 2 for a window layer, n_kv - 1 for a global one (n_kv = L - S). HF's rule is the
  last earlier layer of the same kind (Gemma4TextConfig.kv_sharing_modes); a file where the two
  differ is refused by the key. Their k/v tensors are not required (gemma4.cpp: kv_flags).
- Per-layer embeddings (`embedding_length_per_layer_input` = P > 0; gemma4.cpp
  build_inp_per_layer / project_per_layer_inputs and the per-layer block):
      ple = (RMSNorm((W_plm x_0) / sqrt(D); per_layer_proj_norm) + E_pl[tokens] * sqrt(P)) / sqrt(2)
  per_layer_model_proj W_plm (L*P, D), per_layer_token_embd E_pl (V, L*P), both (T, L, P) per
  token; x_0 the scaled embedding. After each layer's FFN residual:
      x = x + RMSNorm(W_proj(gelu_tanh(W_inp_gate x) * ple[:, l]); post_norm)
  blk.N.inp_gate (P, D), blk.N.proj (D, P), blk.N.post_norm (D,).

The KV cache has per-layer geometry (runtime/kv_cache.py kv_layers, declared by the config this
class builds: with_kv_layers below, cache_config): each layer that owns a cache holds its own (Hkv_l, Dh_l, Dh_l), a
shared-KV layer none (it attends over its source layer's). No padding, no repeated heads: the
bytes per position are sum over owning layers of Hkv_l * 2 * Dh_l * elem, what llama.cpp's
per-layer cache holds for the same positions (llama.cpp's window layers keep only the last
window + ubatch positions; minfer keeps every position on every layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from minfer import ops
from minfer.config import ModelConfig, RopeConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma3 import Gemma3Model
from minfer.models.gemma4_moe import load_moe, moe_branch
from minfer.models.layers import Block, head_norm
from minfer.weights import load_qweight, load_vector


def _key(gf, arch: str, suffix: str, default=None):
    key = f"{arch}.{suffix}"
    if key in gf.metadata:
        return gf.metadata[key]
    if default is None:
        raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the {arch} model)")
    return default


@dataclass(frozen=True)
class KVLayersConfig(ModelConfig):
    """A ModelConfig that declares per-layer cache geometry (runtime/kv_cache.py reads kv_layers):
    kv_layers[l] = (Hkv_l, Dk_l, Dv_l), or None where layer l owns no cache. n_kv_heads / head_dim
    stay the largest."""

    kv_layers: tuple = ()


def with_kv_layers(cfg: ModelConfig, layers) -> KVLayersConfig:
    """cfg with per-layer cache geometry (one entry per layer: (Hkv, Dk, Dv) or None)."""
    layers = tuple(None if g is None else tuple(int(x) for x in g) for g in layers)
    if len(layers) != cfg.n_layers or all(g is None for g in layers):
        raise MinferError(f"kv_layers: {len(layers)} entries for {cfg.n_layers} layers, at least one with a cache")
    return KVLayersConfig(**{f.name: getattr(cfg, f.name) for f in fields(ModelConfig)}, kv_layers=layers)


class Gemma4Model(Gemma3Model):
    arch = "gemma4"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_GEMMA4 -> NEOX
    qk_norm = True
    per_layer_counts = True   # head_count_kv / feed_forward_length may be arrays (ModelConfig)

    @staticmethod
    def local_layers(gf, cfg: ModelConfig) -> tuple[tuple, int]:
        """(per layer: whether it is a sliding-window layer, the window) from sliding_window_pattern (one bool
        per layer) and sliding_window, refused by the key when either does not fit."""
        arch, L = cfg.arch, cfg.n_layers
        pattern = _key(gf, arch, "attention.sliding_window_pattern")
        if not isinstance(pattern, list) or len(pattern) < L:
            raise MinferError(f"{gf.path}: {arch}.attention.sliding_window_pattern: expected one bool per layer ({L})")
        is_local = tuple(bool(p) for p in pattern[:L])
        window = int(_key(gf, arch, "attention.sliding_window"))
        if window <= 0 and any(is_local):
            raise MinferError(f"{gf.path}: {arch}.attention.sliding_window={window} with sliding-window layers")
        return is_local, window

    @classmethod
    def layer_geometry(cls, gf, cfg: ModelConfig) -> dict:
        """Per-layer kinds and sizes from the metadata (refusing what minfer does not run, by name)."""
        arch, L = cfg.arch, cfg.n_layers
        is_local, window = cls.local_layers(gf, cfg)
        dh_global = int(_key(gf, arch, "attention.key_length"))
        dh_swa = int(_key(gf, arch, "attention.key_length_swa"))
        for suffix, k in (("attention.value_length", dh_global), ("attention.value_length_swa", dh_swa)):
            if int(_key(gf, arch, suffix, k)) != k:
                raise MinferError(f"{gf.path}: {arch}.{suffix}={_key(gf, arch, suffix)} differs from the key length {k} "
                                  "(llama.cpp requires them equal)")
        if dh_swa > dh_global:
            raise MinferError(f"{gf.path}: {arch}.attention.key_length_swa={dh_swa} exceeds key_length={dh_global}")
        kv = cfg.kv_heads_per_layer or (cfg.n_kv_heads,) * L   # each divides head_count (ModelConfig)
        n_rot_swa = int(_key(gf, arch, "rope.dimension_count_swa", dh_swa))
        if not 0 < n_rot_swa <= dh_swa or n_rot_swa % 2:
            raise MinferError(f"{gf.path}: {arch}.rope.dimension_count_swa={n_rot_swa}: expected an even number "
                              f"of dims, at most key_length_swa {dh_swa}")
        if cfg.rope.n_rot != dh_global:
            raise MinferError(f"{gf.path}: {arch}.rope.dimension_count={cfg.rope.n_rot}: expected key_length "
                              f"{dh_global} (the global layers rotate every dim, rope_freqs.weight masks the rest)")
        if any(not loc for loc in is_local) and cfg.rope.freq_factors is None:
            raise MinferError(f"{gf.path}: tensor 'rope_freqs.weight' is missing (the global layers' proportional "
                              "rope factors)")
        kv_source = cls.shared_kv_sources(gf, arch, is_local)
        rope_swa = RopeConfig(theta=float(_key(gf, arch, "rope.freq_base_swa", 10000.0)), style="neox",
                              n_rot=n_rot_swa)
        return dict(is_local=is_local, window=window, head_dims=tuple(dh_swa if loc else dh_global for loc in is_local),
                    kv_heads=tuple(kv), layer_rope=[rope_swa if loc else cfg.rope for loc in is_local],
                    kv_source=kv_source)

    @staticmethod
    def kv_layers_of(geo: dict) -> tuple:
        """The cache geometry per layer: (Hkv_l, Dh_l, Dh_l) where the layer owns its cache, None
        for a shared-KV layer."""
        return tuple((geo["kv_heads"][i], geo["head_dims"][i], geo["head_dims"][i]) if src == i else None
                     for i, src in enumerate(geo["kv_source"]))

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig):
        """cfg with the per-layer cache geometry the model's caches are built with (the memory
        preflight's config, commands/preflight.py: its bytes are the allocation's)."""
        return with_kv_layers(cfg, cls.kv_layers_of(cls.layer_geometry(gf, cfg)))

    @staticmethod
    def shared_kv_sources(gf, arch: str, is_local: tuple) -> list[int]:
        """The layer whose cache each layer attends over: itself, or for the last shared_kv_layers
        layers llama.cpp's reuse choice, checked against HF's (the last earlier layer of that kind)."""
        L = len(is_local)
        key = f"{arch}.attention.shared_kv_layers"
        S = int(gf.metadata.get(key, 0) or 0)
        if S < 0 or L - 2 < S:
            raise MinferError(f"{gf.path}: {key}={S} with {L} layers: expected 0, or at most {L - 2} "
                              "(llama.cpp needs two layers with their own cache)")
        n_kv = L - S
        out = list(range(L))
        for i in range(n_kv, L):
            src = n_kv - (2 if is_local[i] else 1)                      # llama.cpp's layer_reuse_cb
            hf = next((j for j in range(n_kv - 1, -1, -1) if is_local[j] == is_local[i]), None)
            if src != hf:
                raise MinferError(f"{gf.path}: {key}={S}: layer {i} would reuse layer {src}'s cache (llama.cpp) "
                                  f"but {hf}'s is the last of its kind (HF); such a layer pattern is not supported")
            out[i] = src
        return out

    @classmethod
    def check_supported(cls, gf, cfg: ModelConfig) -> None:
        """The forms this class does not run, refused by the key or tensor that asks for them."""
        if any(n.endswith("attn_qkv.weight") for n in gf.tensors):
            raise MinferError(f"{gf.path}: tensor 'blk.N.attn_qkv.weight' (fused q/k/v) is not supported for gemma4")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Gemma4Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        cls.check_supported(gf, cfg)
        geo = cls.layer_geometry(gf, cfg)
        cls._loading_geometry = geo          # read by load_block (called from LlamaModel.from_gguf)
        try:
            m = super(Gemma3Model, cls).from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress,
                                                  act_dtype=act_dtype)
        finally:
            del cls._loading_geometry
        m.cfg = with_kv_layers(m.cfg, cls.kv_layers_of(geo))     # the caches' per-layer geometry
        c, D = m.cfg, m.cfg.d_model
        for k, v in geo.items():
            setattr(m, k, v)
        m.post_attention_norm = [load_vector(gf, f"blk.{i}.post_attention_norm.weight", device, D)
                                 for i in range(c.n_layers)]
        m.post_ffw_norm = [load_vector(gf, f"blk.{i}.post_ffw_norm.weight", device, D) for i in range(c.n_layers)]
        m.out_scale = [float(load_vector(gf, f"blk.{i}.layer_output_scale.weight", "cpu", 1)[0])
                       if f"blk.{i}.layer_output_scale.weight" in gf.tensors else None for i in range(c.n_layers)]
        m.attn_softcap = 0.0
        m.final_softcap = c.final_logit_softcap or 0.0
        m.embed_scale = math.sqrt(D)
        cls.load_per_layer_embeddings(m, gf, device, dtype)
        m.moe = [load_moe(gf, c, i, device, dtype) for i in range(c.n_layers)]
        m.attn_scale = 1.0          # the scores' factor (not 1/sqrt(Dh)), passed to cache.attend(scale=)
        m.v_norm_ones = {dh: torch.ones(dh, device=device) for dh in set(geo["head_dims"])}
        return m

    @classmethod
    def load_per_layer_embeddings(cls, m, gf, device, dtype) -> None:
        """m.ple_dim (P; 0: none) and, when P > 0, the tables and each block's gate / projection / norm."""
        c, D = m.cfg, m.cfg.d_model
        P = int(gf.metadata.get(f"{c.arch}.embedding_length_per_layer_input", 0) or 0)
        m.ple_dim, L = P, c.n_layers
        m.ple_token_embd = m.ple_model_proj = m.ple_proj_norm = None
        m.ple_gate, m.ple_proj, m.ple_post_norm = [None] * L, [None] * L, [None] * L
        if not P:
            return
        # only gathered row by row: kept in the file's blocks, as an untied token_embd
        m.ple_token_embd = load_qweight(gf, "per_layer_token_embd.weight", device, (c.vocab, L * P), dense=False,
                                        dtype=dtype)
        m.ple_model_proj = load_qweight(gf, "per_layer_model_proj.weight", device, (L * P, D), dtype=dtype)
        m.ple_proj_norm = load_vector(gf, "per_layer_proj_norm.weight", device, P)
        for i in range(L):
            m.ple_gate[i] = load_qweight(gf, f"blk.{i}.inp_gate.weight", device, (P, D), dtype=dtype)
            m.ple_proj[i] = load_qweight(gf, f"blk.{i}.proj.weight", device, (D, P), dtype=dtype)
            m.ple_post_norm[i] = load_vector(gf, f"blk.{i}.post_norm.weight", device, D)

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        geo = cls._loading_geometry
        p, D, F = f"blk.{i}.", cfg.d_model, (cfg.ffn_per_layer[i] if cfg.ffn_per_layer else cfg.ffn)
        Dh, Hkv = geo["head_dims"][i], geo["kv_heads"][i]
        q_out, kv_out = cfg.n_heads * Dh, Hkv * Dh

        def w(name, shape):
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        own_kv = geo["kv_source"][i] == i              # a shared-KV layer has q (and o) only
        has_v = p + "attn_v.weight" in gf.tensors
        if own_kv and not has_v and geo["is_local"][i]:
            # llama.cpp takes attn_v as optional on every layer; HF uses k as v on global layers only
            # (use_alternative_attention = attention_k_eq_v and not is_sliding): a window layer
            # without it is a damaged file, not a form of the model
            raise MinferError(f"{gf.path}: tensor '{p}attn_v.weight' is missing (a sliding-window layer has its own "
                              "v projection; only global layers use k as v)")
        return Block(
            attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
            attn_q=w("attn_q", (q_out, D)),
            attn_k=w("attn_k", (kv_out, D)) if own_kv else None,
            # absent: the k projection serves as v (HF attention_k_eq_v; gemma4.cpp TENSOR_NOT_REQUIRED)
            attn_v=w("attn_v", (kv_out, D)) if own_kv and has_v else None,
            attn_output=w("attn_output", (D, q_out)),
            ffn_norm=load_vector(gf, p + "ffn_norm.weight", device, D),
            ffn_gate=w("ffn_gate", (F, D)),
            ffn_up=w("ffn_up", (F, D)),
            ffn_down=w("ffn_down", (D, F)),
            attn_q_norm=load_vector(gf, p + "attn_q_norm.weight", device, Dh),
            attn_k_norm=load_vector(gf, p + "attn_k_norm.weight", device, Dh) if own_kv else None,
        )

    def linear_groups(self) -> list[tuple]:
        return [tuple(w for w in (b.attn_q, b.attn_k, b.attn_v) if w is not None) for b in self.blocks]

    def qweights(self) -> list:
        extra = [w for w in (self.ple_model_proj, *self.ple_gate, *self.ple_proj) if w is not None]
        extra += [w for moe in self.moe if moe is not None for w in moe.matrices()]
        return super().qweights() + extra + ([self.ple_token_embd] if self.ple_token_embd is not None else [])

    def head_weights(self) -> list:
        return super().head_weights() + ([self.ple_token_embd] if self.ple_token_embd is not None else [])

    # ---- the forward ----

    def _kv(self, h: torch.Tensor, blk: Block, i: int, step: Step, ctx) -> tuple:
        """Layer i's rotated, normed keys and normed values (T, Hkv_l, Dh_l)."""
        T, Dh, Hkv, eps = h.shape[0], self.head_dims[i], self.kv_heads[i], self.cfg.rms_eps
        if blk.attn_v is None:
            k = ops.linear(h, blk.attn_k, None, ctx)
            v = k
        else:
            k, v = ops.linear_many(h, (blk.attn_k, blk.attn_v), (None, None), ctx)
        k = ops.rope(head_norm(k.view(T, Hkv, Dh), blk.attn_k_norm, eps), step.positions, self.layer_rope[i])
        v = head_norm(v.view(T, Hkv, Dh), self.v_norm_ones[Dh].to(v.dtype), eps)
        return k, v

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, D) normed input -> W_o attn(...) (T, D) at scale 1, this layer's head size, rope and window."""
        c = self.cfg
        T, H, Dh = h.shape[0], c.n_heads, self.head_dims[i]
        q = ops.linear(h, blk.attn_q, None, ctx).view(T, H, Dh)
        q = ops.rope(head_norm(q, blk.attn_q_norm, c.rms_eps), step.positions, self.layer_rope[i])
        src = self.kv_source[i]
        if src == i:
            k, v = self._kv(h, blk, i, step, ctx)
            cache.write(i, k, v, step)
        o = cache.attend(src, q, step, ctx, window=self.window if self.is_local[i] else 0, scale=self.attn_scale)
        return ops.linear(o.reshape(T, H * Dh), blk.attn_output, None, ctx)

    def _per_layer_inputs(self, tokens: torch.Tensor, x0: torch.Tensor, ctx):
        """The per-layer embeddings (T, L, P) float32 of the tokens and their scaled embedding x0 (T, D);
        None without them."""
        if not self.ple_dim:
            return None
        T, L, P, eps = tokens.shape[0], self.cfg.n_layers, self.ple_dim, self.cfg.rms_eps
        proj = ops.linear(x0.to(self.act_dtype), self.ple_model_proj, None, ctx).float() / math.sqrt(self.cfg.d_model)
        proj = ops.rms_norm(proj.reshape(T * L, P), self.ple_proj_norm, eps).view(T, L, P)
        tok = ops.embedding(tokens, self.ple_token_embd).view(T, L, P) * math.sqrt(P)
        return (proj + tok) * (1.0 / math.sqrt(2.0))

    def _per_layer_branch(self, x: torch.Tensor, i: int, ple, ctx) -> torch.Tensor:
        """x + RMSNorm(W_proj(gelu_tanh(W_inp_gate x) * ple[:, i]); post_norm) (gemma4.cpp's per-layer block)."""
        if ple is None:
            return x
        g = ops.linear(x.to(self.act_dtype), self.ple_gate[i], None, ctx)
        g = ops.geglu(g, ple[:, i].contiguous().to(g.dtype))
        y = ops.linear(g, self.ple_proj[i], None, ctx).float()
        return x + ops.rms_norm(y, self.ple_post_norm[i], self.cfg.rms_eps)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd) * self.embed_scale        # (T, D) float32
        ple = self._per_layer_inputs(tokens, x, ctx)
        for i, blk in enumerate(self.blocks):
            h = ops.rms_norm(x, blk.attn_norm, eps).to(act)
            x = x + ops.rms_norm(self._attention(h, blk, i, cache, step, ctx).float(), self.post_attention_norm[i], eps)
            h = ops.rms_norm(x, blk.ffn_norm, eps).to(act)
            gate, up = ops.linear_many(h, (blk.ffn_gate, blk.ffn_up), (None, None), ctx)
            f = ops.linear(ops.geglu(gate, up), blk.ffn_down, None, ctx)
            f = f.float()
            moe = self.moe[i]
            if moe is not None:     # the MLP and the experts side by side on the attention's residual
                f = ops.rms_norm(f, moe.post_norm_1, eps) + moe_branch(x, moe, self.cfg.n_experts_used,
                                                                       self.cfg.expert_ffn, eps, ctx, act)
            x = x + ops.rms_norm(f, self.post_ffw_norm[i], eps)
            x = self._per_layer_branch(x, i, ple, ctx)
            if self.out_scale[i] is not None:
                x = x * self.out_scale[i]
        h = ops.rms_norm(step.rows(x), self.output_norm, eps).to(act)        # (R, D)
        logits = self.head(h, ctx)
        cap = self.final_softcap
        if cap:
            logits = cap * torch.tanh(logits / cap)
        return logits
