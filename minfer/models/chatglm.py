"""ChatGLM / GLM-4 (first release): the GGUF arch `chatglm`.

GLM-4-9B-chat (-hf and the original remote-code release), GLM-4-9B-chat-1m, glm-edge-1.5b / 4b-chat, ChatGLM3-6B:
llama.cpp's ChatGLMModel converter takes GlmForCausalLM, ChatGLMModel and ChatGLMForConditionalGeneration
(conversion/chatglm.py) and writes them all as `chatglm`.

    x_0 = E[tokens]                                           token_embd (V, D); output (V, D), or tied
    for each layer l:
        x = x + W_o attn(rope(W_q n(x) + b_q), rope(W_k n(x) + b_k), W_v n(x) + b_v)   n = RMSNorm(attn_norm)
        [g; u] = W_up n'(x)                                      n' = RMSNorm(ffn_norm); W_up (2F, D)
        x = x + W_down(silu(g) * u)
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source:
- The block is Llama's pre-norm block, without GLM-4-0414's post-norms (llama.cpp src/models/chatglm.cpp graph:
  attn_norm, build_attn, the residual add, ffn_norm, build_ffn, the residual add; HF GlmDecoderLayer). The
  tensors (chatglm.cpp load_arch_tensors): attn_norm, q/k/v by create_tensor_qkv, attn_output (D, D) without a
  bias, ffn_norm, ffn_up (2F, D), ffn_down, output_norm; `output` optional (tied to token_embd when absent).
- q/k/v either separate (GlmForCausalLM's q_proj / k_proj / v_proj) or fused as `attn_qkv` with rows q, then k,
  then v (the remote-code release's query_key_value, which the converter keeps fused); each bias optional:
  `attn_qkv.bias`, or `attn_{q,k,v}.bias` beside either form (llama-model.cpp create_tensor_qkv:
  TENSOR_NOT_REQUIRED; build_qkv adds those present). The released models have them (HF attention_bias /
  add_qkv_bias).
- The MLP's gate and up are one matrix ffn_up of 2F rows, gate first (chatglm.cpp: build_ffn with ffn_up only,
  LLM_FFN_SWIGLU: silu of the first half times the second; HF GlmMLP gate_up_proj, chunk(2): gate, up).
- RoPE NORM (adjacent pairs) on the first `rope.dimension_count` dims of each head, the rest passed through
  (llama_model_rope_type: LLM_ARCH_CHATGLM -> NORM; the converter writes dimension_count = head_dim *
  partial_rotary_factor, default 0.5, and leaves q/k unpermuted; HF's apply_rotary_pos_emb repeat_interleaves
  cos/sin over the first rotary_dim dims, i.e. rotates pairs (0, 1), (2, 3), ...). The base is the file's
  `rope.freq_base` (the converter writes 10000 * rope_ratio: glm-4-9b-chat 500 -> 5e6 for the 1m variant).
  Attention scale 1/sqrt(head_dim), head_dim = D / H (the converter writes no key_length; chatglm.cpp's
  attn_output is (D, D)).
- Refused by name: a file whose q width H * head_dim differs from D (chatglm.cpp's attn_output shape).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, BlockTensors, attention_heads, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel
from minfer.weights import QWeight


@dataclass
class ChatGLMBlock(Block):
    attn_qkv: QWeight | None = None              # (H Dh + 2 Hkv Dh, D): q, k, v rows (the fused form)
    attn_qkv_b: torch.Tensor | None = None       # its bias

    def matrices(self) -> list[QWeight]:
        return ([self.attn_qkv] if self.attn_qkv is not None else []) + super().matrices()


class ChatGLMModel(LlamaModel):
    """LlamaModel's loader, head and q/k/v groups; the block may hold a fused attn_qkv and its ffn_up holds gate
    and up (ffn_gate None)."""

    arch = "chatglm"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_CHATGLM -> NORM
    qkv_bias = True

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "ChatGLMModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        if cfg.n_heads * cfg.head_dim != cfg.d_model:
            raise MinferError(f"{gf.path}: chatglm's q width {cfg.n_heads} x {cfg.head_dim} differs from "
                              f"embedding_length {cfg.d_model} (llama.cpp's chatglm attn_output is (D, D)): "
                              "not supported")
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> ChatGLMBlock:
        t = BlockTensors(gf, cfg, i, device, dtype)
        D, F, q_out, kv_out = t.D, t.F, t.q_out, t.kv_out
        blk = ChatGLMBlock(attn_norm=t.v("attn_norm.weight", D), attn_q=None, attn_k=None, attn_v=None,
                           attn_output=t.w("attn_output", (D, q_out)), ffn_norm=t.v("ffn_norm.weight", D),
                           ffn_gate=None, ffn_up=t.w("ffn_up", (2 * F, D)), ffn_down=t.w("ffn_down", (D, F)))
        if t.has("attn_qkv.weight"):          # create_tensor_qkv: the fused form first
            blk.attn_qkv = t.w("attn_qkv", (q_out + 2 * kv_out, D))
            blk.attn_qkv_b = t.opt("attn_qkv.bias", q_out + 2 * kv_out)
        else:
            blk.attn_q, blk.attn_k, blk.attn_v = t.w("attn_q", (q_out, D)), t.w("attn_k", (kv_out, D)), \
                t.w("attn_v", (kv_out, D))
        if blk.attn_qkv_b is None:            # separate biases beside either form
            blk.attn_q_bias, blk.attn_k_bias, blk.attn_v_bias = (
                t.opt("attn_q.bias", q_out), t.opt("attn_k.bias", kv_out), t.opt("attn_v.bias", kv_out))
        return blk

    def attention(self, h: torch.Tensor, blk: ChatGLMBlock, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o attn(...) (T, D): fused or separate q/k/v."""
        c = self.cfg
        if blk.attn_qkv is None:
            heads = attention_heads(h, blk, c, cache, i, step, ctx)
        else:
            T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
            qkv = ops.linear(h, blk.attn_qkv, blk.attn_qkv_b, ctx)
            if blk.attn_qkv_b is None and blk.attn_q_bias is not None:     # fused weight, separate biases
                parts = [b if b is not None else torch.zeros(n, device=qkv.device)
                         for b, n in ((blk.attn_q_bias, H * Dh), (blk.attn_k_bias, Hkv * Dh),
                                      (blk.attn_v_bias, Hkv * Dh))]
                qkv = qkv + torch.cat(parts).to(qkv.dtype)
            q, k, v = qkv.split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
            heads = merge_heads(rope_write_attend(cache, i, q.reshape(T, H, Dh), k.reshape(T, Hkv, Dh),
                                                  v.reshape(T, Hkv, Dh), step, c.rope, ctx))
        return ops.linear(heads, blk.attn_output, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, F = self.act_dtype, self.cfg.rms_eps, self.cfg.ffn
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        h = ops.rms_norm(x, self.blocks[0].attn_norm, eps).to(act)
        for i, blk in enumerate(self.blocks):
            a = self.attention(h, blk, i, cache, step, ctx)
            x, h = ops.add_rms_norm(x, a.float(), blk.ffn_norm, eps, act, ctx)
            gate_up = ops.linear(h, blk.ffn_up, None, ctx)                     # (T, 2F)
            f = ops.linear(ops.swiglu(gate_up[:, :F].contiguous(), gate_up[:, F:].contiguous()),
                           blk.ffn_down, None, ctx)
            if i + 1 < len(self.blocks):
                x, h = ops.add_rms_norm(x, f.float(), self.blocks[i + 1].attn_norm, eps, act, ctx)
        x, f = step.rows(x), step.rows(f.float())                  # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)
