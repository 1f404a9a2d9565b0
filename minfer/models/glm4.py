"""GLM-4 (0414: GLM-4-9B, GLM-4-32B, GLM-Z1): the GGUF arch `glm4`.

    x_0 = E[tokens]                                           token_embd (V, D); output (V, D), or tied
    for each layer l:
        a = W_o attn(rope(W_q n(x) + b_q), rope(W_k n(x) + b_k), W_v n(x) + b_v)    n = RMSNorm(attn_norm)
        x = x + pa(a)                                            pa = RMSNorm(post_attention_norm)
        [g; u] = W_up n'(x)                                      n' = RMSNorm(ffn_norm); W_up (2F, D)
        x = x + pf(W_down(silu(g) * u))                          pf = RMSNorm(post_ffw_norm)
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source:
- Post-norms on both branches before the residual add, besides the pre-norms (llama.cpp
  src/models/glm4.cpp graph: attn_post_norm on the attention output, ffn_post_norm on the MLP's;
  HF Glm4DecoderLayer: post_self_attn_layernorm, post_mlp_layernorm). Tensors
  blk.N.post_attention_norm / post_ffw_norm (glm4.cpp load_arch_tensors).
- q/k/v biases (HF attention_bias, the converter's attn_{q,k,v}.bias; build_qkv adds them), no o bias.
- The MLP's gate and up are one matrix ffn_up of 2F rows, gate first (glm4.cpp: build_ffn with
  ffn_up only, LLM_FFN_SWIGLU: silu of the first half times the second; HF Glm4MLP gate_up_proj,
  chunk(2)).
- RoPE NORM on the first rope.dimension_count dims of each head, the rest passed through
  (llama_model_rope_type: LLM_ARCH_GLM4 -> NORM without M-RoPE; the converter writes
  dimension_count = head_dim * partial_rotary_factor and leaves q/k unpermuted; HF
  apply_rotary_pos_emb interleaves the pairs on the first rotary_dim dims). Attention scale
  1/sqrt(head_dim).
- Refused by name: M-RoPE files (`glm4.rope.dimension_sections`, the vision variant) and NextN
  prediction layers (`glm4.nextn_predict_layers` > 0).
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, attention_heads
from minfer.models.llama import LlamaModel
from minfer.weights import load_qweight, load_vector


class Glm4Model(LlamaModel):
    """LlamaModel's loader and head; the block's post-norms ride on it (blk.post_attention_norm,
    blk.post_ffw_norm) and its ffn_up holds gate and up (ffn_gate None)."""

    arch = "glm4"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_GLM4 -> NORM (no M-RoPE)
    qkv_bias = True

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Glm4Model":
        md = gf.metadata
        if "glm4.rope.dimension_sections" in md:
            raise MinferError(f"{gf.path}: metadata key 'glm4.rope.dimension_sections' (M-RoPE, the vision "
                              "variant) is not supported")
        if int(md.get("glm4.nextn_predict_layers", 0) or 0) > 0:
            raise MinferError(f"{gf.path}: metadata key 'glm4.nextn_predict_layers' is "
                              f"{md['glm4.nextn_predict_layers']}: NextN prediction layers are not supported")
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        p, D, F, Dh = f"blk.{i}.", cfg.d_model, cfg.ffn, cfg.head_dim
        q_out, kv_out = cfg.n_heads * Dh, cfg.n_kv_heads * Dh

        def w(name, shape):
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        blk = Block(attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
                    attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
                    attn_output=w("attn_output", (D, q_out)),
                    ffn_norm=load_vector(gf, p + "ffn_norm.weight", device, D),
                    ffn_gate=None, ffn_up=w("ffn_up", (2 * F, D)), ffn_down=w("ffn_down", (D, F)),
                    attn_q_bias=load_vector(gf, p + "attn_q.bias", device, q_out),
                    attn_k_bias=load_vector(gf, p + "attn_k.bias", device, kv_out),
                    attn_v_bias=load_vector(gf, p + "attn_v.bias", device, kv_out))
        blk.post_attention_norm = load_vector(gf, p + "post_attention_norm.weight", device, D)
        blk.post_ffw_norm = load_vector(gf, p + "post_ffw_norm.weight", device, D)
        return blk

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        c, act, eps, F = self.cfg, self.act_dtype, self.cfg.rms_eps, self.cfg.ffn
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        h = ops.rms_norm(x, self.blocks[0].attn_norm, eps).to(act)
        for i, blk in enumerate(self.blocks):
            a = ops.linear(attention_heads(h, blk, c, cache, i, step, ctx), blk.attn_output, None, ctx)
            x, h = ops.add_rms_norm(x, ops.rms_norm(a.float(), blk.post_attention_norm, eps), blk.ffn_norm,
                                    eps, act, ctx)
            gate_up = ops.linear(h, blk.ffn_up, None, ctx)                     # (T, 2F)
            f = ops.linear(ops.swiglu(gate_up[:, :F].contiguous(), gate_up[:, F:].contiguous()),
                           blk.ffn_down, None, ctx)
            f = ops.rms_norm(f.float(), blk.post_ffw_norm, eps)
            if i + 1 < len(self.blocks):
                x, h = ops.add_rms_norm(x, f, self.blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)                          # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)
