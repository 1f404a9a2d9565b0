"""Arcee AFM-4.5B: the GGUF arch `arcee`.

    x_0 = E[tokens]                                   token_embd (V, D); output (V, D), or tied
    for each layer l:
        x = x + W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))    n = RMSNorm(attn_norm)
        x = x + W_down relu(W_up n'(x))^2                           n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)

Llama's block with an ungated squared-ReLU MLP. Each rule and its source (llama.cpp src/models/arcee.cpp;
the converter conversion/llama.py ArceeModel, Llama's; HF transformers models/arcee, Llama with
NemotronMLP):
- The MLP: build_ffn(ffn_up, ..., ffn_down, LLM_FFN_RELU_SQR, LLM_FFN_SEQ) = W_down relu(W_up h)^2, no
  ffn_gate tensor (load_arch_tensors loads ffn_up / ffn_down only; HF ArceeMLP down_proj(act(up_proj(x))),
  hidden_act "relu2"). The square in float32 (torch on both backends, counted `relu2.torch` on CUDA).
- RoPE NORM, adjacent pairs (llama_model_rope_type: LLM_ARCH_ARCEE -> NORM; the converter is Llama's and
  permutes q/k), rope_freqs.weight as divisors when present (arcee.cpp get_rope_factors).
- YaRN when `rope.scaling.type` is yarn (HF rope_parameters yarn, which the converter writes as the
  rope.scaling.* keys): the frequencies, the truncated correction range and the cos/sin factor c applied
  as q * c^2 are mistral3.py's (llama.cpp applies YaRN for every architecture the same way:
  llama-context.cpp yarn_attn_factor, ggml rope_yarn).
- Scores 1/sqrt(head_dim) (arcee.cpp kq_scale with f_attention_scale 0), GQA, no biases: llama.cpp
  loads no output or MLP bias, so a bias tensor is refused by name.
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, BlockTensors
from minfer.models.llama import LlamaModel
from minfer.models.mistral3 import Mistral3Model, yarn_setup

_REFUSED_TENSORS = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "ffn_up.bias",
                    "ffn_down.bias", "ffn_gate.weight")


def relu2(u: torch.Tensor) -> torch.Tensor:
    """relu(u)^2 (llama.cpp LLM_FFN_RELU_SQR; HF ACT2FN["relu2"])."""
    return torch.relu(u).square()


def relu2_mlp(h: torch.Tensor, blk: Block, ctx) -> torch.Tensor:
    """The ungated MLP's hidden row relu(W_up h)^2, (T, D) -> (T, F) in h's dtype (the square in float32)."""
    if ops._backend(h) is not ops.reference:
        ops.paths.count("relu2.torch")
    return relu2(ops.linear(h, blk.ffn_up, None, ctx).float()).to(h.dtype)


class ArceeModel(Mistral3Model):
    """Mistral3Model's attention (Llama's, or YaRN's with q * c^2 when the file says yarn); the MLP here."""

    arch = "arcee"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_ARCEE -> NORM

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, D, F, q_out, kv_out = t.w, t.D, t.F, t.q_out, t.kv_out
        return Block(attn_norm=t.v("attn_norm.weight", D),
                     attn_q=w("attn_q", (q_out, D)), attn_k=w("attn_k", (kv_out, D)), attn_v=w("attn_v", (kv_out, D)),
                     attn_output=w("attn_output", (D, q_out)),
                     ffn_norm=t.v("ffn_norm.weight", D),
                     ffn_gate=None, ffn_up=w("ffn_up", (F, D)), ffn_down=w("ffn_down", (D, F)))

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "ArceeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        for suffix in _REFUSED_TENSORS:
            for i in range(cfg.n_layers):
                if f"blk.{i}.{suffix}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{suffix}' is not supported for {cls.arch} "
                                      "(llama.cpp's arcee graph has no biases and an ungated MLP)")
        m = LlamaModel.from_gguf.__func__(cls, gf, cfg, device=device, dtype=dtype, progress=progress,
                                          act_dtype=act_dtype)
        m.rope, m.q_scale = yarn_setup(gf, cls.arch, cfg)
        m.temp_beta, m.temp_len = 0.0, 0            # no attention temperature (mistral3's)
        return m

    def mlp_hidden(self, h: torch.Tensor, blk: Block, i: int, ctx) -> torch.Tensor:
        """Layer i's MLP hidden row act(W_up h), (T, D) -> (T, F): relu(W_up h)^2 here."""
        return relu2_mlp(h, blk, ctx)

    def linear_groups(self) -> list[tuple]:
        return [(b.attn_q, b.attn_k, b.attn_v) for b in self.blocks]

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, blocks = self.act_dtype, self.cfg.rms_eps, self.blocks
        x = ops.embedding(tokens, self.token_embd)                                  # (T, D) float32
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)
        for i, blk in enumerate(blocks):
            x, h = self.attention_residual_norm(h, blk, i, cache, step, ctx, x, eps, act)
            a = self.mlp_hidden(h, blk, i, ctx)
            if i + 1 < len(blocks):    # W_down, the residual add and the next layer's norm
                x, h = ops.linear_add_rms_norm(a, blk.ffn_down, x, blocks[i + 1].attn_norm, eps, act, ctx,
                                               into_linear=True)
        f = ops.linear(step.rows(a), blk.ffn_down, None, ctx)
        _, h = ops.add_rms_norm(step.rows(x), f.float(), self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)
