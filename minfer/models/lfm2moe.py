"""Liquid AI LFM2-8B-A1B (HF Lfm2MoeForCausalLM): the GGUF arch `lfm2moe`, lfm2's hybrid of
short-convolution and GQA attention layers with a sparse MoE in place of the FFN past the first layers.

    x_0 = E[tokens]                                       token_embd (V, D); output, or tied
    for each layer l:
        h = RMSNorm(x; attn_norm)
        x = x + conv(h) or attn(h)                        models/lfm2.py (head_count_kv entry 0: conv)
        h = RMSNorm(x; ffn_norm)
        x = x + W_down(silu(W_gate h) * W_up h)           l < leading_dense_block_count
        x = x + moe(h)                                    the other layers
    logits = W_out RMSNorm(x; token_embd_norm)

Each rule and its source (llama.cpp src/models/lfm2moe.cpp: load_arch_hparams, load_arch_tensors,
the graph; conversion/lfm2.py LFM2MoeModel; HF transformers models/lfm2_moe/modeling_lfm2_moe.py):
- The conv and attention layers, the norms and the final norm's tensor name are lfm2's
  (lfm2moe.cpp's build_shortconv_block / build_attn_block are lfm2.cpp's; models/lfm2.py cites them),
  NEOX rope (llama_model_rope_type: LLM_ARCH_LFM2MOE -> NEOX).
- The first leading_dense_block_count layers (HF num_dense_layers; llama.cpp default 0 when the key is
  absent) have a SwiGLU MLP of feed_forward_length (HF Lfm2MoeMLP(intermediate_size)); the others the
  MoE (build_moe_feed_forward = build_moe_ffn(..., LLM_FFN_SILU, norm_w = true, expert_weights_scale,
  expert_gating_func); HF Lfm2MoeTopKRouter, Lfm2MoeSparseMoeBlock):
      p   = sigmoid(W_r h)                    ffn_gate_inp (E, D); expert_gating_func (required by
                                              llama.cpp's get_key; the converter writes 2, sigmoid:
                                              HF's only scoring)
      top = the K largest p + b               exp_probs_b.bias (E,) (required: flag 0; HF expert_bias,
                                              use_expert_bias; the converter renames it)
      w   = p[top] / sum(p[top])              norm_w true, hard-coded (HF norm_topk_prob, true as
                                              released; HF adds 1e-6 to the sum, llama.cpp clamps it
                                              at 2^-14: both invisible at 1e-3)
      no scale: lfm2moe.cpp never loads expert_weights_scale (hparams default 0: none); HF's
      routed_scaling_factor is 1.0 in the released config. A file's expert_weights_scale other than 1 is
      refused by name rather than silently ignored.
      moe(h) = sum_k w_k W_down[e_k](silu(W_gate[e_k] h) * W_up[e_k] h)   experts expert_feed_forward_length wide
  No shared expert. Group-limited choice is llama.cpp's generic expert_group_count (none written by the
  converter); ops.moe_ffn takes it when a file has one.
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.glm4moe import Glm4MoeBlock, load_moe_layer
from minfer.models.layers import Block, attention_heads, ffn_branch
from minfer.models.lfm2 import Lfm2Model
from minfer.models.qwen3moe import stacked_experts
from minfer.weights import QWeight, load_qweight, load_vector


class Lfm2MoeModel(Lfm2Model):
    """Lfm2Model with moe[i] (a Glm4MoeBlock without shared expert) on the layers past the dense lead; their
    Block has no ffn_gate/up/down."""

    arch = "lfm2moe"
    rope_style = "neox"                 # llama_model_rope_type: LLM_ARCH_LFM2MOE -> NEOX
    expert_gatings = ("sigmoid", "softmax")   # build_moe_ffn takes the file's expert_gating_func
    expert_keys = ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_gating_func")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Lfm2MoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a, md = cfg.arch, gf.metadata
        for key in cls.expert_keys:     # lfm2moe.cpp load_arch_hparams: get_key without a default
            if f"{a}.{key}" not in md:
                raise MinferError(f"{gf.path}: metadata key '{a}.{key}' is missing (needed to build the {a} model)")
        E, K, Fe = cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn
        if E <= 0 or not 0 < K <= E or Fe <= 0:
            raise MinferError(f"{gf.path}: {a}.expert_count={E}, expert_used_count={K}, "
                              f"expert_feed_forward_length={Fe}: expected 0 < used <= count and a positive length")
        if cfg.expert_weights_scale != 1.0:
            raise MinferError(f"{gf.path}: {a}.expert_weights_scale={cfg.expert_weights_scale}: llama.cpp's lfm2moe "
                              "graph never reads it (no scale) and HF's released routed_scaling_factor is 1: "
                              "not supported")
        lead = cfg.leading_dense_blocks
        if not 0 <= lead <= cfg.n_layers:
            raise MinferError(f"{gf.path}: {a}.leading_dense_block_count={lead}: expected 0..{cfg.n_layers}")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        D = cfg.d_model
        m.moe = [None if i < lead else load_moe_layer(gf, f"blk.{i}.", E, D, Fe, 0, device, dtype)
                 for i in range(cfg.n_layers)]
        m.weights_norm = True           # lfm2moe.cpp: build_moe_ffn(..., LLM_FFN_SILU, true, ...)
        return m

    @classmethod
    def load_lfm2_block(cls, gf, cfg: ModelConfig, i: int, conv: bool, device, dtype) -> Block:
        """lfm2's block; a MoE layer's without the dense FFN (its experts: from_gguf)."""
        if i < cfg.leading_dense_blocks:
            return Lfm2Model.load_lfm2_block(gf, cfg, i, conv, device, dtype)
        p, D, Dh = f"blk.{i}.", cfg.d_model, cfg.head_dim
        q_out, kv_out = cfg.n_heads * Dh, cfg.n_kv_heads * Dh

        def w(name, shape):
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        blk = Block(attn_norm=load_vector(gf, p + "attn_norm.weight", device, D), attn_q=None, attn_k=None,
                    attn_v=None, attn_output=None, ffn_norm=load_vector(gf, p + "ffn_norm.weight", device, D),
                    ffn_gate=None, ffn_up=None, ffn_down=None)
        if not conv:
            blk.attn_q, blk.attn_k = w("attn_q", (q_out, D)), w("attn_k", (kv_out, D))
            blk.attn_v, blk.attn_output = w("attn_v", (kv_out, D)), w("attn_output", (D, q_out))
            blk.attn_q_norm = load_vector(gf, p + "attn_q_norm.weight", device, Dh)
            blk.attn_k_norm = load_vector(gf, p + "attn_k_norm.weight", device, Dh)
        return blk

    # ---- declarations ----

    def qweights(self) -> list[QWeight]:
        return super().qweights() + stacked_experts(self.moe)      # after lfm2's conv matrices

    def head_weights(self) -> list:
        return super().head_weights() + stacked_experts(self.moe)

    # ---- the forward ----

    def moe_ffn(self, h: torch.Tensor, e: Glm4MoeBlock, ctx) -> torch.Tensor:
        """A MoE layer's FFN of the normed input h (T, D) -> (T, D) (build_moe_ffn, see the module doc)."""
        c = self.cfg
        return ops.moe_ffn(h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, c.n_experts_used, self.weights_norm,
                           ctx, gating=c.expert_gating, select_bias=e.exp_probs_b, n_group=c.expert_groups,
                           topk_group=c.expert_groups_used)

    def attention_residual_norm(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx, x: torch.Tensor,
                                eps: float, act) -> tuple:
        """lfm2's, except that a MoE layer's FFN norm is made whole (into_linear False): the router and
        ops.moe_ffn read h themselves, where the CUDA one-row GEMV path would leave it to the next GEMV."""
        if self.moe[i] is None:
            return super().attention_residual_norm(h, blk, i, cache, step, ctx, x, eps, act)
        if self.is_conv[i]:
            a, w = self.short_conv(h, i, cache, step, ctx), self.conv_out[i]
        else:
            a, w = attention_heads(h, blk, self.cfg, cache, i, step, ctx), blk.attn_output
        return ops.linear_add_rms_norm(a, w, x, blk.ffn_norm, eps, act, ctx, into_linear=False, role="ffn_norm")

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, blocks = self.act_dtype, self.cfg.rms_eps, self.blocks
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)
        for i, blk in enumerate(blocks):
            x, h = self.attention_residual_norm(h, blk, i, cache, step, ctx, x, eps, act)
            e = self.moe[i]
            f = ffn_branch(h, blk, ctx) if e is None else self.moe_ffn(h, e, ctx)     # (T, D)
            if i + 1 < len(blocks):
                x, h = ops.add_rms_norm(x, f, blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)                          # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)
