"""Refact (smallcloudai Refact-1_6B-fim / -base, HF GPTRefactForCausalLM, remote code): the GGUF arch `refact`.

    x_0 = E[tokens]                                   token_embd (V, D); no position embeddings, no rope
    for each layer l:
        h = RMSNorm(x; attn_norm)
        x = x + W_o attn_alibi(W_q h, W_k h, W_v h)   one kv head (MQA); scores + ALiBi's - m_h |p - j|
        h = RMSNorm(x; ffn_norm)
        x = x + W_down(silu(W_gate h) * W_up h)
    logits = W_out RMSNorm(x; output_norm)            output (V, D), or token_embd when tied

Llama's graph with ALiBi for rope; each rule and its source (llama.cpp src/models/refact.cpp, src/llama-model.cpp
llama_model_rope_type, src/llama-graph.cpp build_qkv / build_attn, src/llama-kv-cache.cpp set_input_kq_mask;
conversion/refact.py RefactModel; HF modeling_gpt_refact.py Attention / MLP / GPTRefactBlock / _get_slopes /
get_alibi_biases):
- No rope (llama_model_rope_type: LLM_ARCH_REFACT -> NONE; rope_style "normal" is declared for the registry only,
  never applied) and no position table. Positions enter through ALiBi only: each head's scaled score gets
  - m_h |p - j| (the kq mask's -|p0 - p1| times ggml_soft_max_ext's slope), max_bias 8 fixed by the loader
  (refact.cpp load_arch_hparams: f_max_alibi_bias = 8.0f, "TODO: become GGUF KV parameter"; no key is read). The
  slopes are ggml's m0 / m1 rule (ops.reference.alibi_slopes, bloom.py's op), which are HF _get_slopes' (2^(-8/n)
  powers for the n = 2^floor(log2 H) first heads, odd powers of 2^(-4/n) after; tests/models/test_refact.py).
  HF adds m_h (j + 1) (get_alibi_biases: the causal mask's cumsum), per query row a constant apart: the same
  softmax. The ALiBi term unscaled, the scores 1/sqrt(head_dim) (refact.cpp kq_scale; HF query * head_dim^-0.5).
- The norms: RMSNorm times the weight, no bias, eps `refact.attention.layer_norm_rms_epsilon` (refact.cpp
  build_norm(..., LLM_NORM_RMS) for attn_norm, ffn_norm and output_norm). HF's GPTRefactBlock uses
  LayerNormNoBias (F.layer_norm: the mean removed) for ln_1 / ln_2 / ln_f, which llama.cpp does not do; minfer
  follows llama.cpp, the GGUF format's engine (as phimoe.py). On the fixture HF's LayerNorm forward is 1.5 (max
  rel) from these logits (tests/data/arch/refact.json hf_layernorm_rel_err, tools/gen_refact_fixture.py).
- q, k, v separate and without biases: the converter splits HF's attn.kv (2 Dh, D) into attn_k (its first Dh
  rows) and attn_v, and writes head_count_kv 1 (HF kv_attn_heads = 1: multi-query); query head h reads the one kv
  head (GQA broadcast). attn_output without bias in the graph (build_attn(..., wo, NULL, ...)).
- The SwiGLU MLP (build_ffn(..., LLM_FFN_SILU, LLM_FFN_PAR) without biases): the converter splits HF's
  mlp.gate_up_proj (2F, D) into ffn_gate (the first F rows) and ffn_up; F = feed_forward_length.
- The lm head: `output.weight`, else the embedding (load_arch_tensors: TENSOR_NOT_REQUIRED, then
  TENSOR_DUPLICATED).
- Refused by name: tensors the loader creates but the graph never applies (attn_output.bias, ffn_gate/up/down
  biases: build_attn / build_ffn get NULL; rope_freqs / rope factors: no rope), a fused attn_qkv and q/k/v biases
  (build_qkv would take them; the converter writes none and HF has none), MoE tensors (the loader's n_expert > 0
  branch, with which refact.cpp's dense build_ffn would have no ffn_up / ffn_gate).
- The batch engine's paged cache has no ALiBi: paged_kv False (BatchEngine refuses it by name; `minfer serve`
  serves one request at a time), as bloom / mpt. On CUDA the attention is the counted torch path
  attention.alibi.torch (ops.attention with alibi), prefill and decode alike.
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, merge_heads
from minfer.models.llama import LlamaModel
from minfer.ops.reference import alibi_slopes

REFACT_MAX_ALIBI_BIAS = 8.0    # llama.cpp llama_model_refact::load_arch_hparams: f_max_alibi_bias = 8.0f

# blk.N.<name> tensors refused (see the module docstring), and global ones (tn(LLM_TENSOR_ROPE_FREQS, "weight", i)
# is the one global `rope_freqs.weight`)
_REFUSED_BLOCK = ("attn_qkv.weight", "attn_qkv.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias",
                  "attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias", "ffn_gate_inp.weight")
_REFUSED_GLOBAL = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight",
                   "position_embd.weight")


class RefactModel(LlamaModel):
    """LlamaModel with ALiBi (m.alibi: the (H,) slopes) instead of rope, one kv head."""

    arch = "refact"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_REFACT -> NONE (never applied: no rope)
    paged_kv = False          # the paged cache has no ALiBi

    @classmethod
    def check_tensors(cls, gf, cfg: ModelConfig) -> None:
        """Refuse by name the tensors this graph would not apply as the file means them."""
        for name in _REFUSED_GLOBAL:
            if name in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{name}' is not supported for {cls.arch} (llama.cpp's refact "
                                  "graph has no rope and no position table: ALiBi only)")
        for i in range(cfg.n_layers):
            for suffix in _REFUSED_BLOCK:
                name = f"blk.{i}.{suffix}"
                if name in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor '{name}' is not supported for {cls.arch} (the converter "
                                      "writes separate attn_q/attn_k/attn_v and a dense SwiGLU MLP without biases; "
                                      "llama.cpp's refact graph ignores output/MLP biases and rope factors)")

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "RefactModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        if cfg.n_experts > 0:
            raise MinferError(f"{gf.path}: {cls.arch}.expert_count={cfg.n_experts}: a mixture of experts is not "
                              f"supported for {cls.arch} (llama.cpp's refact graph builds the dense MLP only)")
        cls.check_tensors(gf, cfg)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.alibi = alibi_slopes(cfg.n_heads, REFACT_MAX_ALIBI_BIAS).to(device)          # (H,) float32
        return m

    # ---- the forward (LlamaModel.forward with this attention) ----

    def attention_heads(self, h: torch.Tensor, blk: Block, layer: int, cache, step: Step, ctx) -> torch.Tensor:
        """(T, H * Dh): q, k, v of the normed input, k and v to the cache as they are (no rope), ALiBi attention."""
        c = self.cfg
        T, H, Hkv, Dh = h.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
        q, k, v = ops.linear_many(h, (blk.attn_q, blk.attn_k, blk.attn_v), (None, None, None), ctx)
        cache.write(layer, k.view(T, Hkv, Dh), v.view(T, Hkv, Dh), step)
        return merge_heads(cache.attend(layer, q.view(T, H, Dh), step, ctx, alibi=self.alibi))   # (T, H * Dh)

    def attention_residual_norm(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx, x: torch.Tensor,
                                eps: float, act) -> tuple:
        """(x + W_o attn, its ffn_norm): layers.attention_residual_norm with this attention."""
        return ops.linear_add_rms_norm(self.attention_heads(h, blk, i, cache, step, ctx), blk.attn_output, x,
                                       blk.ffn_norm, eps, act, ctx, into_linear=True, role="ffn_norm")
