"""Gemma 2: the GGUF arch `gemma2`.

    x_0 = E[tokens] * sqrt(D)                          token_embd (V, D), tied lm head
    for each layer l:
        s = cap_a * tanh((q_l . k_l) * scale / cap_a)      attention scores, soft-capped
        a = W_o softmax(s) v_l                              q_l, k_l: rope_l(W_q n(x)), rope_l(W_k n(x))
        x = x + pn(a)                                       n = RMSNorm(attn_norm), pn = RMSNorm(post_attention_norm)
        f = W_down(gelu_tanh(W_gate n'(x)) * W_up n'(x))    n' = RMSNorm(ffn_norm)
        x = x + fn(f)                                       fn = RMSNorm(post_ffw_norm)
    logits = cap_f * tanh(W_out RMSNorm(x; output_norm) / cap_f)

Gemma 3's block without its q/k norms, plus two soft-caps. Each rule and its source:
- Norms: the converter stores every `*norm.weight` as 1 + w (llama.cpp conversion/gemma.py
  Gemma2Model.modify_tensors; HF Gemma2RMSNorm computes x * (1 + w)), so all are plain RMSNorms.
  Both post-norms (post_attention_norm, post_ffw_norm) are applied to the branch output before
  the residual add (llama.cpp src/models/gemma2.cpp graph: attn_post_norm, ffn_post_norm; HF
  Gemma2DecoderLayer.forward: post_attention_layernorm, post_feedforward_layernorm).
- No q/k norms (gemma2.cpp builds Q/K straight from build_qkv; HF Gemma2Attention has none).
- Embeddings scaled by sqrt(D) (gemma2.cpp: ggml_scale(inpL, sqrtf(n_embd)); HF Gemma2Model
  `normalizer`).
- Query scale: gemma2.cpp multiplies Q by f_attention_scale and attends with kq_scale 1;
  llama_model_gemma2::load_arch_hparams sets it to 1/sqrt(head_dim), or 1/sqrt(n_embd/n_head)
  for the 27B (46 layers). The GGUF carries no query_pre_attn_scalar (HF scales by
  query_pre_attn_scalar**-0.5, which equals those for every released size).
- Attention soft-cap: scores (already scaled) -> cap * tanh(scores / cap) before the mask and
  softmax (llama.cpp src/llama-graph.cpp build_attn_mha, hparams.attn_soft_cap; HF
  modeling_gemma2.eager_attention_forward `softcap`). Key `gemma2.attn_logit_softcapping`,
  default 50 (llama-hparams.h f_attn_logit_softcapping).
- Final soft-cap: logits -> cap * tanh(logits / cap), key `gemma2.final_logit_softcapping`,
  default 30 (llama-hparams.h f_final_logit_softcapping; gemma2.cpp applies it always; HF
  Gemma2ForCausalLM.forward).
- Sliding window on alternating layers: load_swa_pattern(ml, 2) with LLAMA_SWA_TYPE_STANDARD
  -> layer l is local when l % 2 == 0 (layers 0, 2, 4, ... local; 1, 3, 5, ... global), as HF
  Gemma2Config.layer_types ('sliding_attention' when (i + 1) % 2). Window from
  `gemma2.attention.sliding_window`, default 4096 (load_arch_hparams n_swa).
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_GEMMA2), one base for all layers unless
  `gemma2.rope.freq_base_swa` is present (load_arch_hparams: rope_freq_base_train_swa defaults
  to rope_freq_base_train, and the local layers keep the global freq_scale).
- FFN: GELU with the tanh approximation (gemma2.cpp LLM_FFN_GELU; HF gelu_pytorch_tanh).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma3 import swa_layers
from minfer.models.layers import Block
from minfer.models.llama import LlamaModel
from minfer.weights import load_vector

# llama.cpp llama_model_gemma2::load_arch_hparams and llama-hparams.h defaults
DEFAULT_SWA_PATTERN = 2
DEFAULT_WINDOW = 4096
DEFAULT_ATTN_SOFTCAP = 50.0
DEFAULT_FINAL_SOFTCAP = 30.0


def _positive(gf, key: str, default: float) -> float:
    v = float(gf.metadata.get(key, default))
    if not v > 0:
        raise MinferError(f"{gf.path}: metadata key '{key}' is {v}, expected a positive soft-cap")
    return v


class Gemma2Model(LlamaModel):
    arch = "gemma2"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_GEMMA2 -> NEOX

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Gemma2Model":
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        c, D, md = m.cfg, m.cfg.d_model, gf.metadata
        m.post_attention_norm = [load_vector(gf, f"blk.{i}.post_attention_norm.weight", device, D)
                                 for i in range(c.n_layers)]                              # (D,) each
        m.post_ffw_norm = [load_vector(gf, f"blk.{i}.post_ffw_norm.weight", device, D)
                           for i in range(c.n_layers)]
        m.window = int(md.get("gemma2.attention.sliding_window", DEFAULT_WINDOW) or 0)
        pattern = c.swa_pattern if c.swa_pattern is not None else DEFAULT_SWA_PATTERN
        m.is_local = swa_layers(c.n_layers, m.window, pattern)
        rope_swa = replace(c.rope, theta=float(md["gemma2.rope.freq_base_swa"])) \
            if "gemma2.rope.freq_base_swa" in md else c.rope
        m.layer_rope = [rope_swa if loc else c.rope for loc in m.is_local]
        m.attn_softcap = _positive(gf, "gemma2.attn_logit_softcapping", DEFAULT_ATTN_SOFTCAP)
        m.final_softcap = _positive(gf, "gemma2.final_logit_softcapping", DEFAULT_FINAL_SOFTCAP)
        # q is pre-scaled so that attention's 1/sqrt(Dh) gives llama.cpp's f_attention_scale
        # (the soft-cap then sees the same scaled scores as llama.cpp's and HF's)
        scale = 1.0 / math.sqrt(D / c.n_heads) if c.n_layers == 46 else 1.0 / math.sqrt(c.head_dim)  # 46: 27B
        m.q_scale = scale * math.sqrt(c.head_dim)
        m.embed_scale = math.sqrt(D)
        return m

    def _attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, D) normed input -> W_o attn(...) (T, D): this layer's rope and window, soft-capped scores."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        q = ops.rope(q.view(T, H, Dh), step.positions, self.layer_rope[i])
        k = ops.rope(k.view(T, Hkv, Dh), step.positions, self.layer_rope[i])
        if self.q_scale != 1.0:
            q = q * self.q_scale
        cache.write(i, k, v.view(T, Hkv, Dh), step)
        o = cache.attend(i, q, step, ctx, window=self.window if self.is_local[i] else 0,
                         softcap=self.attn_softcap)                                   # (T, H, Dh)
        return ops.linear(o.reshape(T, H * Dh), blk.attn_output, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd) * self.embed_scale        # (T, D) float32
        for i, blk in enumerate(self.blocks):
            h = ops.rms_norm(x, blk.attn_norm, eps).to(act)
            a = ops.rms_norm(self._attention(h, blk, i, cache, step, ctx).float(), self.post_attention_norm[i], eps)
            x, h = ops.add_rms_norm(x, a, blk.ffn_norm, eps, act, ctx)
            gate = ops.linear(h, blk.ffn_gate, None, ctx)
            up = ops.linear(h, blk.ffn_up, None, ctx)
            f = ops.linear(ops.geglu(gate, up), blk.ffn_down, None, ctx)
            x = x + ops.rms_norm(f.float(), self.post_ffw_norm[i], eps)
        h = ops.rms_norm(step.rows(x), self.output_norm, eps).to(act)        # (R, D)
        logits = ops.linear(h, self.output, None, ctx).float()                # (R, V)
        cap = self.final_softcap
        return cap * torch.tanh(logits / cap)
