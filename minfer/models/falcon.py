"""Falcon (7B, 40B, 180B; Falcon2-11B): the GGUF arch `falcon`.

    x_0 = E[tokens]                                       token_embd (V, D); output, or the embedding when tied
    for each layer l:
        m = LN(x; attn_norm, attn_norm.bias)
        a = LN(x; attn_norm_2, attn_norm_2.bias) if the layer has attn_norm_2 (40B / 180B) else m
        q, k, v = split(W_qkv a)                          rows: H*Dh q, Hkv*Dh k, Hkv*Dh v
        x = x + W_down gelu(W_up m) + W_o attn(rope(q), rope(k), v)     attention and MLP in parallel
    logits = W_out LN(x; output_norm, output_norm.bias)

Each rule and its source (llama.cpp src/models/falcon.cpp, src/llama-model.cpp; conversion/falcon.py
FalconModel; HF modeling_falcon FalconDecoderLayer / FalconAttention / FalconMLP):
- LayerNorm (mean removed) with weight AND bias, eps `falcon.attention.layer_norm_epsilon`
  (build_norm(..., attn_norm, attn_norm_b, LLM_NORM); load_arch_hparams: LLM_KV_ATTENTION_LAYERNORM_EPS;
  HF LayerNorm(layer_norm_epsilon)). The norm biases are required (load_arch_tensors flag 0).
- Attention and MLP in parallel, both added to the residual (falcon.cpp: cur = ffn + attn_out + inpL;
  HF: mlp_output += attention_output; residual + mlp_output). The MLP reads attn_norm's output ("use the
  attn norm, not the result"). The attention reads `blk.N.attn_norm_2` when the layer has it (optional:
  TENSOR_NOT_REQUIRED, Falcon-40B/180B's ln_attn; the converter maps ln_mlp to attn_norm, ln_attn to
  attn_norm_2: gguf-py tensor_mapping), else attn_norm's output too (Falcon-7B's input_layernorm,
  Falcon2-11B's num_ln_in_parallel_attn 1). attn_norm_2.bias is optional as in llama.cpp.
- q/k/v from one matrix `blk.N.attn_qkv.weight` (H*Dh + 2*Hkv*Dh, D), rows q, then k, then v
  (build_qkv's fused path). The converter regroups HF's per-kv-group rows (each group's queries, its
  key, its value: HF FalconAttention new_decoder_architecture / multi_query) into that order
  (conversion/falcon.py modify_tensors, "jploski" layout). Multi-query (7B: head_count_kv 1) and grouped kv
  (40B: 8) alike. Separate attn_q/k/v are not loaded by llama.cpp (attn_qkv flag 0) and are refused here.
- No linear biases (load_arch_tensors loads none; HF bias=False in the released Falcon-7B/40B/180B/11B
  configs). A file with `blk.0.attn_qkv.bias` (Falcon-RW's bias=True, ALiBi models) or `blk.0.ffn_norm.weight`
  (parallel_attn False: HF's post_attention_layernorm) is refused by name: llama.cpp's loader refuses the
  unused tensor ("wrong number of tensors").
- The MLP is not gated: W_down gelu(W_up m) (build_ffn(..., LLM_FFN_GELU, LLM_FFN_SEQ); HF FalconMLP
  dense_h_to_4h / dense_4h_to_h, activation "gelu"). GELU in its exact erf form, as HF (get_activation("gelu"),
  the model as trained); llama.cpp's ggml_gelu is the tanh approximation, within 1e-3 of a value of it.
  Applied with torch's gelu on both backends.
- RoPE NEOX over the whole head (llama_model_rope_type: LLM_ARCH_FALCON -> NEOX; falcon.cpp asserts
  n_rot == head_dim; HF rotate_half), freq_base from `falcon.rope.freq_base` or 10000 (the converter
  writes none; HF's default rope_theta). Attention scale 1/sqrt(head_dim) (falcon.cpp; HF inv_norm_factor).
- The lm head: `output.weight`, else the embedding (load_arch_tensors: TENSOR_NOT_REQUIRED, then
  token_embd TENSOR_DUPLICATED; HF ties lm_head to word_embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, BlockTensors, merge_heads, rope_write_attend
from minfer.models.llama import LlamaModel
from minfer.weights import QWeight, load_vector

# tensors of Falcon variants llama.cpp's falcon graph does not run: name -> why
REFUSED = {
    "blk.0.attn_qkv.bias": "linear biases (Falcon-RW style, bias=True) are not part of llama.cpp's falcon graph",
    "blk.0.attn_output.bias": "linear biases (Falcon-RW style, bias=True) are not part of llama.cpp's falcon graph",
    "blk.0.ffn_up.bias": "linear biases (Falcon-RW style, bias=True) are not part of llama.cpp's falcon graph",
    "blk.0.ffn_norm.weight": "a norm before the MLP (parallel_attn False) is not part of llama.cpp's falcon graph",
    "blk.0.attn_q.weight": "separate q/k/v matrices: llama.cpp's falcon loader takes the fused attn_qkv only",
}


@dataclass
class FalconBlock(Block):
    attn_norm_b: torch.Tensor | None = None      # (D,) the MLP's norm (and the attention's without attn_norm_2)
    attn_norm_2: torch.Tensor | None = None      # (D,) the attention's norm (40B / 180B), or None
    attn_norm_2_b: torch.Tensor | None = None    # (D,) or None
    attn_qkv: QWeight | None = None              # (H*Dh + 2*Hkv*Dh, D)

    def matrices(self) -> list[QWeight]:
        """The fused q/k/v matrix, the output projection and the two MLP matrices."""
        return [self.attn_qkv, self.attn_output, self.ffn_up, self.ffn_down]


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float, out_dtype) -> torch.Tensor:
    """LayerNorm with bias (ggml_norm, * w, + b when there is one): (N, D) float32 -> out_dtype."""
    y = ops.layer_norm(x, w, eps, torch.float32)
    return (y + b if b is not None else y).to(out_dtype)


class FalconModel(LlamaModel):
    arch = "falcon"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_FALCON -> NEOX
    norm_eps_key = "attention.layer_norm_epsilon"

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "FalconModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        for name, why in REFUSED.items():
            if name in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{name}': {why}")
        if cfg.head_dim * cfg.n_heads != cfg.d_model:
            raise MinferError(f"{gf.path}: falcon needs head_count * head size == embedding_length (the output "
                              f"projection is (D, D)); got {cfg.n_heads} x {cfg.head_dim} != {cfg.d_model}")
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: falcon rotates the whole head (falcon.cpp asserts n_rot == head size); "
                              f"{cfg.arch}.rope.dimension_count is {cfg.rope.n_rot}, the head size {cfg.head_dim}")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.output_norm_b = load_vector(gf, "output_norm.bias", device, m.cfg.d_model)
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, D, Fw, q_out, kv_out = t.w, t.v, t.D, t.F, t.q_out, t.kv_out
        norm2 = t.has("attn_norm_2.weight")
        return FalconBlock(
            attn_norm=v("attn_norm.weight", D), attn_norm_b=v("attn_norm.bias", D),
            attn_norm_2=v("attn_norm_2.weight", D) if norm2 else None,
            attn_norm_2_b=t.opt("attn_norm_2.bias", D) if norm2 else None,
            attn_q=None, attn_k=None, attn_v=None, attn_qkv=w("attn_qkv", (q_out + 2 * kv_out, D)),
            attn_output=w("attn_output", (D, q_out)), ffn_norm=None, ffn_gate=None,
            ffn_up=w("ffn_up", (Fw, D)), ffn_down=w("ffn_down", (D, Fw)))

    # ---- the forward ----

    def attention(self, h: torch.Tensor, blk: FalconBlock, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o attn(...) (T, D)."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear(h, blk.attn_qkv, None, ctx).split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
        o = rope_write_attend(cache, i, q.reshape(T, H, Dh), k.reshape(T, Hkv, Dh), v.reshape(T, Hkv, Dh), step,
                              c.rope, ctx)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def mlp(self, h: torch.Tensor, blk: FalconBlock, ctx) -> torch.Tensor:
        """W_down gelu(W_up h), GELU's exact erf form, (T, D) -> (T, D)."""
        u = ops.linear(h, blk.ffn_up, None, ctx)
        return ops.linear(F.gelu(u.float()).to(h.dtype), blk.ffn_down, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = ops.embedding(tokens, self.token_embd)                                     # (T, D) float32
        for i, blk in enumerate(self.blocks):
            m = layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act)               # the MLP's input
            h = m if blk.attn_norm_2 is None else layer_norm(x, blk.attn_norm_2, blk.attn_norm_2_b, eps, act)
            a = self.attention(h, blk, i, cache, step, ctx)
            if i == last:     # falcon.cpp: the last layer's MLP and adds on the output rows only
                x, m, a = step.rows(x), step.rows(m), step.rows(a)
            x = (self.mlp(m, blk, ctx).float() + a.float()) + x                       # falcon.cpp: (ffn + attn) + inpL
        h = layer_norm(x, self.output_norm, self.output_norm_b, eps, act)              # (R, D)
        return self.head(h, ctx)          # (R, V)
