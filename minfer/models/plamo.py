"""PLaMo-13B (Preferred Networks; HF PlamoForCausalLM, remote code): the GGUF arch `plamo` (v1; not plamo2 / plamo3).

    x_0 = E[tokens]                                   token_embd (V, D)
    for each layer l:
        h = RMSNorm(x; attn_norm)                     one norm feeds both branches
        x = x + W_o attn(rope(W_q h), rope(W_k h), W_v h)
              + W_down(silu(W_gate h) * W_up h)       attention and MLP in parallel
    logits = W_out RMSNorm(x; output_norm)            output (V, D), required

Llama's weights without ffn_norm, in a parallel block; each rule and its source (llama.cpp src/models/plamo.cpp;
conversion/plamo.py PlamoModel; HF modeling_plamo PlamoDecoderLayer):
- Parallel block: the attention and the SwiGLU MLP both read the attn_norm output, and their sum joins the
  residual (plamo.cpp: build_ffn(sa_inp), then ffn + sa_out, then + inpL; HF: residual + hidden_states_sa +
  hidden_states_mlp). No ffn_norm (load_arch_tensors creates none). RMSNorm, eps
  `plamo.attention.layer_norm_rms_epsilon` (load_arch_hparams: required).
- RoPE NEOX, halves (llama_model_rope_type: LLM_ARCH_PLAMO -> NEOX; HF rotate_half; the converter permutes no
  rows within a head), over whole heads (plamo.cpp asserts n_embd_head == n_rot). Base 10000: the converter
  writes no rope.freq_base (llama.cpp's default; the remote code's RotaryEmbedding base).
- GQA as llama's: query head j reads kv head j // (H / Hkv), with `plamo.attention.head_count_kv` from the file.
  HF shares its kv heads TILED (query head j reads kv head j % Hkv: _expand_kv); the converter reorders attn_q's
  rows and attn_output's columns by head (shuffle_attn_q_weight / shuffle_attn_output_weight: (n_shared, Hkv)
  -> (Hkv, n_shared)) so llama's grouping on the file equals HF's on the checkpoint. It writes head_count_kv
  itself (5 for the 13B's 40 heads / n_shared_head 8), not config.json's num_key_value_heads.
- Scale 1/sqrt(head_dim); no biases; untied head: `output.weight` required (load_arch_tensors flag 0).
- Refused by name: q/k/v biases or a fused attn_qkv (create_tensor_qkv would take them; the converter writes
  neither and PLaMo has none), an ffn_norm, rope_freqs (ggml_rope_ext gets nullptr), a partial rope.
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import (Block, BlockTensors, attention_branch, ffn_branch, ffn_hidden, refuse_layer_tensors,
                                  refuse_per_layer_shapes, require_output)
from minfer.models.llama import LlamaModel

_REFUSED_TENSORS = ("attn_qkv.weight", "attn_qkv.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias",
                    "attn_output.bias", "ffn_norm.weight", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias")


class PlamoModel(LlamaModel):
    """LlamaModel's weights without ffn_norm (Block.ffn_norm None); the forward is the parallel block."""

    arch = "plamo"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_PLAMO -> NEOX

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "PlamoModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        if cfg.rope.n_rot != cfg.head_dim:        # plamo.cpp: GGML_ASSERT(n_embd_head == n_rot)
            raise MinferError(f"{gf.path}: {cls.arch}.rope.dimension_count {cfg.rope.n_rot} != head_dim "
                              f"{cfg.head_dim} (llama.cpp's plamo graph rotates whole heads only)")
        refuse_per_layer_shapes(gf, cfg)
        if cfg.rope.freq_factors is not None:     # plamo.cpp passes no rope factors to ggml_rope_ext
            raise MinferError(f"{gf.path}: tensor 'rope_freqs.weight' is not supported for {cls.arch} "
                              "(llama.cpp's plamo loader creates no such tensor)")
        require_output(gf, cfg, cls.arch)         # load_arch_tensors: output with flag 0
        refuse_layer_tensors(gf, cfg, _REFUSED_TENSORS, "conversion/plamo.py writes separate attn_q/k/v "
                                                        "without biases and no ffn_norm: one norm feeds both "
                                                        "branches")
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        """blk.i's tensors (plamo.cpp load_arch_tensors): attn_norm, attn_q/k/v/output, ffn_gate/up/down."""
        t = BlockTensors(gf, cfg, i, device, dtype)
        D, F = t.D, t.F
        return Block(attn_norm=t.v("attn_norm.weight", D), attn_q=t.w("attn_q", (t.q_out, D)),
                     attn_k=t.w("attn_k", (t.kv_out, D)), attn_v=t.w("attn_v", (t.kv_out, D)),
                     attn_output=t.w("attn_output", (D, t.q_out)), ffn_norm=None,
                     ffn_gate=t.w("ffn_gate", (F, D)), ffn_up=t.w("ffn_up", (F, D)), ffn_down=t.w("ffn_down", (D, F)))

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        # x: the float32 residual stream; h: its attn_norm in the matmuls' dtype, read by both branches (so it is
        # made whole: no norm left to one GEMV). Per layer: a = attn(h); x, h = x + a + ffn(h), next_norm(...)
        # with the down projection, the residual add and the next norm in one op (ops.linear_add_rms_norm).
        act, eps, blocks = self.act_dtype, self.cfg.rms_eps, self.blocks
        x = ops.embedding(tokens, self.token_embd)                                  # (T, D) float32
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)                # (T, D) act
        for i, blk in enumerate(blocks):
            a = attention_branch(h, blk, self.cfg, cache, i, step, ctx)             # (T, D) act: W_o attn(h)
            if i + 1 < len(blocks):
                x, h = ops.linear_add_rms_norm(ffn_hidden(h, blk, ctx), blk.ffn_down, x + a.float(),
                                               blocks[i + 1].attn_norm, eps, act, ctx)
            else:     # plamo.cpp: the last layer's MLP and adds on the output rows only
                x, h, a = step.rows(x), step.rows(h), step.rows(a)
                _, h = ops.add_rms_norm(x + a.float(), ffn_branch(h, blk, ctx).float(), self.output_norm, eps,
                                        act, ctx)
        return self.head(h, ctx)      # (R, V)
