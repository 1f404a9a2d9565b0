"""Tencent Hunyuan dense (Hunyuan-0.5B/1.8B/4B/7B, -Instruct): the GGUF arch `hunyuan-dense`.

    x_0 = E[tokens]                                   token_embd (V, D); output, or the embedding when tied
    for each layer l:
        h = RMSNorm(x; attn_norm)
        q, k = n_q(rope(W_q h)), n_k(rope(W_k h))     n_q, n_k: RMSNorm of each head AFTER rope
        x = x + W_o attn(q, k, W_v h)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))   n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/hunyuan-vl.cpp, whose graph and loaders
llama_model_hunyuan_dense reuses (src/models/models.h); HF modeling_hunyuan_v1_dense):
- The per-head q/k RMSNorm comes after the rotation, not before it as in qwen3: the graph ropes
  Qcur/Kcur (ggml_rope_ext), then build_norm(Kcur, attn_k_norm), build_norm(Qcur, attn_q_norm);
  HF HunYuanDenseV1Attention: apply_rotary_pos_emb, then query_layernorm / key_layernorm. The
  weights are (head_dim,) (load_arch_tensors: attn_q_norm {n_embd_head_k}), eps the model's rms eps.
  The cache holds the normed rotated keys.
- RoPE NEOX over the whole head (llama_model_rope_type: LLM_ARCH_HUNYUAN_DENSE -> NEOX; the graph
  asserts n_rot == head size), scale 1/sqrt(head_dim), GQA.
- NTK "alpha" rope: the released configs say rope_scaling {type: dynamic, alpha: 1000}, which HF
  runs as a fixed base theta * alpha^(Dh / (Dh - 2)) (HunYuanDenseV1RotaryEmbedding
  compute_ntk_alpha_rope_parameters). The converter (conversion/hunyuan.py HunYuanModel) writes
  that scaled base as rope.freq_base with scaling type none and factor 1, so a converted file needs
  nothing more. A file carrying `hunyuan-dense.rope.scaling.alpha` > 0 (HunyuanVL's converter
  writes the key with the unscaled base) gets llama.cpp's load_arch_hparams rule:
  freq_base *= alpha^(Dh / (Dh - 2)).
- No biases in the released models. llama.cpp's loader takes no attn_output.bias (HF's
  attention_bias adds one with those of q/k/v), so any attention bias is refused by name.
- Tied head when output.weight is absent (load_arch_tensors: output TENSOR_NOT_REQUIRED, then
  token_embd duplicated; the converter skips lm_head under tie_word_embeddings).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, head_norm, merge_heads
from minfer.models.llama import LlamaModel

_REFUSED_TENSORS = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias")


def alpha_scaled_base(theta: float, alpha: float, head_dim: int) -> float:
    """theta * alpha^(Dh / (Dh - 2)) (llama.cpp llama_model_hunyuan_vl::load_arch_hparams; HF
    compute_ntk_alpha_rope_parameters)."""
    return theta * alpha ** (head_dim / (head_dim - 2))


def rope_then_norm_heads(h: torch.Tensor, blk: Block, cfg, cache, layer: int, step, ctx) -> torch.Tensor:
    """The attention's heads before the o projection, merged (T, H * Dh): q and k rotated, then
    each head RMS-normalized, then k and v stored and attended."""
    T = h.shape[0]
    H, Hkv, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
    q = ops.rope(q.view(T, H, Dh), step.positions, cfg.rope)
    k = ops.rope(k.view(T, Hkv, Dh), step.positions, cfg.rope)
    q, k = head_norm(q, blk.attn_q_norm, cfg.rms_eps), head_norm(k, blk.attn_k_norm, cfg.rms_eps)
    cache.write(layer, k, v.view(T, Hkv, Dh), step)
    return merge_heads(cache.attend(layer, q, step, ctx))                 # (T, H*Dh)


class HunyuanDenseModel(LlamaModel):
    """Block.attn_q_norm / attn_k_norm: the per-head (Dh,) norms, applied after rope."""

    arch = "hunyuan-dense"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_HUNYUAN_DENSE -> NEOX
    qk_norm = True            # loaded by load_block; applied here, after rope

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "HunyuanDenseModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        for suffix in _REFUSED_TENSORS:
            for i in range(cfg.n_layers):
                if f"blk.{i}.{suffix}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{suffix}' is not supported for {cls.arch} "
                                      "(the released models have no attention biases; llama.cpp's loader "
                                      "takes no attn_output.bias)")
        key = f"{cls.arch}.rope.scaling.alpha"
        alpha = gf.metadata.get(key)
        if alpha is not None and float(alpha) > 0:
            if cfg.head_dim <= 2:
                raise MinferError(f"{gf.path}: metadata key '{key}' needs a head size above 2 "
                                  f"(attention.key_length is {cfg.head_dim})")
            theta = alpha_scaled_base(cfg.rope.theta, float(alpha), cfg.head_dim)
            cfg = replace(cfg, rope=replace(cfg.rope, theta=theta))
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)

    def attention_residual_norm(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx, x: torch.Tensor,
                                eps: float, act) -> tuple:
        """Layer i's attention (q/k norms after rope), its residual add and the FFN norm."""
        o = rope_then_norm_heads(h, blk, self.cfg, cache, i, step, ctx)
        return ops.linear_add_rms_norm(o, blk.attn_output, x, blk.ffn_norm, eps, act, ctx, into_linear=True,
                                       role="ffn_norm")
