"""StableLM (StableLM 2 1.6B / 12B, StableLM-3B-4E1T, StableLM Zephyr / Stable Code 3B): the GGUF arch `stablelm`.

    x_0 = E[tokens]                                     token_embd (V, D); output (V, D), required
    for each layer l:
        h = LN(x; attn_norm, attn_norm.bias)
        q, k, v = W_q h + b_q, W_k h + b_k, W_v h + b_v  biases optional
        q, k = LN_head(q; attn_q_norm), LN_head(k; attn_k_norm)   optional (12B): per head, weight only
        a = W_o attn(rope(q), rope(k), v)                rope on the first rope.dimension_count dims (NEOX)
        with ffn_norm:    x = x + a;  x = x + W_down(silu(W_gate g) * W_up g), g = LN(x; ffn_norm, ffn_norm.bias)
        without (12B):    x = x + a + W_down(silu(W_gate h) * W_up h)          the parallel residual
    logits = W_out LN(x; output_norm, output_norm.bias)

Each rule and its source (llama.cpp src/models/stablelm.cpp; HF modeling_stablelm):
- LayerNorm (mean removed) with weight and bias before attention, before a sequential MLP and at the
  output (build_norm(..., attn_norm, attn_norm_b, LLM_NORM); load_arch_tensors: attn_norm.bias and
  output_norm.bias required; HF nn.LayerNorm(layer_norm_eps)), eps `stablelm.attention.layer_norm_epsilon`
  (load_arch_hparams: LLM_KV_ATTENTION_LAYERNORM_EPS, required).
- q/k/v biases optional, each taken when present (create_tensor_qkv: TENSOR_NOT_REQUIRED; HF use_qkv_bias,
  StableLM 2 1.6B), no output-projection bias (wo bias NULL; HF o_proj bias=False: a file with
  attn_output.bias is refused by name).
- Optional per-head q/k LayerNorms without bias, attn_q_norm (Dh, H) and attn_k_norm (Dh, Hkv) in ggml's
  order, one weight row per head, after the biases and before rope (stablelm.cpp build_norm(Qcur,
  attn_q_norm, NULL, LLM_NORM) on the (Dh, H, T) view; HF StableLmLayerNormPerHead: nn.LayerNorm(head_dim,
  bias=False) per head, StableLM 2 12B's qk_layernorm). ops.layer_norm with a (H, Dh) weight. Only one of
  the two, or a norm on some layers only, is refused by name.
- Parallel residual where a layer has no ffn_norm: the MLP reads the attention's input norm h and both
  branches are added to x (stablelm.cpp: `cur = inpSA` when ffn_norm is NULL; HF use_parallel_residual:
  x + attn(ln1(x)) + mlp(ln1(x))). The `stablelm.use_parallel_residual` key is not read (llama.cpp decides
  by the tensor); ffn_norm must be on every layer or none, and ffn_norm.bias without ffn_norm.weight is
  refused by name.
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_STABLELM -> NEOX; HF rotate_half on the first rotary_ndims
  dims) on the first `rope.dimension_count` dims of each head (the converter writes partial_rotary_factor *
  head_dim: 0.25 in the releases), scale 1/sqrt(head_dim), GQA.
- SwiGLU MLP without biases (build_ffn LLM_FFN_SILU, LLM_FFN_PAR), output.weight required (no tied head:
  load_arch_tensors flag 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import (Block, BlockTensors, attention_heads, ffn_branch, merge_heads, require_output,
                                  rope_write_attend)
from minfer.models.llama import LlamaModel
from minfer.models.starcoder2 import layer_norm
from minfer.weights import load_vector


@dataclass
class StablelmBlock(Block):
    attn_norm_b: torch.Tensor | None = None      # (D,)
    ffn_norm_b: torch.Tensor | None = None       # (D,); ffn_norm None: the parallel residual


def _check_layout(gf, cfg: ModelConfig) -> None:
    """The tensors that must be on every layer or none (q/k norms, ffn_norm), and those never taken."""
    def has(i, name):
        return f"blk.{i}.{name}" in gf.tensors

    L = cfg.n_layers
    for i in range(L):
        for name in ("attn_output.bias", "attn_qkv.weight", "ffn_up.bias", "ffn_gate.bias", "ffn_down.bias"):
            if has(i, name):
                raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}': stablelm has no such tensor "
                                  "(llama.cpp's stablelm loader does not take it)")
        if has(i, "ffn_norm.bias") and not has(i, "ffn_norm.weight"):
            raise MinferError(f"{gf.path}: tensor 'blk.{i}.ffn_norm.bias' without 'blk.{i}.ffn_norm.weight'")
    for group in (("attn_q_norm.weight", "attn_k_norm.weight"), ("ffn_norm.weight",)):
        present = [(i, n) for i in range(L) for n in group if has(i, n)]
        if present and len(present) != L * len(group):
            missing = next(f"blk.{i}.{n}" for i in range(L) for n in group if not has(i, n))
            raise MinferError(f"{gf.path}: tensor '{missing}' is missing (other layers have "
                              f"'blk.{present[0][0]}.{present[0][1]}': stablelm takes it on every layer or none)")


class StablelmModel(LlamaModel):
    """Block.ffn_norm None on every layer: the parallel residual. attn_q_norm / attn_k_norm (H, Dh) /
    (Hkv, Dh) when present: LayerNorm weights per head (Block's per-head RMSNorm fields, used here as
    LayerNorm)."""

    arch = "stablelm"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_STABLELM -> NEOX
    norm_eps_key = "attention.layer_norm_epsilon"

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "StablelmModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        require_output(gf, cfg, "stablelm")
        _check_layout(gf, cfg)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.output_norm_b = load_vector(gf, "output_norm.bias", device, m.cfg.d_model)
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, opt, D, Fw, q_out, kv_out = t.w, t.v, t.opt, t.D, t.F, t.q_out, t.kv_out
        Dh, H, Hkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        sequential, qk_norm = t.has("ffn_norm.weight"), t.has("attn_q_norm.weight")
        return StablelmBlock(
            **t.ln_attention(),
            attn_q_norm=v("attn_q_norm.weight", q_out).view(H, Dh) if qk_norm else None,
            attn_k_norm=v("attn_k_norm.weight", kv_out).view(Hkv, Dh) if qk_norm else None,
            ffn_norm=v("ffn_norm.weight", D) if sequential else None,
            ffn_norm_b=opt("ffn_norm.bias", D) if sequential else None,
            ffn_gate=w("ffn_gate", (Fw, D)), ffn_up=w("ffn_up", (Fw, D)), ffn_down=w("ffn_down", (D, Fw)))

    def attention(self, h: torch.Tensor, blk: StablelmBlock, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o attn(...) (T, D), h's dtype."""
        c = self.cfg
        if blk.attn_q_norm is None:     # the llama attention with optional biases (the fused decode paths on CUDA)
            return ops.linear(attention_heads(h, blk, c, cache, i, step, ctx), blk.attn_output, None, ctx)
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v),
                                  (blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias), ctx)
        q = ops.layer_norm(q.reshape(T * H, Dh), blk.attn_q_norm, c.rms_eps).view(T, H, Dh)     # per head
        k = ops.layer_norm(k.reshape(T * Hkv, Dh), blk.attn_k_norm, c.rms_eps).view(T, Hkv, Dh)
        o = rope_write_attend(cache, i, q, k, v.reshape(T, Hkv, Dh), step, c.rope, ctx)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = ops.embedding(tokens, self.token_embd)                                     # (T, D) float32
        for i, blk in enumerate(self.blocks):
            h = layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act)              # (T, D) act
            a = self.attention(h, blk, i, cache, step, ctx).float()
            if i == last:       # stablelm.cpp: the last layer's MLP on the output rows only
                x, h, a = step.rows(x), step.rows(h), step.rows(a)
            x = x + a
            if blk.ffn_norm is not None:
                g = (ops.layer_norm(x, blk.ffn_norm, eps, torch.float32)
                     + (blk.ffn_norm_b if blk.ffn_norm_b is not None else 0.0)).to(act)
                x = x + ffn_branch(g, blk, ctx).float()
            else:               # the parallel residual: the MLP reads the attention's input norm
                x = x + ffn_branch(h, blk, ctx).float()
        h = layer_norm(x, self.output_norm, self.output_norm_b, eps, act)              # (R, D)
        return self.head(h, ctx)         # (R, V)
