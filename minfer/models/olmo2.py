"""OLMo 2 (and OLMo 3, which llama.cpp's converter also writes as `olmo2`): the GGUF arch `olmo2`.

    x_0 = E[tokens]                                    token_embd (V, D); output (V, D), untied
    for each layer l:
        q = qn(W_q x), k = kn(W_k x), v = W_v x            qn, kn: RMSNorm over the WHOLE projection
        x = x + pn(W_o attn(rope(q), rope(k), v))          pn = RMSNorm(post_attention_norm)
        x = x + fn(W_down(silu(W_gate x) * W_up x))        fn = RMSNorm(post_ffw_norm)
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source:
- Post-norm blocks: no norm before attention or the MLP; the branch outputs are RMS-normalized
  (attn_post_norm, ffn_post_norm) and then added to the residual (llama.cpp src/models/olmo2.cpp
  graph; HF modeling_olmo2.Olmo2DecoderLayer.forward: post_attention_layernorm,
  post_feedforward_layernorm). No blk.N.attn_norm / ffn_norm tensors exist
  (llama_model_olmo2::load_arch_tensors).
- q/k norms over the whole projection, not per head: attn_q_norm is (n_embd,) = (H*Dh,) and
  attn_k_norm (Hkv*Dh,) (load_arch_tensors), applied to Qcur/Kcur before the reshape into heads
  (olmo2.cpp); HF Olmo2Attention: q_norm = Olmo2RMSNorm(num_heads * head_dim) on q_proj's output.
  eps = attention.layer_norm_rms_epsilon for all norms.
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_OLMO2; the converter does not permute q/k), no
  freq factors tensor (olmo2.cpp passes nullptr). Attention scale 1/sqrt(head_dim).
- SwiGLU MLP (olmo2.cpp LLM_FFN_SILU, LLM_FFN_PAR), untied `output.weight` (load_arch_tensors).
- OLMo 3: with `olmo2.attention.sliding_window` > 0 the layers the pattern marks (the converter
  writes `attention.sliding_window_pattern` per layer; default load_swa_pattern(ml, 4): three
  local, one global) attend the last W keys (LLAMA_SWA_TYPE_STANDARD) and rotate with the
  global base and no scaling (olmo2.cpp: freq_scale 1, ext_factor 0 on is_swa layers).
- OLMo 3's long-context YaRN (HF rope_parameters["full_attention"] rope_type yarn; the converter writes the
  full-attention entry as `rope.scaling.type` yarn, factor, original_context_length, yarn_beta_fast/slow): on the
  global layers only (olmo2.cpp passes freq_scale, ext_factor and attn_factor there; HF Olmo3RotaryEmbedding
  scales only the full_attention type), gpt_oss.yarn_rope's frequencies with the correction range floored /
  ceiled (ggml_rope_yarn_corr_dims; HF truncate defaults true) and cos/sin times mscale = (1 + 0.1 ln factor)
  * rope.scaling.attn_factor (llama_context: yarn_attn_factor reset to get_mscale / (1 + 0.1 ln factor), the
  kernel multiplying by (1 + 0.1 ln factor); HF's attention_factor, get_mscale(factor) by default), here the
  global layers' q times mscale^2 (the same scores). The window layers rotate unscaled. A file without a window
  takes it on every layer (swa_type NONE: no is_swa layer).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.models.base import Step
from minfer.models.gemma3 import swa_layers
from minfer.models.layers import Block, ffn_branch, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel
from minfer.weights import QWeight, load_qweight, load_vector

DEFAULT_SWA_PATTERN = 4     # llama_model_olmo2::load_arch_hparams: load_swa_pattern(ml, 4)


def load_olmo2_block(gf, cfg, i: int, device, dtype) -> Block:
    """blk.i's weights: q/k/v/o, whole-projection q/k norms, the two post-norms, SwiGLU."""
    p = f"blk.{i}."
    D, F = cfg.d_model, cfg.ffn
    q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim

    def w(name, shape) -> QWeight:
        return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

    return Block(
        attn_norm=load_vector(gf, p + "post_attention_norm.weight", device, D),   # the POST norms: see Olmo2Model
        attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
        attn_output=w("attn_output", (D, q_out)),
        ffn_norm=load_vector(gf, p + "post_ffw_norm.weight", device, D),
        ffn_gate=w("ffn_gate", (F, D)), ffn_up=w("ffn_up", (F, D)), ffn_down=w("ffn_down", (D, F)),
        attn_q_norm=load_vector(gf, p + "attn_q_norm.weight", device, q_out),     # (H*Dh,)
        attn_k_norm=load_vector(gf, p + "attn_k_norm.weight", device, kv_out),    # (Hkv*Dh,)
    )


