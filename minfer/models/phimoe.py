"""Phi-3.5-MoE (PhimoeForCausalLM): the GGUF arch `phimoe`.

    x_0 = E[tokens]                                    token_embd (V, D); output (V, D) + output.bias
    for each layer l:
        h = RMSNorm(x; attn_norm) + attn_norm.bias
        x = x + W_o attn(rope(W_q h + b_q), rope(W_k h + b_k), W_v h + b_v) + b_o
        h = RMSNorm(x; ffn_norm) + ffn_norm.bias
        x = x + sum_{e in top-k softmax(W_r h)} w_e W_down_e(silu(W_gate_e h) * W_up_e h)
    logits = W_out (RMSNorm(x; output_norm) + output_norm.bias) + output.bias

Each rule and its source (llama.cpp src/models/phimoe.cpp, whose graph IS phi3's:
`using graph = llama_model_phi3::graph<iswa>` in src/models/models.h; src/models/phi3.cpp;
HF modeling_phimoe; conversion/phi.py PhiMoeModel):
- The norms: llama.cpp builds attn_norm, ffn_norm and output_norm with LLM_NORM_RMS plus their
  (required) biases (phi3.cpp build_norm(inpL, attn_norm, attn_norm_b, LLM_NORM_RMS, il);
  phimoe.cpp load_arch_tensors: attn_norm_b, ffn_norm_b, output_norm_b flag 0). HF's
  PhimoeDecoderLayer uses nn.LayerNorm (mean subtracted). minfer follows llama.cpp, the GGUF
  format's engine: RMSNorm (no mean subtraction) times the weight plus the bias, eps
  `phimoe.attention.layer_norm_rms_epsilon`. The fixture's transformers reference is computed
  with HF's LayerNorms and router swapped for llama.cpp's rules (tools/gen_arch_fixtures.py
  LLAMACPP_RULES), and test_phimoe.py checks the rules against a float64 formula.
- q, k, v: separate attn_q/k/v with optional biases (what the converter writes; a fused
  attn_qkv, which create_tensor_qkv would also take, is refused by name); attn_output.bias required (phimoe.cpp: wo_b flag 0). NEOX rope
  (llama_model_rope_type: LLM_ARCH_PHIMOE -> NEOX), scale 1/sqrt(head_dim).
- LongRoPE as phi3's (minfer/models/phi3.py Phi3Model.rope_for: short factors within
  rope.scaling.original_context_length, long past it; rope.scaling.attn_factor multiplies the
  rotated dims of q and k).
- The MoE: softmax over the router's logits (ffn_gate_inp), the top `expert_used_count`, the
  weights renormalized to sum 1 (phi3.cpp build_moe_ffn(..., LLM_FFN_SILU, norm_w = true,
  hparams.expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX)); each expert a SwiGLU of
  width `phimoe.feed_forward_length` (ffn_*_exps {n_embd, n_ff, n_expert}). HF's sparsemixer
  (top-1 by argmax with a softmax over the scores within 2 * router_jitter_noise of the max, then
  the same over the rest) is NOT what llama.cpp computes; minfer follows llama.cpp. A
  `phimoe.expert_weights_scale` other than 0 or 1 is refused (build_moe_ffn would scale).
- The lm head's bias `output.bias` is required (phimoe.cpp: output_b flag 0; HF lm_head_bias).
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, each_block, merge_heads, refuse_expert_weights_scale
from minfer.models.phi3 import Phi3Model
from minfer.models.qwen3moe import Qwen3MoeModel
from minfer.weights import load_vector


class PhimoeModel(Qwen3MoeModel):
    """Block.attn_norm_b / ffn_norm_b / attn_output_b: the norms' and o projection's biases;
    m.output_norm_b, m.output_b the head's."""

    arch = "phimoe"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_PHIMOE -> NEOX
    qk_norm = False
    qkv_bias = False          # loaded below: optional (create_tensor_qkv TENSOR_NOT_REQUIRED biases)
    weights_norm = True       # phi3.cpp: build_moe_ffn(..., norm_w = true, ...)
    expert_keys = ("expert_count", "expert_used_count")
    rope_for = Phi3Model.rope_for

    @classmethod
    def expert_width(cls, cfg: ModelConfig) -> int:
        return cfg.ffn        # phimoe.cpp load_arch_tensors: the experts are {n_embd, n_ff, n_expert}

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "PhimoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        refuse_expert_weights_scale(gf, "phimoe")
        if "blk.0.attn_qkv.weight" in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'blk.0.attn_qkv.weight' (fused q/k/v) is not supported for "
                              "phimoe: expected attn_q / attn_k / attn_v (what llama.cpp's converter writes)")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        D = cfg.d_model
        for t, blk in each_block(gf, cfg, m.blocks, device, dtype):
            blk.attn_norm_b, blk.ffn_norm_b = t.v("attn_norm.bias", D), t.v("ffn_norm.bias", D)
            blk.attn_output_b = t.v("attn_output.bias", D)
            blk.attn_q_bias, blk.attn_k_bias = t.opt("attn_q.bias", t.q_out), t.opt("attn_k.bias", t.kv_out)
            blk.attn_v_bias = t.opt("attn_v.bias", t.kv_out)
        m.output_norm_b = load_vector(gf, "output_norm.bias", device, D)
        m.output_b = load_vector(gf, "output.bias", device, cfg.vocab)
        m.rope_scale = None
        if cfg.rope_attn_factor != 1.0:
            s = torch.ones(cfg.head_dim)
            s[:cfg.rope.n_rot] = cfg.rope_attn_factor
            m.rope_scale = s.to(device)                            # (Dh,)
        return m

    def linear_groups(self) -> list[tuple]:
        return []             # the q/k/v biases are per layer optional: no fused q/k/v GEMV

    def norm(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """llama.cpp's LLM_NORM_RMS with a bias: RMSNorm(x) * w + b, in the activation dtype."""
        return (ops.rms_norm(x, w, self.cfg.rms_eps) + b).to(self.act_dtype)

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        c, T = self.cfg, h.shape[0]
        H, Hkv, Dh = c.n_heads, c.n_kv_heads, c.head_dim
        rope = self.rope_for(cache)
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v),
                                  (blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias), ctx)
        q = ops.rope(q.reshape(T, H, Dh), step.positions, rope)
        k = ops.rope(k.reshape(T, Hkv, Dh), step.positions, rope)
        if self.rope_scale is not None:
            q, k = q * self.rope_scale.to(q.dtype), k * self.rope_scale.to(k.dtype)
        cache.write(i, k, v.reshape(T, Hkv, Dh), step)
        o = cache.attend(i, q, step, ctx)                                      # (T, H, Dh)
        return ops.linear(merge_heads(o), blk.attn_output, blk.attn_output_b, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        for i, (blk, e) in enumerate(zip(self.blocks, self.moe)):
            x = x + self.attention(self.norm(x, blk.attn_norm, blk.attn_norm_b), blk, i, cache, step, ctx).float()
            x = x + self.ffn(self.norm(x, blk.ffn_norm, blk.ffn_norm_b), e, ctx).float()
        h = self.norm(step.rows(x), self.output_norm, self.output_norm_b)      # (R, D)
        return self.head(h, ctx, self.output_b)      # (R, V)
