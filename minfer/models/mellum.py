"""JetBrains Mellum 2 (HF MellumForCausalLM, e.g. Mellum2-12B-A2.5B): the GGUF arch `mellum`.

    x_0 = E[tokens]                                                     token_embd (V, D); output (V, D)
    for each layer l:
        q, k = r_l(qn(W_q n(x))), r_l(kn(W_k n(x)))                     n = RMSNorm(attn_norm); qn, kn per head
        x = x + W_o attn_l(q, k, W_v n(x))                              attn_l: windowed on the local layers
        x = x + moe(n'(x))                                              n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)                              output required (no tied head)

Qwen3-MoE's layer with Gemma-3-style sliding-window layers. Each rule and its source (llama.cpp
src/models/mellum.cpp: load_arch_hparams, load_arch_tensors, the graph; conversion/mellum.py MellumModel; HF
transformers models/mellum: MellumAttention = Qwen3MoeAttention with a per-layer window, MellumSparseMoeBlock =
Qwen3MoeSparseMoeBlock, MellumRotaryEmbedding = LagunaRotaryEmbedding, one rope per layer type):
- Per-head q/k RMSNorm (required) before rope; NEOX rope over the whole head (llama_model_rope_type:
  LLM_ARCH_MELLUM -> NEOX; the graph asserts n_rot == head_dim: a rope.dimension_count other than the head
  size is refused by name); scale 1/sqrt(head_dim); no biases (create_tensor_qkv finds none in the releases;
  any attention bias is refused by name).
- The window: attention.sliding_window W (optional; absent or 0: none, swa_type NONE); the layers
  attention.sliding_window_pattern marks (the converter writes HF layer_types as flags; an integer P: l local
  when l % P < P - 1; absent: load_swa_pattern(ml, 4)) see keys p - W < j <= p (HF
  create_sliding_window_causal_mask on the sliding layers).
- The rope base per layer type: rope.freq_base on the full layers (with the file's linear scale), and
  rope.freq_base_swa (absent: freq_base) unscaled on the local ones -- HF rope_parameters["sliding_attention"],
  which the converter writes as freq_base_swa and llama.cpp's loader reads (rope_freq_base_train_swa). Mellum 2's
  layer-selective YaRN (HF rope_parameters["full_attention"] yarn; the converter writes rope.scaling.{type, factor,
  original_context_length, yarn_beta_fast/slow}): the full layers only (mellum.cpp passes freq_scale, ext_factor,
  attn_factor there and 1 / 0 / 1 on the local ones), gpt_oss.yarn_rope's divisors (ggml's floor / ceil correction
  dims, HF truncate) and mscale = (1 + 0.1 ln factor) * rope.scaling.attn_factor on cos / sin, here q times
  mscale^2 (the whole head rotates). Where
  llama.cpp's graph differs: mellum.cpp rotates the local layers with the context's freq_base, not the SWA base
  it loaded; this follows HF (the two agree when the bases are equal).
- Every layer a MoE (build_moe_ffn; the loader requires ffn_gate_inp on each: HF's "dense" mlp_layer_types
  have no llama.cpp form, their missing router is named): softmax over the router's logits, top
  expert_used_count, the weights always renormalized (the graph's norm_w = true; HF norm_topk_prob), no scale,
  no shared expert; experts of expert_feed_forward_length. A sigmoid expert_gating_func and an
  expert_weights_scale other than 0 / 1 are refused by name (the graph hard-codes softmax and reads no scale).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma3 import swa_layers
from minfer.models.layers import Block, head_norm, merge_heads, rope_write_attend
from minfer.models.qwen3moe import Qwen3MoeModel

DEFAULT_SWA_PATTERN = 4     # llama_model_mellum::load_arch_hparams: load_swa_pattern(ml, 4)


class MellumModel(Qwen3MoeModel):
    arch = "mellum"
    rope_style = "neox"                 # llama_model_rope_type: LLM_ARCH_MELLUM -> NEOX
    qk_norm = True                      # mellum.cpp: attn_q_norm / attn_k_norm flag 0
    weights_norm = True                 # mellum.cpp: build_moe_ffn(..., norm_w = true, ...)
    expert_gatings = ("softmax",)       # mellum.cpp: LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, hard-coded

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "MellumModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a, md = cls.arch, gf.metadata
        for i in range(cfg.n_layers):
            for t in ("attn_qkv.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"):
                if f"blk.{i}.{t}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{t}' is not supported for {a} (the converter "
                                      "writes separate attn_q/attn_k/attn_v without biases)")
        if "output.weight" not in gf.tensors:      # mellum.cpp: output flag 0 (no tied head)
            raise MinferError(f"{gf.path}: tensor 'output.weight' is missing ({a} has no tied head)")
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot}, expected the head size "
                              f"{cfg.head_dim} (mellum.cpp rotates whole heads)")
        if cfg.sliding_window < 0:
            raise MinferError(f"{gf.path}: {a}.attention.sliding_window={cfg.sliding_window}: expected >= 0")
        scale = md.get(f"{a}.expert_weights_scale")
        if scale is not None and float(scale) not in (0.0, 1.0):
            raise MinferError(f"{gf.path}: {a}.expert_weights_scale={scale} is not supported (mellum.cpp applies "
                              "no expert weights scale)")
        pattern = cfg.swa_pattern if cfg.swa_pattern is not None else DEFAULT_SWA_PATTERN
        try:
            is_local = swa_layers(cfg.n_layers, cfg.sliding_window, pattern)
        except MinferError as e:        # swa_layers names gemma3's key
            raise MinferError(f"{gf.path}: {a}.attention.sliding_window_pattern: {e}") from None
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.weights_norm = True           # the graph's norm_w = true, whatever expert_weights_norm says
        m.window, m.is_local = cfg.sliding_window, is_local
        swa_base = float(md.get(f"{a}.rope.freq_base_swa", cfg.rope.theta))
        m.rope_local = replace(cfg.rope, theta=swa_base, freq_scale=1.0)   # the local layers: no rope scaling
        m.rope_full, m.q_scale = cfg.rope, 1.0
        if md.get(f"{a}.rope.scaling.type") == "yarn":          # Mellum 2's layer-selective YaRN: full layers only
            from minfer.models.gpt_oss import yarn_rope

            m.rope_full, mscale = yarn_rope(gf, a, cfg.rope, cfg.rope_attn_factor, truncate=True)
            m.q_scale = mscale * mscale
        return m

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """Layer i's attention of the normed input h (T, D) -> (T, D): per-head q/k norms, the layer type's
        rope, the window on a local layer."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        q, k = head_norm(q.view(T, H, Dh), blk.attn_q_norm, c.rms_eps), head_norm(k.view(T, Hkv, Dh),
                                                                                  blk.attn_k_norm, c.rms_eps)
        local = self.is_local[i]
        if not local and self.q_scale != 1.0:       # YaRN's mscale on q and k (whole-head rope): mscale^2 on q
            q = q * self.q_scale
        o = rope_write_attend(cache, i, q, k, v.view(T, Hkv, Dh), step, self.rope_local if local else self.rope_full,
                              ctx, window=self.window if local else 0)           # (T, H, Dh)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)
