"""DBRX (Databricks dbrx-base / dbrx-instruct, DbrxForCausalLM): the GGUF arch `dbrx`.

    x_0 = E[tokens]                                    token_embd (V, D); output (V, D), untied
    for each layer l:
        h = LayerNorm(x; attn_norm)                    no bias
        q, k, v = split(clip(W_qkv h))                 clip(y) = clamp(y, -c, c), only with clamp_kqv > 0
        x = x + W_o attn(rope(q), rope(k), v)
        x = x + sum_{e in top-k softmax(W_r h')} w_e W_down_e(silu(W_gate_e h') * W_up_e h'),
            h' = LayerNorm(x; attn_output_norm)
    logits = W_out LayerNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/dbrx.cpp; src/llama-graph.cpp build_qkv; HF modeling_dbrx;
conversion/dbrx.py):
- The norms are LayerNorms (mean removed) with a weight and no bias (dbrx.cpp build_norm(..., NULL,
  LLM_NORM); HF nn.LayerNorm(bias=False)), eps `dbrx.attention.layer_norm_epsilon` (the converter
  writes 1e-5). The FFN's norm is `blk.N.attn_output_norm.weight` (LLM_TENSOR_ATTN_OUT_NORM; HF
  norm_attn_norm.norm_2).
- q, k, v come from one matrix `blk.N.attn_qkv.weight` ((H + 2 Hkv) * Dh, D), q rows first, then k,
  then v (HF DbrxAttention.Wqkv split); the whole projection is clamped to [-c, c] first when
  `dbrx.attention.clamp_kqv` c > 0 (build_qkv: ggml_clamp on the fused qkv; HF
  qkv_states.clamp(-clip_qkv, clip_qkv)); the converter always writes the key (clip_qkv; the release: 8).
  No biases (dbrx.cpp: wo_b NULL; separate attn_q/k/v or any bias refused by name).
- RoPE NEOX on the whole head (llama_model_rope_type: LLM_ARCH_DBRX -> NEOX; dbrx.cpp asserts
  n_embd_head == n_rot), scale 1/sqrt(head_dim).
- The MoE: softmax over the router's logits (ffn_gate_inp), the top `expert_used_count`, the weights
  renormalized to sum 1 (dbrx.cpp build_moe_ffn(..., LLM_FFN_SILU, norm_w = true,
  LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX); HF DbrxFFN with moe_normalize_expert_weights 1, the L1 norm,
  as released), each expert a SwiGLU of width `dbrx.feed_forward_length` (ffn_*_exps {n_embd, n_ff,
  n_expert}). A `dbrx.expert_weights_scale` other than 0 or 1 is refused (build_moe_ffn would scale).
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block, merge_heads, rope_write_attend
from minfer.models.olmo import clamp_kqv
from minfer.models.qwen3moe import MoeBlock, Qwen3MoeModel, load_experts
from minfer.weights import QWeight, load_qweight, load_vector

REFUSED = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_qkv.bias", "attn_output.bias",
           "attn_norm.bias", "attn_output_norm.bias")


class DbrxModel(Qwen3MoeModel):
    """Block.attn_qkv: the fused q/k/v matrix; Block.ffn_norm holds attn_output_norm. self.clip: the
    q/k/v clamp (0: none)."""

    arch = "dbrx"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_DBRX -> NEOX
    norm_eps_key = "attention.layer_norm_epsilon"
    qk_norm = False
    weights_norm = True       # dbrx.cpp: build_moe_ffn(..., norm_w = true, ...)
    expert_keys = ("expert_count", "expert_used_count")

    @classmethod
    def expert_width(cls, cfg: ModelConfig) -> int:
        return cfg.ffn        # dbrx.cpp load_arch_tensors: the experts are {n_embd, n_ff, n_expert}

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "DbrxModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        V, D, Dh, E, F = cfg.vocab, cfg.d_model, cfg.head_dim, cfg.n_experts, cfg.ffn
        for key in cls.expert_keys:
            if f"dbrx.{key}" not in gf.metadata:
                raise MinferError(f"{gf.path}: metadata key 'dbrx.{key}' is missing (needed to build the dbrx model)")
        if E <= 0 or not 0 < cfg.n_experts_used <= E:
            raise MinferError(f"{gf.path}: dbrx.expert_count={E}, expert_used_count={cfg.n_experts_used}: "
                              "expected 0 < used <= count")
        ws = gf.metadata.get("dbrx.expert_weights_scale")
        if ws is not None and float(ws) not in (0.0, 1.0):
            raise MinferError(f"{gf.path}: metadata key 'dbrx.expert_weights_scale' is {ws}, which is not "
                              "supported (0 or 1)")
        if cfg.rope.n_rot != Dh:
            raise MinferError(f"{gf.path}: metadata key 'dbrx.rope.dimension_count' is {cfg.rope.n_rot}, "
                              f"expected the head size {Dh} (dbrx rotates the whole head)")
        for i in range(cfg.n_layers):
            for name in REFUSED:
                if f"blk.{i}.{name}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}' is not supported: dbrx has one fused "
                                      "q/k/v matrix and no biases (llama.cpp's dbrx loader does not take it)")
        clip = clamp_kqv(gf)
        q_out, kv_out = cfg.n_heads * Dh, cfg.n_kv_heads * Dh
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=False, dtype=dtype)
        blocks, moe = [], []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            blk = Block(attn_norm=load_vector(gf, p + "attn_norm.weight", device, D),
                        attn_q=None, attn_k=None, attn_v=None,
                        attn_output=load_qweight(gf, p + "attn_output.weight", device, (D, q_out), dtype=dtype),
                        ffn_norm=load_vector(gf, p + "attn_output_norm.weight", device, D),
                        ffn_gate=None, ffn_up=None, ffn_down=None)
            blk.attn_qkv = load_qweight(gf, p + "attn_qkv.weight", device, (q_out + 2 * kv_out, D), dtype=dtype)
            blocks.append(blk)
            moe.append(MoeBlock(
                gate_inp=load_vector(gf, p + "ffn_gate_inp.weight", device, E * D).view(E, D),
                gate_exps=load_experts(gf, p + "ffn_gate_exps.weight", device, (E, F, D), dtype),
                up_exps=load_experts(gf, p + "ffn_up_exps.weight", device, (E, F, D), dtype),
                down_exps=load_experts(gf, p + "ffn_down_exps.weight", device, (E, D, F), dtype)))
        output_norm = load_vector(gf, "output_norm.weight", device, D)
        output = load_qweight(gf, "output.weight", device, (V, D), dtype=dtype)   # dbrx.cpp: required, untied
        m = cls(cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)
        m.moe = moe
        m.weights_norm = cls.weights_norm
        m.clip = clip
        return m

    def layer_matrices(self, i: int) -> list[QWeight]:
        """The fused q/k/v (not one of Block's matrices) and the layer's experts."""
        return [self.blocks[i].attn_qkv] + self.moe[i].matrices()

    def linear_groups(self) -> list[tuple]:
        return []             # one fused q/k/v matrix: nothing to group

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """The normed input h (T, D) -> W_o attn(...) (T, D), h's dtype; q/k/v clamped first when self.clip."""
        c, T = self.cfg, h.shape[0]
        H, Hkv, Dh = c.n_heads, c.n_kv_heads, c.head_dim
        qkv = ops.linear(h, blk.attn_qkv, None, ctx)
        if self.clip:
            qkv = qkv.clamp(-self.clip, self.clip)
        q, k, v = qkv.split((H * Dh, Hkv * Dh, Hkv * Dh), dim=-1)
        o = rope_write_attend(cache, i, q.reshape(T, H, Dh), k.reshape(T, Hkv, Dh), v.reshape(T, Hkv, Dh), step,
                              c.rope, ctx)
        return ops.linear(merge_heads(o), blk.attn_output, None, ctx)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        act, eps = self.act_dtype, self.cfg.rms_eps
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        for i, (blk, e) in enumerate(zip(self.blocks, self.moe)):
            x = x + self.attention(ops.layer_norm(x, blk.attn_norm, eps, act), blk, i, cache, step, ctx).float()
            x = x + self.ffn(ops.layer_norm(x, blk.ffn_norm, eps, act), e, ctx).float()
        h = ops.layer_norm(step.rows(x), self.output_norm, eps, act)            # (R, D)
        return self.head(h, ctx)   # (R, V)
