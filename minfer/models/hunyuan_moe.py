"""Tencent Hunyuan-A13B (HF HunYuanMoEV1ForCausalLM): the GGUF arch `hunyuan-moe`.

    x_0 = E[tokens]                                                     token_embd (V, D); output, or tied
    for each layer l:
        q, k = kn(rope(W_q n(x))), kn(rope(W_k n(x)))                   n = RMSNorm(attn_norm); per-head norms
        x = x + W_o attn(q, k, W_v n(x))
        h = n'(x)                                                       n' = RMSNorm(ffn_norm)
        x = x + moe(h) + W_down_s(silu(W_gate_s h) * W_up_s h)
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/hunyuan-moe.cpp: load_arch_hparams, load_arch_tensors,
the graph; conversion/hunyuan.py HunYuanMoEModel; HF transformers models/hunyuan_v1_moe):
- hunyuan-dense's attention: per-head q/k RMSNorm AFTER rope (ggml_rope_ext, then build_norm; HF
  apply_rotary_pos_emb, then query_layernorm / key_layernorm), NEOX rope (llama_model_rope_type:
  LLM_ARCH_HUNYUAN_MOE -> NEOX), GQA, scale 1/sqrt(head_dim); attention biases refused by name (llama.cpp
  loads no attn_output.bias). The released NTK-alpha rope is the converter's scaled rope.freq_base.
- Every layer's FFN is a MoE plus an ungated shared expert, added (ggml_add(cur_moe, cur_mlp); HF
  HunYuanMoEV1Moe: experts + shared_mlp):
      p = softmax(W_r h) (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, hard-coded), top K = expert_used_count,
      w = p[top] / sum(p[top]) (norm_w true, hard-coded: a file's expert_weights_norm is not read; HF
      HunYuanMoEV1Gate renormalizes), no scale (hunyuan-moe.cpp never loads expert_weights_scale);
  the experts are feed_forward_length wide (load_arch_tensors: {n_embd, n_ff, n_expert}; HF's experts take
  intermediate_size), so a file whose expert_feed_forward_length differs is refused; the shared expert is
  expert_shared_feed_forward_length wide (the converter writes intermediate_size; required here:
  llama.cpp would size the shexp tensors 0 without it). ops.moe_ffn on both backends.
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models import hunyuan_dense
from minfer.models.base import Step
from minfer.models.layers import Block
from minfer.models.qwen3moe import MoeBlock, Qwen3MoeModel
from minfer.weights import load_qweight


class HunyuanMoeModel(Qwen3MoeModel):
    arch = "hunyuan-moe"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_HUNYUAN_MOE -> NEOX
    qk_norm = True            # loaded by Qwen3MoeModel; applied after rope here
    weights_norm = True       # hunyuan-moe.cpp: build_moe_ffn(..., true /* norm_topk_prob */, ...)
    expert_keys = ("expert_count", "expert_used_count", "expert_shared_feed_forward_length")

    @classmethod
    def expert_width(cls, cfg: ModelConfig) -> int:
        return cfg.ffn        # load_arch_tensors: the experts are {n_embd, n_ff, n_expert}

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "HunyuanMoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a = cls.arch
        for suffix in hunyuan_dense._REFUSED_TENSORS:
            for i in range(cfg.n_layers):
                if f"blk.{i}.{suffix}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{suffix}' is not supported for {a} "
                                      "(the released models have no attention biases; llama.cpp's loader "
                                      "takes no attn_output.bias)")
        if cfg.expert_ffn and cfg.expert_ffn != cfg.ffn:
            raise MinferError(f"{gf.path}: {a}.expert_feed_forward_length={cfg.expert_ffn} differs from "
                              f"{a}.feed_forward_length={cfg.ffn} (llama.cpp sizes the experts by the latter, "
                              "transformers by intermediate_size: not supported)")
        if f"{a}.expert_shared_feed_forward_length" in gf.metadata and cfg.expert_shared_ffn <= 0:
            raise MinferError(f"{gf.path}: {a}.expert_shared_feed_forward_length={cfg.expert_shared_ffn}: "
                              "expected > 0 (every layer has the shared expert)")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.weights_norm = True     # hard-coded in the graph, whatever the file says
        return m

    @classmethod
    def load_shared(cls, gf, cfg, e: MoeBlock, i: int, device, dtype) -> None:
        p, D, Fs = f"blk.{i}.", cfg.d_model, cfg.expert_shared_ffn
        e.gate_shexp = load_qweight(gf, p + "ffn_gate_shexp.weight", device, (Fs, D), dtype=dtype)
        e.up_shexp = load_qweight(gf, p + "ffn_up_shexp.weight", device, (Fs, D), dtype=dtype)
        e.down_shexp = load_qweight(gf, p + "ffn_down_shexp.weight", device, (D, Fs), dtype=dtype)

    def ffn(self, h: torch.Tensor, e: MoeBlock, ctx) -> torch.Tensor:
        """The routed experts plus the ungated shared expert, (T, D) -> (T, D)."""
        routed = super().ffn(h, e, ctx)
        return (routed.float() + self.shared_expert(h, e, ctx).float()).to(h.dtype)

    def attention(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx) -> torch.Tensor:
        """hunyuan-dense's attention: q/k rotated, then per-head RMS-normed, then cached and attended."""
        o = hunyuan_dense.rope_then_norm_heads(h, blk, self.cfg, cache, i, step, ctx)
        return ops.linear(o, blk.attn_output, None, ctx)
