"""Jais v1 (inceptionai / core42 Jais-13B, Jais-30B and the jais-family models; HF JAISLMHeadModel, remote code):
the GGUF arch `jais` (not `jais2`: models/jais2.py).

    x_0 = E[tokens]                                     token_embd: HF wte times embeddings_scale (the converter's)
    for each layer l:
        h = LN(x; attn_norm, attn_norm.bias)
        q, k, v = split(W_qkv h + b_qkv)                rows: D q, D k, D v
        x = x + W_o attn_alibi(q, k, v) + b_o           no rope; scores q.k / Dh (not sqrt) + ALiBi's - m_h |p - j|
        h = LN(x; ffn_norm, ffn_norm.bias)
        x = x + W_down(silu(W_gate h + b_gate) * (W_up h + b_up)) + b_down
    logits = W_out LN(x; output_norm, output_norm.bias)  output: HF lm_head times width_scale (the converter's)

bloom.py's computation (ALiBi, LayerNorms with bias, the fused biased q/k/v) with Jais's rules. Each rule and its
source (llama.cpp src/models/jais.cpp: load_arch_hparams, load_arch_tensors, the graph; src/llama-model.cpp
llama_model_rope_type and use_alibi; conversion/jais.py JaisModel; HF modeling_jais.py JAISModel / JAISAttention /
JAISMLP / SwiGLUActivation / AlibiPositionEmbeddingLayer / JAISLMHeadModel):
- The muP scales are in the file, not in the graph: the converter multiplies token_embd by embeddings_scale (or
  mup_embeddings_scale) and output by width_scale (or mup_output_alpha * mup_width_scale) (JaisModel.modify_tensors;
  HF scales the embeddings' output and the logits, the same products), and jais.cpp applies neither. minfer applies
  none either (tests/models/test_jais.py: applied again, both references miss).
- Attention scale 1/head_dim, not 1/sqrt(head_dim) (jais.cpp build_attn(..., 1.0f/float(n_embd_head)); HF
  attn_scale_power 1.0 with scale_qk_dot_by_d / mup_scale_qk_dot_by_d, true in the releases; no GGUF key records
  it, and llama.cpp's graph always takes 1/d), the ALiBi term unscaled (ggml_soft_max_ext adds the mask after the
  scale; HF adds position_bias after the division).
- ALiBi with max_bias `jais.attention.max_alibi_bias` (load_arch_hparams reads it, optional; use_alibi only when it is
  > 0: llama-model.cpp). The converter writes it always, from HF's relative_pe.slopes (-round(log2(slopes[0]) *
  2^floor(log2 H)): 8 for the releases' Press slopes); a file without it or with 0 has no position information at
  all in llama.cpp and is refused by name, as is `position_embd.weight` (HF's learned-position variant, which the
  converter asserts against: the loader would take no such tensor). The slopes are ggml's m0 / m1 rule
  (ops.reference.alibi_slopes), which are HF's _get_alibi_slopes for any head count (Jais-13B has 40 heads, not a
  power of two; tests/models/test_jais.py); HF adds - m_h |p - j| as the kq mask does.
- LayerNorm (mean removed) with weight AND bias (build_norm(..., LLM_NORM); HF nn.LayerNorm), eps
  `jais.attention.layer_norm_epsilon` (required), pre-norm, sequential residuals (jais.cpp ffn_inp = cur + inpL);
  no embedding norm.
- q/k/v from one matrix `blk.N.attn_qkv.weight` (D + 2 Hkv Dh, D) with its bias (both flag 0), rows q, k, v (HF's
  Conv1D c_attn split q | k | v, transposed by the converter); head_count_kv from the file (the converter writes
  none: MHA). Separate q/k/v refused by name (the loader takes attn_qkv only).
- The SwiGLU MLP with three biases, all required (build_ffn(up, up_b, gate, gate_b, down, down_b, LLM_FFN_SILU,
  LLM_FFN_PAR)): silu(gate) * up. HF SwiGLUActivation(c_fc(h), c_fc2(h)) = c_fc(h) * silu(c_fc2(h)), and gguf-py's
  tensor_mapping writes c_fc as ffn_up, c_fc2 as ffn_gate.
- The lm head: `output.weight`, required (flag 0: no fallback to the embedding, which would miss width_scale);
  a file without it is refused by name, as llama.cpp's loader refuses it.
- The batch engine's paged cache has no ALiBi: paged_kv False (BatchEngine refuses it by name; `minfer serve`
  serves one request at a time), as bloom / mpt / refact. On CUDA the attention is the counted torch path
  attention.alibi.torch, prefill and decode alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.bloom import BloomModel, file_max_alibi_bias
from minfer.models.layers import Block, BlockTensors, merge_heads
from minfer.models.starcoder import StarcoderBlock
from minfer.models.starcoder2 import layer_norm
from minfer.weights import QWeight, load_vector

# global tensors llama.cpp's jais loader does not create (the graph has no position table, no embedding norm)
_REFUSED_GLOBAL = ("position_embd.weight", "token_embd_norm.weight", "token_embd_norm.bias")


@dataclass
class JaisBlock(StarcoderBlock):
    ffn_gate_b: torch.Tensor | None = None       # (F,)

    def matrices(self) -> list[QWeight]:
        """The fused q/k/v matrix, the output projection and the three MLP matrices."""
        return [self.attn_qkv, self.attn_output, self.ffn_gate, self.ffn_up, self.ffn_down]


class JaisModel(BloomModel):
    arch = "jais"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_JAIS -> NONE (never applied: no rope)
    norm_eps_key = "attention.layer_norm_epsilon"
    paged_kv = False          # the paged cache has no ALiBi

    @classmethod
    def max_alibi_bias(cls, gf) -> float:
        """The file's `jais.attention.max_alibi_bias` (> 0: llama.cpp's use_alibi), else a MinferError."""
        return file_max_alibi_bias(gf, cls.arch, "a Jais file", "; conversion/jais.py always writes it")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "JaisModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        for name in _REFUSED_GLOBAL:
            if name in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{name}' is not supported for {cls.arch} (llama.cpp's jais "
                                  "graph has no position table and no embedding norm: ALiBi only)")
        if "output.weight" not in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'output.weight' is missing: llama.cpp's jais loader requires it "
                              "(the lm head carries width_scale; the embedding is no fallback)")
        if cfg.n_experts > 0:
            raise MinferError(f"{gf.path}: {cls.arch}.expert_count={cfg.n_experts}: a mixture of experts is not "
                              f"supported for {cls.arch} (llama.cpp's jais graph builds the dense MLP only)")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.kq_scale = 1.0 / cfg.head_dim          # jais.cpp build_attn kq_scale 1.0f/float(n_embd_head)
        return m

    def load_embd_norm(self, gf, cfg: ModelConfig, device) -> None:
        """No embedding norm; the output norm's bias (required: jais.cpp output_norm_b flag 0)."""
        self.embd_norm = self.embd_norm_b = None
        self.output_norm_b = load_vector(gf, "output_norm.bias", device, cfg.d_model)

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        """Every tensor of llama_model_jais::load_arch_tensors' layer, all required (flag 0)."""
        t = BlockTensors(gf, cfg, i, device, dtype)
        w, v, D, Fw, q_out, kv_out = t.w, t.v, t.D, t.F, t.q_out, t.kv_out
        return JaisBlock(
            attn_norm=v("attn_norm.weight", D), attn_norm_b=v("attn_norm.bias", D),
            attn_q=None, attn_k=None, attn_v=None,
            attn_qkv=w("attn_qkv", (q_out + 2 * kv_out, D)), attn_qkv_b=v("attn_qkv.bias", q_out + 2 * kv_out),
            attn_output=w("attn_output", (D, q_out)), attn_output_b=v("attn_output.bias", D),
            ffn_norm=v("ffn_norm.weight", D), ffn_norm_b=v("ffn_norm.bias", D),
            ffn_gate=w("ffn_gate", (Fw, D)), ffn_gate_b=v("ffn_gate.bias", Fw),
            ffn_up=w("ffn_up", (Fw, D)), ffn_up_b=v("ffn_up.bias", Fw),
            ffn_down=w("ffn_down", (D, Fw)), ffn_down_b=v("ffn_down.bias", D))

    # ---- the forward ----

    def attention(self, h: torch.Tensor, blk: JaisBlock, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o attn_alibi(...) + b_o (T, D), scores scaled by 1/Dh."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear(h, blk.attn_qkv, blk.attn_qkv_b, ctx).split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
        cache.write(i, k.reshape(T, Hkv, Dh), v.reshape(T, Hkv, Dh), step)
        o = cache.attend(i, q.reshape(T, H, Dh), step, ctx, scale=self.kq_scale, alibi=self.alibi)   # (T, H, Dh)
        return ops.linear(merge_heads(o), blk.attn_output, blk.attn_output_b, ctx)

    def mlp(self, h: torch.Tensor, blk: JaisBlock, ctx) -> torch.Tensor:
        """W_down(silu(W_gate h + b_gate) * (W_up h + b_up)) + b_down, (T, D) -> (T, D)."""
        gate, up = ops.linear_many(h, (blk.ffn_gate, blk.ffn_up), (blk.ffn_gate_b, blk.ffn_up_b), ctx)
        return ops.linear(ops.swiglu(gate, up, ctx), blk.ffn_down, blk.ffn_down_b, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps, last = self.act_dtype, self.cfg.rms_eps, len(self.blocks) - 1
        x = ops.embedding(tokens, self.token_embd).float()                            # (T, D)
        for i, blk in enumerate(self.blocks):
            a = self.attention(layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act), blk, i, cache, step, ctx)
            if i == last:     # jais.cpp: the last layer's adds and MLP on the output rows only
                x, a = step.rows(x), step.rows(a)
            x = x + a.float()
            x = x + self.mlp(layer_norm(x, blk.ffn_norm, blk.ffn_norm_b, eps, act), blk, ctx).float()
        h = layer_norm(x, self.output_norm, self.output_norm_b, eps, act)              # (R, D)
        return self.head(h, ctx)          # (R, V)
