"""IBM Granite MoE (3.x 1B-A400M, 3B-A800M, and the shared-expert variant): the GGUF arch `granitemoe`.

Granite's multipliers (minfer/models/granite.py: embeddings, the query scale, each branch before
its residual add, the logits) around Qwen3-MoE's routed FFN (minfer/models/qwen3moe.py). Each rule
and its source:
- The FFN: softmax over the router's logits, the top `expert_used_count` experts, their weights
  renormalized over those (llama.cpp src/models/granite.cpp build_layer_ffn: build_moe_ffn(...,
  LLM_FFN_SILU, norm_w = true, ..., LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX); HF
  GraniteMoeTopKGating: softmax over the top-k logits, the same weights), each expert a SwiGLU.
- The experts' hidden size is `granitemoe.feed_forward_length` (granite-moe.cpp load_arch_tensors:
  ffn_*_exps of {n_embd, n_ff, n_expert}); the converter writes no expert_feed_forward_length
  (conversion/granite.py GraniteMoeModel: intermediate_size is the experts').
- The shared expert (GraniteMoeShared): with `granitemoe.expert_shared_feed_forward_length` > 0 a
  SwiGLU of that width (ffn_{gate,up,down}_shexp) is added to the routed output, ungated
  (granite.cpp: cur = moe_out + ffn_shexp; HF GraniteMoeSharedDecoderLayer: moe + shared_mlp).
- Attention, rope (NORM) and what is refused: as granite.py; also `expert_weights_scale` other
  than 0 or 1 (build_moe_ffn would scale the weights; the converter writes none).
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.granite import GraniteScales, check_supported
from minfer.models.qwen3moe import MoeBlock, Qwen3MoeModel
from minfer.weights import load_qweight


class GraniteMoeModel(GraniteScales, Qwen3MoeModel):
    arch = "granitemoe"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_GRANITE_MOE -> NORM
    qk_norm = False
    qkv_bias = False
    weights_norm = True
    expert_keys = ("expert_count", "expert_used_count")

    @classmethod
    def expert_width(cls, cfg: ModelConfig) -> int:
        return cfg.ffn        # granite-moe.cpp: the experts are {n_embd, n_ff, n_expert}

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "GraniteMoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        check_supported(gf, cfg)
        ws = gf.metadata.get("granitemoe.expert_weights_scale")
        if ws is not None and float(ws) not in (0.0, 1.0):
            raise MinferError(f"{gf.path}: metadata key 'granitemoe.expert_weights_scale' is {ws}, which is not "
                              "supported (0 or 1)")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m._load_scales(gf, cfg)
        return m

    @classmethod
    def load_shared(cls, gf, cfg, e: MoeBlock, i: int, device, dtype) -> None:
        Fs, D, p = cfg.expert_shared_ffn, cfg.d_model, f"blk.{i}."
        if Fs > 0:
            e.gate_shexp = load_qweight(gf, p + "ffn_gate_shexp.weight", device, (Fs, D), dtype=dtype)
            e.up_shexp = load_qweight(gf, p + "ffn_up_shexp.weight", device, (Fs, D), dtype=dtype)
            e.down_shexp = load_qweight(gf, p + "ffn_down_shexp.weight", device, (D, Fs), dtype=dtype)

    def _ffn(self, i: int, h: torch.Tensor, ctx) -> torch.Tensor:
        e = self.moe[i]
        routed = self.ffn(h, e, ctx)                                               # (T, D)
        if e.gate_shexp is None:
            return routed
        return routed.float() + self.shared_expert(h, e, ctx).float()
