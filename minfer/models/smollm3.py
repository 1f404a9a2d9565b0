"""SmolLM3: the GGUF arch `smollm3`.

    x_0 = E[tokens]                                   token_embd (V, D); output, or tied
    for each layer l:
        x = x + W_o attn(r_l(W_q n(x)), r_l(W_k n(x)), W_v n(x))   n = RMSNorm(attn_norm)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))            n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)
    r_l = rope for l + 1 not a multiple of 4; the identity (no positional encoding) for the others

Llama's block and weights; every fourth layer attends without rope. Each rule and its source:
- The NoPE layers: llama.cpp fixes the step at 4 (src/models/smollm3.cpp load_arch_hparams:
  n_no_rope_layer_step = 4; graph: use_rope = (il + 1) % n_no_rope_layer_step != 0); the file has no
  key for it. HF SmolLM3Config builds no_rope_layers the same way from no_rope_layer_interval (4)
  when the config gives no list, and the converter writes neither (conversion/llama.py SmolLM3Model).
- RoPE NORM (llama_model_rope_type: LLM_ARCH_SMOLLM3; the converter permutes q/k as Llama's),
  attention scale 1/sqrt(head_dim) (smollm3.cpp: f_attention_scale 0), SwiGLU MLP, no biases
  (load_arch_tensors).
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.models.base import Step
from minfer.models.layers import (Block, attention_residual_norm, ffn_branch, ffn_residual_norm, merge_heads)
from minfer.models.llama import LlamaModel

NO_ROPE_STEP = 4          # llama.cpp llama_model_smollm3::load_arch_hparams


def uses_rope(n_layers: int) -> tuple:
    """Per layer: True where it rotates q and k (smollm3.cpp: (il + 1) % 4 != 0)."""
    return tuple((i + 1) % NO_ROPE_STEP != 0 for i in range(n_layers))


class SmolLM3Model(LlamaModel):
    arch = "smollm3"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_SMOLLM3 -> NORM

    @property
    def use_rope(self) -> tuple:
        return uses_rope(self.cfg.n_layers)

    def _nope_residual_norm(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx, x: torch.Tensor,
                            norm_weight: torch.Tensor, eps: float, act) -> tuple:
        """attention_residual_norm for a layer without rope: q and k as projected, k and v stored as
        they are, then the o projection, the residual add and the FFN norm."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        cache.write(i, k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step)
        o = merge_heads(cache.attend(i, q.view(T, H, Dh), step, ctx))
        return ops.linear_add_rms_norm(o, blk.attn_output, x, norm_weight, eps, act, ctx, into_linear=True,
                                       role="ffn_norm")

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows);
        LlamaModel.forward with the NoPE layers' attention."""
        act, eps, blocks, rope = self.act_dtype, self.cfg.rms_eps, self.blocks, self.use_rope
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)
        f = None
        for i, blk in enumerate(blocks):
            if rope[i]:
                x, h = attention_residual_norm(h, blk, self.cfg, cache, i, step, ctx, x, blk.ffn_norm, eps, act)
            else:
                x, h = self._nope_residual_norm(h, blk, i, cache, step, ctx, x, blk.ffn_norm, eps, act)
            if i + 1 < len(blocks):
                x, h = ffn_residual_norm(h, blk, x, blocks[i + 1].attn_norm, eps, act, ctx)
            else:
                f = ffn_branch(h, blk, ctx)
        x, f = step.rows(x), step.rows(f)                          # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return ops.linear(h, self.output, None, ctx, out_dtype=torch.float32)      # (R, V)
