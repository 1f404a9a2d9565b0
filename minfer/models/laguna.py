"""poolside Laguna (HF LagunaForCausalLM: Laguna-XS.2, Laguna-S.2, Laguna-M.1): the GGUF arch `laguna`.

    x_0 = E[tokens]                                                     token_embd (V, D); output (V, D) or tied
    for each layer l:
        h = n(x)                                                        n = RMSNorm(attn_norm)
        q, k = r_l(qn(W_q h)), r_l(kn(W_k h))                           H_l query heads, Hkv kv heads, qn/kn per head
        o = attn_l(q, k, W_v h) * softplus(W_g h)                       attn_gate: per head (H_l) or per element
        x = x + W_o o
        h = n'(x)                                                       n' = RMSNorm(ffn_norm)
        x = x + W_down(silu(W_gate h) * W_up h)                         l < leading_dense_block_count
        x = x + moe(h) + W_down_s(silu(W_gate_s h) * W_up_s h)          the other layers
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/laguna.cpp: load_arch_hparams, load_arch_tensors, the graph;
conversion/laguna.py LagunaModel; HF transformers models/laguna: LagunaAttention, LagunaTopKRouter,
LagunaSparseMoeBlock, LagunaRotaryEmbedding):
- Query heads per layer: attention.head_count may be an array (HF num_attention_heads_per_layer: XS.2 has 48 on
  full and 64 on sliding layers; hparams.n_head(il)); kv heads head_count_kv (a count or an array), each layer's
  query count a multiple of it. One head size (key_length == value_length: the graph asserts it). Scale
  1/sqrt(head size). q/k/v without biases (the converter writes none; any is refused by name).
- Per-head q/k RMSNorm (required) before rope.
- The window: attention.sliding_window W (optional; absent or 0: no window, swa_type NONE, M.1); the local layers
  by attention.sliding_window_pattern (flags, or an integer P) or load_swa_pattern(ml, 4, dense_first = true):
  l local when l % 4 != 0 (the converter writes no pattern; XS.2's layer_types are that layout). A local layer's
  query at p sees keys p - W < j <= p.
- Rope, NEOX (llama_model_rope_type: LLM_ARCH_LAGUNA -> NEOX) per layer type: full layers rotate the first
  rope.dimension_count dims (HF partial_rotary_factor 0.5 of the full_attention rope) with rope.freq_base and the
  file's linear scale; local layers rope.dimension_count_swa dims (absent: rope.dimension_count) with
  rope.freq_base_swa (absent: freq_base), unscaled (laguna.cpp: freq_scale 1, ext_factor 0, attn_factor 1 there).
  YaRN on the full layers (XS.2's release: rope.scaling.type yarn, factor, original_context_length,
  yarn_beta_fast/slow from HF's full_attention rope): gpt_oss.yarn_rope's divisors over the rotated dims with the
  correction range floored / ceiled (ggml_rope_yarn_corr_dims; HF truncate), and mscale = (1 + 0.1 ln factor) *
  rope.scaling.attn_factor on the rotated dims only (ggml scales the rotated pairs, the pass-through dims are
  copied; HF multiplies cos and sin, which touch only q[..., :rot]): here the rotated dims of q times mscale^2.
- The gate: softplus(W_g h) of the attention's input, W_g = blk.N.attn_gate.weight (required) of H_l rows (one
  gate per head, broadcast over its dims: HF gating true / "per-head") or H_l * head size rows (per element: HF
  "per-element", M.1); any other width is refused by name (the loader's GGML_ABORT). It multiplies the attention's
  output before W_o.
- The first leading_dense_block_count layers (required key) a SwiGLU MLP of feed_forward_length; the others the
  MoE through ops.moe_ffn (glm4moe.py's): scores by expert_gating_func (absent: sigmoid, laguna.cpp's default),
  the choice on score + exp_probs_b.bias (required), renormalized when expert_weights_norm (the converter writes
  true: HF always), times expert_weights_scale (HF moe_routed_scaling_factor), expert groups when the file has
  expert_group_count > 1; plus the always-on shared SwiGLU expert (required) of expert_shared_feed_forward_length
  (absent or 0: expert_feed_forward_length x expert_shared_count, the count 1 when absent), added.
HF options with no GGUF key (the converter drops them, llama.cpp's graph has neither): moe_router_logit_softcapping
> 0 and moe_apply_router_weight_on_input; a checkpoint using them would run without them here as in llama.cpp.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma4 import with_kv_layers
from minfer.models.glm4moe import Glm4MoeModel, load_moe_layer
from minfer.models.layers import Block, head_norm, load_head, rope_write_attend
from minfer.weights import QWeight, load_qweight, load_vector

DEFAULT_SWA_PATTERN = 4     # llama_model_laguna::load_arch_hparams: load_swa_pattern(ml, 4, dense_first = true)


class LagunaModel(Glm4MoeModel):
    arch = "laguna"
    rope_style = "neox"                 # llama_model_rope_type: LLM_ARCH_LAGUNA -> NEOX
    per_layer_counts = True             # head_count / head_count_kv may be arrays (ModelConfig)
    expert_gatings = ("sigmoid", "softmax")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "LagunaModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a, md = cls.arch, gf.metadata
        geo = cls.geometry(gf, cfg)
        cfg = replace(cfg, expert_gating=cfg.expert_gating if f"{a}.expert_gating_func" in md else "sigmoid")
        L, D, Dh, heads, kv = cfg.n_layers, cfg.d_model, cfg.head_dim, geo["heads"], geo["kv_heads"]
        for key in ("leading_dense_block_count", "expert_count", "expert_used_count", "expert_feed_forward_length"):
            if f"{a}.{key}" not in md:
                raise MinferError(f"{gf.path}: metadata key '{a}.{key}' is missing (needed to build the {a} model)")
        E, Fe, lead = cfg.n_experts, cfg.expert_ffn, cfg.leading_dense_blocks
        if E <= 0 or not 0 < cfg.n_experts_used <= E or Fe <= 0:
            raise MinferError(f"{gf.path}: {a}.expert_count={E}, expert_used_count={cfg.n_experts_used}, "
                              f"expert_feed_forward_length={Fe}: expected 0 < used <= count and a positive length")
        n_shared = int(md.get(f"{a}.expert_shared_count", 1))
        Fs = cfg.expert_shared_ffn or Fe * n_shared                 # laguna.cpp: n_ff_shexp, else n_ff_exp * count
        if Fs <= 0:
            raise MinferError(f"{gf.path}: {a}.expert_shared_count={n_shared}: the shared expert is always on")
        token_embd = load_qweight(gf, "token_embd.weight", device, (cfg.vocab, D), dense=cfg.tied_output, dtype=dtype)
        blocks, moe, gates = [], [], []
        for i in range(L):
            p, H = f"blk.{i}.", heads[i]
            for t in ("attn_qkv.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"):
                if p + t in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor '{p}{t}' is not supported for {a} (the converter writes "
                                      "separate q/k/v without biases)")

            def w(name, shape):
                return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

            dense = i < lead
            blocks.append(Block(
                attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
                attn_q=w("attn_q", (H * Dh, D)), attn_k=w("attn_k", (kv[i] * Dh, D)),
                attn_v=w("attn_v", (kv[i] * Dh, D)), attn_output=w("attn_output", (D, H * Dh)),
                ffn_norm=load_vector(gf, p + "ffn_norm.weight", device, D),
                ffn_gate=w("ffn_gate", (cfg.ffn, D)) if dense else None,
                ffn_up=w("ffn_up", (cfg.ffn, D)) if dense else None,
                ffn_down=w("ffn_down", (D, cfg.ffn)) if dense else None,
                attn_q_norm=load_vector(gf, p + "attn_q_norm.weight", device, Dh),
                attn_k_norm=load_vector(gf, p + "attn_k_norm.weight", device, Dh)))
            if p + "attn_gate.weight" not in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{p}attn_gate.weight' is missing")
            rows = int(gf.tensor(p + "attn_gate.weight").shape[0])
            if rows not in (H, H * Dh):
                raise MinferError(f"{gf.path}: tensor '{p}attn_gate.weight' has {rows} rows: expected {H} (a gate per "
                                  f"head) or {H * Dh} (per element)")
            gates.append(w("attn_gate", (rows, D)))
            moe.append(None if dense else load_moe_layer(gf, p, E, D, Fe, Fs, device, dtype))
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        m = cls(with_kv_layers(cfg, [(h, Dh, Dh) for h in kv]), token_embd, blocks, output_norm, output,
                act_dtype=act_dtype)
        m.moe, m.attn_gate = moe, gates
        m.weights_norm = bool(cfg.expert_weights_norm)             # llama.cpp: false when the key is absent
        for k, v in geo.items():
            setattr(m, k, v)
        return m

    @classmethod
    def geometry(cls, gf, cfg: ModelConfig) -> dict:
        """heads, kv_heads, is_local, window, rope_local, rope_full (YaRN's divisors when the file has
        rope.scaling.type yarn), q_rot_scale (YaRN's mscale^2 on the full layers' rotated q dims) from the file."""
        a, md, L, Dh = cls.arch, gf.metadata, cfg.n_layers, cfg.head_dim
        Dv = int(md.get(f"{a}.attention.value_length", Dh))
        if Dv != Dh:
            raise MinferError(f"{gf.path}: {a}.attention.value_length={Dv} differs from key_length {Dh} (laguna.cpp "
                              "asserts them equal)")
        if cfg.rope.freq_factors is not None:
            raise MinferError(f"{gf.path}: tensor 'rope_freqs.weight' is not supported for {a} (laguna.cpp passes no "
                              "rope factors)")
        window = cfg.sliding_window
        if window < 0:
            raise MinferError(f"{gf.path}: {a}.attention.sliding_window={window}: expected >= 0")
        pattern = cfg.swa_pattern if cfg.swa_pattern is not None else DEFAULT_SWA_PATTERN
        if window == 0:
            is_local = (False,) * L
        elif isinstance(pattern, (list, tuple)):
            if len(pattern) < L:
                raise MinferError(f"{gf.path}: {a}.attention.sliding_window_pattern has {len(pattern)} entries, "
                                  f"expected one per layer ({L})")
            is_local = tuple(bool(x) for x in pattern[:L])
        else:                       # llama_hparams::set_swa_pattern(P, dense_first = true)
            P = int(pattern)
            is_local = tuple(P == 0 or i % P != 0 for i in range(L))
        n_rot_swa = int(md.get(f"{a}.rope.dimension_count_swa", cfg.rope.n_rot))
        if not 0 < n_rot_swa <= Dh or n_rot_swa % 2:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count_swa={n_rot_swa}: expected an even count <= {Dh}")
        rope_local = replace(cfg.rope, theta=float(md.get(f"{a}.rope.freq_base_swa", cfg.rope.theta)),
                             n_rot=n_rot_swa, freq_scale=1.0)
        rope_full, q_rot_scale = cfg.rope, 1.0
        if md.get(f"{a}.rope.scaling.type") == "yarn":          # XS.2: YaRN on the full layers only
            from minfer.models.gpt_oss import yarn_rope

            rope_full, mscale = yarn_rope(gf, a, cfg.rope, cfg.rope_attn_factor, truncate=True)
            q_rot_scale = mscale * mscale
        heads = cfg.heads_per_layer or (cfg.n_heads,) * L
        kv = cfg.kv_heads_per_layer or (cfg.n_kv_heads,) * L
        return dict(heads=tuple(heads), kv_heads=tuple(kv), is_local=is_local, window=window, rope_local=rope_local,
                    rope_full=rope_full, q_rot_scale=q_rot_scale)

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig):
        """cfg with the caches' per-layer geometry (Hkv_l, Dh, Dh) (the preflight's, commands/preflight.py)."""
        return with_kv_layers(cfg, [(h, cfg.head_dim, cfg.head_dim) for h in cls.geometry(gf, cfg)["kv_heads"]])

    def layer_matrices(self, i: int) -> list[QWeight]:
        return super().layer_matrices(i) + [self.attn_gate[i]]

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Layer i's attention of the normed input h (T, D) -> W_o (attn(...) * softplus(W_g h)) (T, D)."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], self.heads[i], self.kv_heads[i], c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        gate = ops.linear(h, self.attn_gate[i], None, ctx)                       # (T, H) or (T, H*Dh)
        q, k = head_norm(q.view(T, H, Dh), blk.attn_q_norm, c.rms_eps), head_norm(k.view(T, Hkv, Dh),
                                                                                  blk.attn_k_norm, c.rms_eps)
        local = self.is_local[i]
        if not local and self.q_rot_scale != 1.0:   # YaRN's mscale on the rotated dims of q and k: mscale^2 on q's
            n = self.rope_full.n_rot
            q = torch.cat([q[..., :n] * self.q_rot_scale, q[..., n:]], dim=-1)
        o = rope_write_attend(cache, i, q, k, v.view(T, Hkv, Dh), step, self.rope_local if local else self.rope_full,
                              ctx, window=self.window if local else 0)          # (T, H, Dh)
        return ops.linear(self.gated(o, gate).to(h.dtype), blk.attn_output, None, ctx)

    @staticmethod
    def gated(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """The attention's output (T, H, Dh) times softplus of the gate, per head (gate (T, H)) or per element
        (gate (T, H*Dh)), float32 -> (T, H*Dh)."""
        T, H, Dh = o.shape
        g = F.softplus(gate.float())
        if g.shape[1] == H:
            return (o.float() * g.unsqueeze(-1)).reshape(T, H * Dh)
        return o.float().reshape(T, H * Dh) * g
