"""The `llama` arch with bias tensors (InternLM3 with qkv_bias = bias = true, other Llama-graph conversions).

llama.cpp's llama loader (src/models/llama.cpp load_arch_tensors) takes every bias as optional: q/k/v through
create_tensor_qkv, `attn_output.bias` (wo_b), `ffn_gate.bias` / `ffn_up.bias` / `ffn_down.bias`
(TENSOR_NOT_REQUIRED), and its graph adds each one present (build_qkv, build_attn's wo_b, build_ffn's *_b). The
converter writes them from HF's attention_bias / mlp_bias (InternLM3: qkv_bias and bias, which transformers
ties together). LlamaModel.from_gguf hands a `llama` file with any of them to this class (LlamaModel's fused
forward has no bias slots); the forward is Llama's with the biases added where llama.cpp adds them:

    x = x + (W_o attn(rope(W_q h + b_q), rope(W_k h + b_k), W_v h + b_v) + b_o)
    x = x + (W_down(silu(W_gate h' + b_gate) * (W_up h' + b_up)) + b_down)
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.models.base import Step
from minfer.models.layers import Block, attention_heads, load_block
from minfer.models.llama import LlamaModel
from minfer.weights import load_vector

BIASES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def has_biases(gf, n_layers: int) -> bool:
    """Whether any layer of the file has one of the llama graph's optional bias tensors."""
    return any(f"blk.{i}.{b}.bias" in gf.tensors for i in range(n_layers) for b in BIASES)


class LlamaBiasModel(LlamaModel):
    """Llama with its optional biases (module doc); `self.bias[i]`: layer i's o / ffn biases (None: absent)."""

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "LlamaBiasModel":
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        c = m.cfg
        size = {"attn_output": c.d_model, "ffn_gate": c.ffn, "ffn_up": c.ffn, "ffn_down": c.d_model}

        def opt(i, name):
            t = f"blk.{i}.{name}.bias"
            return load_vector(gf, t, device, size[name]) if t in gf.tensors else None

        m.bias = [{n: opt(i, n) for n in size} for i in range(c.n_layers)]
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        blk = load_block(gf, cfg, i, device, dtype)
        p, q_out, kv_out = f"blk.{i}.", cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        for name, n in (("attn_q", q_out), ("attn_k", kv_out), ("attn_v", kv_out)):
            if p + name + ".bias" in gf.tensors:
                setattr(blk, name + "_bias", load_vector(gf, p + name + ".bias", device, n))
        return blk

    def _ffn(self, h: torch.Tensor, blk: Block, b: dict, ctx) -> torch.Tensor:
        gate = ops.linear(h, blk.ffn_gate, b["ffn_gate"], ctx)
        up = ops.linear(h, blk.ffn_up, b["ffn_up"], ctx)
        return ops.linear(ops.swiglu(gate, up, ctx), blk.ffn_down, b["ffn_down"], ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, blocks, c = self.act_dtype, self.cfg.rms_eps, self.blocks, self.cfg
        x = ops.embedding(tokens, self.token_embd)                           # (T, D) float32
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)
        f = None
        for i, (blk, b) in enumerate(zip(blocks, self.bias)):
            a = ops.linear(attention_heads(h, blk, c, cache, i, step, ctx), blk.attn_output, b["attn_output"], ctx)
            x, h = ops.add_rms_norm(x, a, blk.ffn_norm, eps, act, ctx)
            f = self._ffn(h, blk, b, ctx)
            if i + 1 < len(blocks):
                x, h = ops.add_rms_norm(x, f, blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f)                                    # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)       # (R, V)
