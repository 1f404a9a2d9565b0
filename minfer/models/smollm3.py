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
from minfer.models.layers import Block, merge_heads
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

    def attention_residual_norm(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx, x: torch.Tensor,
                                eps: float, act) -> tuple:
        """LlamaModel's, but on a NoPE layer q and k as projected, k and v stored as they are, then the
        o projection, the residual add and the FFN norm."""
        if self.use_rope[i]:
            return super().attention_residual_norm(h, blk, i, cache, step, ctx, x, eps, act)
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        cache.write(i, k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step)
        o = merge_heads(cache.attend(i, q.view(T, H, Dh), step, ctx))
        return ops.linear_add_rms_norm(o, blk.attn_output, x, blk.ffn_norm, eps, act, ctx, into_linear=True,
                                       role="ffn_norm")
