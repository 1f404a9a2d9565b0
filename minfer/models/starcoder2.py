"""StarCoder2 (3B, 7B, 15B; IBM Granite-Code 20B/34B converted as it): the GGUF arch `starcoder2`.

    x_0 = E[tokens]                                     token_embd (V, D); output, or the embedding when tied
    for each layer l:
        h = LN(x; attn_norm, attn_norm.bias)
        x = x + W_o attn(rope(W_q h + b_q), rope(W_k h + b_k), W_v h + b_v) + b_o
        h = LN(x; ffn_norm, ffn_norm.bias)
        x = x + W_down gelu(W_up h + b_up) + b_down
    logits = W_out LN(x; output_norm, output_norm.bias)

Each rule and its source (llama.cpp src/models/starcoder2.cpp; HF modeling_starcoder2):
- LayerNorm (mean removed) with weight AND bias, eps `starcoder2.attention.layer_norm_epsilon`
  (build_norm(..., attn_norm, attn_norm_b, LLM_NORM); load_arch_hparams: LLM_KV_ATTENTION_LAYERNORM_EPS;
  HF nn.LayerNorm(norm_epsilon)). ops.layer_norm, then + bias.
- Biases on q/k/v, the output projection and both MLP matrices, all required
  (load_arch_tensors: attn_output.bias, ffn_up.bias, ffn_down.bias with flag 0; HF use_bias).
- The MLP is not gated: W_down gelu(W_up h) (build_ffn(..., LLM_FFN_GELU, LLM_FFN_SEQ); HF
  Starcoder2MLP c_fc / c_proj), GELU's tanh approximation (ggml_gelu; HF hidden_act
  gelu_pytorch_tanh, the released configs' value). Applied with torch's gelu on both backends.
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_STARCODER2 -> NEOX), scale 1/sqrt(head_dim), GQA.
- Sliding window: HF attends the last `sliding_window` keys (4096 in the released configs), but
  the converter writes no window key and llama.cpp's graph has none (build_attn_inp_kv): with
  no `starcoder2.attention.sliding_window` minfer attends every key, as llama.cpp (the two agree
  up to 4096 tokens); a file that has the key gets that window on every layer (HF's rule).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.models.base import Step
from minfer.models.layers import Block, BlockTensors, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel
from minfer.weights import load_vector


@dataclass
class Starcoder2Block(Block):
    attn_norm_b: torch.Tensor | None = None      # (D,)
    attn_output_b: torch.Tensor | None = None    # (D,)
    ffn_norm_b: torch.Tensor | None = None       # (D,)
    ffn_up_b: torch.Tensor | None = None         # (F,)
    ffn_down_b: torch.Tensor | None = None       # (D,)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, out_dtype) -> torch.Tensor:
    """LayerNorm with bias (ggml_norm, * w, + b): (N, D) float32 -> out_dtype."""
    return (ops.layer_norm(x, w, eps, torch.float32) + b).to(out_dtype)


class Starcoder2Model(LlamaModel):
    arch = "starcoder2"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_STARCODER2 -> NEOX
    norm_eps_key = "attention.layer_norm_epsilon"

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, D, Fw, q_out, kv_out = t.w, t.v, t.D, t.F, t.q_out, t.kv_out
        return Starcoder2Block(
            attn_norm=v("attn_norm.weight", D), attn_norm_b=v("attn_norm.bias", D),
            attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
            attn_q_bias=v("attn_q.bias", q_out), attn_k_bias=v("attn_k.bias", kv_out),
            attn_v_bias=v("attn_v.bias", kv_out),
            attn_output=w("attn_output", (D, q_out)), attn_output_b=v("attn_output.bias", D),
            ffn_norm=v("ffn_norm.weight", D), ffn_norm_b=v("ffn_norm.bias", D),
            ffn_gate=None, ffn_up=w("ffn_up", (Fw, D)), ffn_up_b=v("ffn_up.bias", Fw),
            ffn_down=w("ffn_down", (D, Fw)), ffn_down_b=v("ffn_down.bias", D))

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Starcoder2Model":
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.output_norm_b = load_vector(gf, "output_norm.bias", device, m.cfg.d_model)
        m.window = m.cfg.sliding_window          # 0 (every key) without the key: starcoder2.cpp
        return m

    def attention(self, h: torch.Tensor, blk: Starcoder2Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o attn(...) + b_o (T, D)."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v),
                                  (blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias), ctx)
        o = rope_write_attend(cache, i, q.view(T, H, Dh), k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step, c.rope, ctx,
                              window=self.window)
        return ops.linear(merge_heads(o), blk.attn_output, blk.attn_output_b, ctx)

    def mlp(self, h: torch.Tensor, blk: Starcoder2Block, ctx) -> torch.Tensor:
        """W_down gelu_tanh(W_up h + b_up) + b_down, (T, D) -> (T, D)."""
        u = ops.linear(h, blk.ffn_up, blk.ffn_up_b, ctx)
        return ops.linear(F.gelu(u.float(), approximate="tanh").to(h.dtype), blk.ffn_down, blk.ffn_down_b, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)                                     # (T, D) float32
        for i, blk in enumerate(self.blocks):
            x = x + self.attention(layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act), blk, i, cache, step,
                                   ctx).float()
            x = x + self.mlp(layer_norm(x, blk.ffn_norm, blk.ffn_norm_b, eps, act), blk, ctx).float()
        h = layer_norm(step.rows(x), self.output_norm, self.output_norm_b, eps, act)    # (R, D)
        return self.head(h, ctx)          # (R, V)
