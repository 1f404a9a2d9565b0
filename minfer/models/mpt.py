"""MosaicML MPT-7B / 30B and their fine-tunes (HF MptForCausalLM): the GGUF arch `mpt`.

    x_0 = E[tokens]                                     no positions, no rope
    for each layer l:
        h = LN(x; attn_norm)                            no bias
        q, k, v = split(clamp(W_qkv h, -c, c))          rows: D q, D k, D v; c: attention.clamp_kqv if present
        x = x + W_o attn_alibi(q, k, v)                 scores + ALiBi's - m_h |p - j|
        h = LN(x; ffn_norm)
        x = x + W_down gelu(W_up h)
    logits = W_out LN(x; output_norm)                   output, or the embedding when tied

Each rule and its source (llama.cpp src/models/mpt.cpp, src/llama-model.cpp, src/llama-graph.cpp build_qkv;
conversion/mpt.py MPTModel; HF modeling_mpt MptModel / MptAttention / MptMLP / build_mpt_alibi_tensor):
- ALiBi (bloom.py's rule and op) with max_bias `mpt.attention.max_alibi_bias` (load_arch_hparams reads it, optional;
  use_alibi only when it is > 0: llama-model.cpp). The converter writes attn_config.alibi_bias_max, or 0 for a
  model without ALiBi; such a file (or one without the key) has no position information at all here and is
  refused by name, as is `position_embd.weight` (MosaicML's learned_pos_emb; llama.cpp adds it, HF has none).
  HF build_mpt_alibi_tensor's slopes (2^ceil(log2 H) bases, odd then even ones for a head count not a power of
  two) are ggml's m0 / m1 rule: the same numbers (tests/models/test_mpt.py). HF adds the bias unscaled after the
  1/sqrt(head_dim) scale (softmax_scale None), as ggml_soft_max_ext.
- `mpt.attention.clamp_kqv` c > 0: the fused q/k/v output clamped to [-c, c] before the split (build_qkv:
  ggml_clamp(qkv, -c, c) when f_clamp_kqv > 0; HF clip_qkv on mixed_qkv); absent: no clamp.
- LayerNorm (mean removed) with a weight; a bias only where the file has one (TENSOR_NOT_REQUIRED; HF sets
  norm_1 / norm_2 / norm_f bias None; the converter writes eps 1e-5 always), sequential residuals (mpt.cpp).
- q/k/v from one matrix `blk.N.attn_qkv.weight` (3 D, D), rows q, k, v (HF Wqkv chunk(3)); the linears' biases
  optional (TENSOR_NOT_REQUIRED; HF no_bias: none), used where present. head_count_kv from the file (the
  converter writes kv_n_heads only when set). Separate q/k/v, q/k norms (attn_q_norm / attn_k_norm) and AWQ's
  ffn_act.scales are refused by name (not implemented).
- The ungated MLP of `feed_forward_length` (4 D) with GELU: exact erf as HF (MptMLP nn.GELU(approximate="none"));
  llama.cpp's ggml_gelu is the tanh form (3.9e-4 from HF on the fixture, under the 1e-3 tolerance; falcon.py chose the same way).
- The lm head: `output.weight`, else the embedding (TENSOR_NOT_REQUIRED then TENSOR_DUPLICATED; HF ties lm_head).
- paged_kv False, the CUDA path attention.alibi.torch: as bloom.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.bloom import BloomModel, file_max_alibi_bias
from minfer.models.layers import Block, BlockTensors, merge_heads, optional_vector
from minfer.models.starcoder import StarcoderBlock
from minfer.models.starcoder2 import layer_norm

UNSUPPORTED = ("position_embd.weight", "blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight",
               "blk.0.ffn_act.scales")


class MptModel(BloomModel):
    arch = "mpt"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_MPT -> NONE (never applied: no rope)
    norm_eps_key = "attention.layer_norm_epsilon"
    paged_kv = False          # the paged cache has no ALiBi

    @classmethod
    def max_alibi_bias(cls, gf) -> float:
        v = file_max_alibi_bias(gf, cls.arch, "an MPT")
        for name in UNSUPPORTED:
            if name in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{name}': not supported for {cls.arch} (HF's MPT has no "
                                  f"learned positions, q/k norms or AWQ activation scales)")
        return v

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "MptModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        clamp = gf.get(f"{cls.arch}.attention.clamp_kqv", None)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.clamp_kqv = float(clamp) if clamp is not None and float(clamp) > 0 else 0.0
        return m

    def load_embd_norm(self, gf, cfg: ModelConfig, device) -> None:
        self.embd_norm = self.embd_norm_b = None
        self.output_norm_b = optional_vector(gf, "output_norm.bias", device, cfg.d_model, zero=True)

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, D, Fw, q_out, kv_out = t.w, t.opt, t.D, t.F, t.q_out, t.kv_out
        return StarcoderBlock(
            attn_norm=t.v("attn_norm.weight", D), attn_norm_b=v("attn_norm.bias", D, True),
            attn_q=None, attn_k=None, attn_v=None,
            attn_qkv=w("attn_qkv", (q_out + 2 * kv_out, D)), attn_qkv_b=v("attn_qkv.bias", q_out + 2 * kv_out),
            attn_output=w("attn_output", (D, q_out)), attn_output_b=v("attn_output.bias", D),
            ffn_norm=t.v("ffn_norm.weight", D), ffn_norm_b=v("ffn_norm.bias", D, True),
            ffn_gate=None, ffn_up=w("ffn_up", (Fw, D)), ffn_up_b=v("ffn_up.bias", Fw),
            ffn_down=w("ffn_down", (D, Fw)), ffn_down_b=v("ffn_down.bias", D))

    # ---- the forward ----

    def attention(self, h: torch.Tensor, blk: StarcoderBlock, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o attn_alibi(clamp(W_qkv h)) (T, D)."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        qkv = ops.linear(h, blk.attn_qkv, blk.attn_qkv_b, ctx)
        if self.clamp_kqv > 0:
            qkv = qkv.clamp(-self.clamp_kqv, self.clamp_kqv)
        q, k, v = qkv.split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
        cache.write(i, k.reshape(T, Hkv, Dh), v.reshape(T, Hkv, Dh), step)
        o = cache.attend(i, q.reshape(T, H, Dh), step, ctx, alibi=self.alibi)          # (T, H, Dh)
        return ops.linear(merge_heads(o), blk.attn_output, blk.attn_output_b, ctx)

    def mlp(self, h: torch.Tensor, blk: StarcoderBlock, ctx) -> torch.Tensor:
        """W_down gelu_erf(W_up h), (T, D) -> (T, D)."""
        u = ops.linear(h, blk.ffn_up, blk.ffn_up_b, ctx)
        return ops.linear(F.gelu(u.float()).to(h.dtype), blk.ffn_down, blk.ffn_down_b, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = ops.embedding(tokens, self.token_embd).float()                            # (T, D)
        for i, blk in enumerate(self.blocks):
            a = self.attention(layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act), blk, i, cache, step, ctx)
            if i == last:     # mpt.cpp: the last layer's adds and MLP on the output rows only
                x, a = step.rows(x), step.rows(a)
            x = x + a.float()
            x = x + self.mlp(layer_norm(x, blk.ffn_norm, blk.ffn_norm_b, eps, act), blk, ctx).float()
        h = layer_norm(x, self.output_norm, self.output_norm_b, eps, act)              # (R, D)
        return self.head(h, ctx)          # (R, V)
