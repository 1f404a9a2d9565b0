"""LG EXAONE 4.0 (32B, 1.2B): the GGUF arch `exaone4`.

    x_0 = E[tokens]                                    token_embd (V, D); output (V, D), or tied
    for each layer l:
        q, k = qn(W_q x), kn(W_k x)                        qn, kn: RMSNorm of each head (Dh,)
        x = x + pn(W_o attn_l(r_l(q), r_l(k), W_v x))      pn = RMSNorm(post_attention_norm)
        x = x + fn(W_down(silu(W_gate x) * W_up x))        fn = RMSNorm(post_ffw_norm)
    logits = W_out RMSNorm(x; output_norm)
    hybrid files (a sliding window): layer l local -> attn over the last W keys, r_l = rope;
                                     layer l global -> attn over every key, r_l = identity (no rope)
    otherwise: every layer global, r_l = rope

Each rule and its source (llama.cpp src/models/exaone4.cpp; the converter conversion/exaone.py
Exaone4Model; HF transformers models/exaone4/modeling_exaone4.py):
- Post-norm blocks, no pre-norms ("QK-Reorder-Norm"): the attention's and the MLP's outputs are
  RMS-normalized (attn_post_norm, ffn_post_norm) before each residual add; the branches read the raw
  residual stream (graph: cur = inpL; HF Exaone4DecoderLayer: post_attention_layernorm,
  post_feedforward_layernorm). No blk.N.attn_norm / ffn_norm tensors (load_arch_tensors).
- q/k RMSNorm per head, weights (head_dim,), before rope (graph: build_norm on the 3-D Qcur/Kcur;
  HF q_norm / k_norm on the (.., head_dim) view). One eps, attention.layer_norm_rms_epsilon.
- The sliding-window pattern: `exaone4.attention.sliding_window` = W and
  `attention.sliding_window_pattern` (the converter writes one flag per layer from HF layer_types or
  the "LLLG" string; an integer P means l local when (l + 1) % P != 0, load_swa_pattern(ml, 4)'s default
  4). A local query at p sees keys p - W < j <= p (LLAMA_SWA_TYPE_STANDARD; HF sliding mask).
- Rope only on the local layers of a hybrid model, on every layer otherwise (graph: use_rope =
  is_swa(il) || swa_type == NONE; HF: `if self.sliding_window is None or self.is_sliding`). RoPE NEOX
  (llama_model_rope_type: LLM_ARCH_EXAONE4; q/k unpermuted), the file's freq_base and
  rope_freqs.weight (Llama-3 scaling, the 32B's; model.get_rope_factors) on every rotating layer: the
  graph passes the context's freq_base/freq_scale, so rope.freq_base_swa changes nothing.
- Where minfer differs from llama.cpp: llama.cpp turns the window on only for 64-layer files (the 32B;
  load_arch_hparams: `if (hparams.n_layer() == 64)`, with W 4096 and pattern 4 when the keys are
  absent); a file of another depth that carries a window and a hybrid pattern runs there with full
  attention and rope everywhere. minfer follows the file (as transformers follows its config): W from
  the key, or 4096 for a 64-layer file without it, none otherwise. A window with no local layer in
  the pattern (where HF would drop rope everywhere and llama.cpp keep it) is refused by name.
- Scores 1/sqrt(head_dim), SwiGLU MLP, no biases (load_arch_tensors creates none).
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.gemma3 import swa_layers
from minfer.models.layers import Block, head_norm, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel
from minfer.models.olmo2 import post_norm_forward
from minfer.weights import load_qweight, load_vector

DEFAULT_SWA_PATTERN = 4     # llama_model_exaone4::load_arch_hparams: load_swa_pattern(ml, 4)
DEFAULT_WINDOW_64 = 4096    # ... hparams.n_swa = 4096 for the 64-layer model


def load_exaone4_block(gf, cfg, i: int, device, dtype) -> Block:
    """blk.i: q/k/v/o, per-head q/k norms, the two post-norms, SwiGLU (no pre-norms)."""
    p = f"blk.{i}."
    D, F, Dh = cfg.d_model, cfg.ffn, cfg.head_dim
    q_out, kv_out = cfg.n_heads * Dh, cfg.n_kv_heads * Dh

    def w(name, shape):
        return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

    return Block(
        attn_norm=load_vector(gf, p + "post_attention_norm.weight", device, D),   # the POST norms: Exaone4Model
        attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
        attn_output=w("attn_output", (D, q_out)),
        ffn_norm=load_vector(gf, p + "post_ffw_norm.weight", device, D),
        ffn_gate=w("ffn_gate", (F, D)), ffn_up=w("ffn_up", (F, D)), ffn_down=w("ffn_down", (D, F)),
        attn_q_norm=load_vector(gf, p + "attn_q_norm.weight", device, Dh),
        attn_k_norm=load_vector(gf, p + "attn_k_norm.weight", device, Dh),
    )


def qk_norm_window_attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
    """A model's _attention (exaone4, exaone-moe): h (T, D) -> W_o attn(...) (T, D); q/k/v with the block's
    biases where it has them, per-head q/k RMSNorms, layer i's rope where self.use_rope[i] (else none) and
    self.window where self.is_local[i] (else every key)."""
    c = self.cfg
    T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
    q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v),
                              (blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias), ctx)
    q, k, v = head_norm(q.view(T, H, Dh), blk.attn_q_norm, c.rms_eps), \
        head_norm(k.view(T, Hkv, Dh), blk.attn_k_norm, c.rms_eps), v.view(T, Hkv, Dh)
    window = self.window if self.is_local[i] else 0
    o = rope_write_attend(cache, i, q, k, v, step, c.rope if self.use_rope[i] else None, ctx,
                          window=window)                                       # (T, H, Dh)
    return ops.linear(merge_heads(o), blk.attn_output, None, ctx)


class Exaone4Model(LlamaModel):
    """Block.attn_norm / ffn_norm hold post_attention_norm / post_ffw_norm (EXAONE 4 has no pre-norms)."""

    arch = "exaone4"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_EXAONE4 -> NEOX
    qk_norm = True

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        return load_exaone4_block(gf, cfg, i, device, dtype)

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Exaone4Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        key = f"{cls.arch}.attention.sliding_window"
        window = cfg.sliding_window if key in gf.metadata else (DEFAULT_WINDOW_64 if cfg.n_layers == 64 else 0)
        pattern = cfg.swa_pattern if cfg.swa_pattern is not None else DEFAULT_SWA_PATTERN
        is_local = swa_layers(cfg.n_layers, window, pattern)
        if window > 0 and not any(is_local):
            raise MinferError(f"{gf.path}: metadata '{key}' = {window} but "
                              f"'{cls.arch}.attention.sliding_window_pattern' marks no layer as local: llama.cpp "
                              "and transformers disagree on where such a model rotates; not supported")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.window, m.is_local = window, is_local
        m.use_rope = is_local if window > 0 else (True,) * cfg.n_layers
        return m

    _attention = qk_norm_window_attention    # (T, D) residual stream (act dtype) -> W_o attn(...) (T, D)

    forward = post_norm_forward    # olmo2.py's: post-norms only, this class's _attention
