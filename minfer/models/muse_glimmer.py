"""Muse Glimmer's language model (HF MuseGlimmerForConditionalGeneration, text only; llama.cpp
LLM_ARCH_MUSE_GLIMMER): the GGUF arch `muse-glimmer`.

    x_0 = RMSNorm(E[tokens])                                  no weight; token_embd (V, D), output (V, D)
    for each layer l:
        h = n(x)                                              n = RMSNorm(attn_norm)
        q, k = qn(W_q h), kn(W_k h)                           qn, kn: RMSNorm of each head (Dh,)
        o = attn_l(r_l(q), r_l(k), W_v h) * sigmoid(W_g h)    attn_gate (H*Dh, D), per element
        x = x + pn(W_o o)                                     pn = RMSNorm(post_attention_norm), eps 1e-8
        x = x + pn'(ffn(n'(x)))                               n' = RMSNorm(ffn_norm), pn' = post_ffw_norm, 1e-8
    logits = W_out RMSNorm(x; output_norm) * logit_scale      then cap * tanh(logits / cap) when cap > 0

Each rule and its source (llama.cpp src/models/muse-glimmer.cpp: load_arch_hparams, load_arch_tensors,
the graph; conversion/muse_glimmer.py MuseGlimmerModel; HF transformers models/muse_glimmer/
modeling_muse_glimmer.py):
- The embeddings go through an RMSNorm without a weight (graph: build_norm(inpL, nullptr, ...) with
  attention.layer_norm_rms_epsilon; HF MuseGlimmerTextNormedEmbedding, eps rms_norm_eps).
- Four norms a layer, all plain RMSNorms with weights: HF's centered (1 + w) norms are stored as 1 + w by
  the converter (norm_shift on `*layernorm.weight`; the final norm is HF's plain x * w and stays as is).
  The pre-norms (attn_norm, ffn_norm) and the final one take attention.layer_norm_rms_epsilon; the post-norms
  (post_attention_norm, post_ffw_norm) take 1e-8, a constant of the graph (post_norm_eps) that no key
  carries (HF config.post_norm_eps, default 1e-8: a config with another value converts to a file that
  llama.cpp, and this model, run at 1e-8).
- q/k RMSNorm per head, required (attn_q_norm / attn_k_norm flag 0), before rope: the converter writes
  attn_q_norm as qk_scale_factor everywhere and attn_k_norm as ones (HF: a scaleless norm, q times
  qk_scale_factor). Attention scale 1/sqrt(head_dim).
- q/k/v biases when present (create_tensor_qkv: TENSOR_NOT_REQUIRED; HF attention_bias); attn_output
  has no bias (the loader creates none: a file with one is refused here, as llama.cpp's tensor count
  check would); a fused attn_qkv is refused by name (the converter writes attn_q / attn_k / attn_v).
- The gate: sigmoid(W_g h), h the attn_norm output (attn_gate, required; HF self_attn.gate_proj of the
  normed input), times the attention's merged heads per element, before W_o.
- The window: attention.sliding_window W, required (get_key without a default), > 0 here; the layers
  attention.sliding_window_pattern marks (one flag per layer, as the converter writes it from HF's
  layer_types, or a period P: local when l % P < P - 1; absent: load_swa_pattern(ml, 4)) see keys
  p - W < j <= p (LLAMA_SWA_TYPE_STANDARD; HF's sliding-window mask on its sliding_attention layers).
- Rope only on the window layers (graph: use_rope = hparams.is_swa(il)), NoPE on the others. HF rotates
  the layers whose layer_rope_theta is nonzero, which by default are the same layers (the converter
  writes no layer_rope_theta: a config whose zeros differ from its layer_types runs differently in HF).
  NORM style (llama_model_rope_type: LLM_ARCH_MUSE_GLIMMER -> NORM; the converter unpermutes HF's
  rotate_half q/k rows), at rope.freq_base_swa when the key is there, else rope.freq_base (load_arch_hparams
  defaults the SWA base to the global one; HF uses its one rope_theta), freq_scale 1 (the window layers'
  rope_freq_scale_train_swa), no rope factors (the graph passes none): a linear rope scaling or a
  rope_freqs.weight is refused, as something llama.cpp would ignore and HF would apply.
- The logits times logit_scale, required (get_key without a default; HF output_multiplier), then
  final_logit_softcapping when the key is there and nonzero (optional; HF always applies it).
- The lm head is output.weight, required (flag 0; HF tie_word_embeddings false in the release): a file
  without it is refused.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.afmoe import AfmoeModel
from minfer.models.base import Step
from minfer.models.gemma3 import swa_layers
from minfer.models.layers import (Block, BlockTensors, ffn_branch, head_norm, merge_heads, require_output,
                                  rope_write_attend)
from minfer.models.llama import LlamaModel
from minfer.weights import QWeight, load_qweight, load_vector

DEFAULT_SWA_PATTERN = 4     # llama_model_muse_glimmer::load_arch_hparams: load_swa_pattern(ml, 4)
POST_NORM_EPS = 1e-8        # muse-glimmer.cpp: post_norm_eps, the post-attention / post-FFN norms' epsilon


class MuseGlimmerModel(LlamaModel):
    arch = "muse-glimmer"
    rope_style = "normal"       # llama_model_rope_type: LLM_ARCH_MUSE_GLIMMER -> NORM
    qk_norm = True

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "MuseGlimmerModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a, md = cls.arch, gf.metadata
        for key in (f"{a}.logit_scale", f"{a}.attention.sliding_window"):   # load_arch_hparams: get_key, required
            if key not in md:
                raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the {a} model)")
        scale = md[f"{a}.logit_scale"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(float(scale)):
            raise MinferError(f"{gf.path}: metadata key '{a}.logit_scale' is {scale!r}, expected a finite number")
        if cfg.sliding_window <= 0:
            raise MinferError(f"{gf.path}: metadata key '{a}.attention.sliding_window' is "
                              f"{md[f'{a}.attention.sliding_window']}, expected a window > 0")
        if "rope_freqs.weight" in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'rope_freqs.weight' is not supported for {a} (llama.cpp's graph "
                              "passes no rope factors and its loader does not take the tensor)")
        if cfg.rope.freq_scale != 1.0:
            raise MinferError(f"{gf.path}: {a}.rope.scaling.type '{md.get(f'{a}.rope.scaling.type', 'linear')}' "
                              f"(freq_scale {cfg.rope.freq_scale:g}) is not supported for {a}: llama.cpp's graph "
                              "rotates the window layers at the SWA scale 1, HF would scale")
        for i in range(cfg.n_layers):
            for t, why in (("attn_qkv.weight", "a fused q/k/v: the converter writes attn_q / attn_k / attn_v"),
                           ("attn_output.bias", "llama.cpp's loader takes no o-projection bias")):
                if f"blk.{i}.{t}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{t}' is not supported for {a} ({why})")
        require_output(gf, cfg, a)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        D, q_out = cfg.d_model, cfg.n_heads * cfg.head_dim
        m.attn_gate = [load_qweight(gf, f"blk.{i}.attn_gate.weight", device, (q_out, D), dtype=dtype)
                       for i in range(cfg.n_layers)]                                        # (H*Dh, D) each
        m.attn_post_norm = [load_vector(gf, f"blk.{i}.post_attention_norm.weight", device, D)
                            for i in range(cfg.n_layers)]                                   # (D,) each
        m.ffn_post_norm = [load_vector(gf, f"blk.{i}.post_ffw_norm.weight", device, D) for i in range(cfg.n_layers)]
        pattern = cfg.swa_pattern if cfg.swa_pattern is not None else DEFAULT_SWA_PATTERN
        m.window, m.is_local = cfg.sliding_window, swa_layers(cfg.n_layers, cfg.sliding_window, pattern)
        m.use_rope = m.is_local                 # the graph's use_rope = hparams.is_swa(il)
        m.rope_local = replace(cfg.rope, theta=float(md.get(f"{a}.rope.freq_base_swa", cfg.rope.theta)))
        m.embd_norm = torch.ones(D, dtype=torch.float32, device=device)     # the weight-less embedding norm
        m.post_eps = POST_NORM_EPS
        m.logit_scale = float(scale)
        m.final_softcap = cfg.final_logit_softcap or 0.0
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        """blk.i's weights: Llama's with the q/k norms (required) and q/k/v biases when present."""
        t = BlockTensors(gf, cfg, i, device, dtype)
        D, F, Dh, q_out, kv_out = t.D, t.F, t.Dh, t.q_out, t.kv_out
        return Block(attn_norm=t.v("attn_norm.weight", D), attn_q=t.w("attn_q", (q_out, D)),
                     attn_k=t.w("attn_k", (kv_out, D)), attn_v=t.w("attn_v", (kv_out, D)),
                     attn_output=t.w("attn_output", (D, q_out)), ffn_norm=t.v("ffn_norm.weight", D),
                     ffn_gate=t.w("ffn_gate", (F, D)), ffn_up=t.w("ffn_up", (F, D)), ffn_down=t.w("ffn_down", (D, F)),
                     attn_q_bias=t.opt("attn_q.bias", q_out), attn_k_bias=t.opt("attn_k.bias", kv_out),
                     attn_v_bias=t.opt("attn_v.bias", kv_out),
                     attn_q_norm=t.v("attn_q_norm.weight", Dh), attn_k_norm=t.v("attn_k_norm.weight", Dh))

    def layer_matrices(self, i: int) -> list[QWeight]:
        return [self.attn_gate[i]]

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o (attn(...) * sigmoid(W_g h)) (T, D): per-head q/k norms, rope and
        the window on a local layer, neither on a global one."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v),
                                  (blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias), ctx)
        gate = ops.linear(h, self.attn_gate[i], None, ctx)                       # (T, H*Dh)
        q = head_norm(q.view(T, H, Dh), blk.attn_q_norm, c.rms_eps)
        k = head_norm(k.view(T, Hkv, Dh), blk.attn_k_norm, c.rms_eps)
        v = v.view(T, Hkv, Dh)
        window = self.window if self.is_local[i] else 0
        o = rope_write_attend(cache, i, q, k, v, step, self.rope_local if self.use_rope[i] else None, ctx,
                              window=window)                                   # (T, H, Dh)
        return ops.linear(self.gated(merge_heads(o), gate).to(h.dtype), blk.attn_output, None, ctx)

    # the attention's merged heads (T, H*Dh) times sigmoid of the gate projection, per element, float32: afmoe's
    gated = staticmethod(AfmoeModel.gated)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, peps = self.act_dtype, self.cfg.rms_eps, self.post_eps
        x = ops.rms_norm(ops.embedding(tokens, self.token_embd), self.embd_norm, eps)   # (T, D) float32
        for i, blk in enumerate(self.blocks):
            h = ops.rms_norm(x, blk.attn_norm, eps).to(act)
            a = ops.rms_norm(self._attention(h, blk, i, cache, step, ctx).float(), self.attn_post_norm[i], peps)
            x, h = ops.add_rms_norm(x, a, blk.ffn_norm, eps, act, ctx)
            x = x + ops.rms_norm(ffn_branch(h, blk, ctx).float(), self.ffn_post_norm[i], peps)
        h = ops.rms_norm(step.rows(x), self.output_norm, eps).to(act)               # (R, D)
        logits = self.head(h, ctx) * self.logit_scale   # (R, V)
        cap = self.final_softcap
        if cap:
            logits = cap * torch.tanh(logits / cap)
        return logits