def post_norm_forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
    """The forward of a model with post-norms only (OLMo 2, EXAONE 4: Block.attn_norm / ffn_norm
    hold post_attention_norm / post_ffw_norm): tokens (T,) int64 at step.positions -> logits (R, V)
    float32 (R: step.logits' rows). self._attention is the model's own."""
    act, eps = self.act_dtype, self.cfg.rms_eps
    x = ops.embedding(tokens, self.token_embd)                           # (T, D) float32
    for i, blk in enumerate(self.blocks):
        a = self._attention(x.to(act), blk, i, cache, step, ctx)
        x = x + ops.rms_norm(a.float(), blk.attn_norm, eps)             # post_attention_norm
        f = ffn_branch(x.to(act), blk, ctx)
        x = x + ops.rms_norm(f.float(), blk.ffn_norm, eps)              # post_ffw_norm
    h = ops.rms_norm(step.rows(x), self.output_norm, eps).to(act)        # (R, D)
    return self.head(h, ctx)                 # (R, V)


def whole_qk_norm_attention(x: torch.Tensor, blk: Block, c: ModelConfig, i: int, cache, step: Step, rope, ctx,
                            window: int = 0, q_scale: float = 1.0) -> torch.Tensor:
    """Attention with q/k RMS-normalized over the whole projection (blk.attn_q_norm (H*Dh,),
    attn_k_norm (Hkv*Dh,)) before the split into heads and rope (OLMo 2, OLMoE): the normed
    input x (T, D) -> W_o attn(...) (T, D). q_scale: the normed q's factor (OLMo 3's YaRN mscale^2)."""
    T, H, Hkv, Dh = x.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
    q, k, v = ops.linear_many(x, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
    q = ops.rms_norm(q, blk.attn_q_norm, c.rms_eps).view(T, H, Dh)      # over H*Dh, then heads
    if q_scale != 1.0:
        q = q * q_scale
    k = ops.rms_norm(k, blk.attn_k_norm, c.rms_eps).view(T, Hkv, Dh)
    o = rope_write_attend(cache, i, q, k, v.view(T, Hkv, Dh), step, rope, ctx, window=window)   # (T, H, Dh)
    return ops.linear(merge_heads(o), blk.attn_output, None, ctx)


class Olmo2Model(LlamaModel):
    """Block.attn_norm / ffn_norm hold post_attention_norm / post_ffw_norm here (OLMo 2 has no
    pre-norms); attn_q_norm / attn_k_norm are whole-projection vectors, not per head."""

    arch = "olmo2"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_OLMO2 -> NEOX

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        return load_olmo2_block(gf, cfg, i, device, dtype)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Olmo2Model":
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        cfg = m.cfg
        rope = replace(cfg.rope, freq_factors=None)               # olmo2.cpp: no freq factors
        m.window = cfg.sliding_window
        pattern = cfg.swa_pattern if cfg.swa_pattern is not None else DEFAULT_SWA_PATTERN
        m.is_local = swa_layers(cfg.n_layers, m.window, pattern)
        local_rope, m.q_scale = replace(rope, freq_scale=1.0), 1.0
        if gf.metadata.get(f"{cls.arch}.rope.scaling.type") == "yarn":      # OLMo 3: the global layers only
            from minfer.models.gpt_oss import yarn_rope

            rope, mscale = yarn_rope(gf, cls.arch, rope, cfg.rope_attn_factor, truncate=True)
            m.q_scale = mscale * mscale
        m.layer_rope = [local_rope if loc else rope for loc in m.is_local]
        return m

    def _attention(self, x: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, D) residual stream (act dtype) -> W_o attn(...) (T, D)."""
        return whole_qk_norm_attention(x, blk, self.cfg, i, cache, step, self.layer_rope[i], ctx,
                                       window=self.window if self.is_local[i] else 0,
                                       q_scale=1.0 if self.is_local[i] else self.q_scale)

    forward = post_norm_forward
