"""Mixtral (MixtralForCausalLM: Mixtral-8x7B / 8x22B and their fine-tunes): the GGUF arch `llama` with experts.

llama.cpp's converter writes MixtralForCausalLM as `llama` (conversion/__init__.py: "MixtralForCausalLM": "llama";
conversion/llama.py LlamaModel.modify_tensors stacks each layer's block_sparse_moe.experts.X.w1/w2/w3 into
ffn_gate_exps / ffn_down_exps / ffn_up_exps) with `llama.expert_count` and `llama.expert_used_count`.
LlamaModel.from_gguf hands a `llama` file with expert_count > 0 to this class:

    x_0 = E[tokens]                                   token_embd (V, D); output (V, D), or token_embd when tied
    for each layer l:
        x = x + W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))          n = RMSNorm(attn_norm)
        h = RMSNorm(x; ffn_norm)
        p = softmax(W_router h)                                             ffn_gate_inp (E, D)
        x = x + sum_{e in top-K(p)} (p_e / sum_top p) W_down_e(silu(W_gate_e h) * W_up_e h)
    logits = W_out RMSNorm(x; output_norm)

Each rule and its source (llama.cpp src/models/llama.cpp, load_arch_tensors and the graph; src/llama-graph.cpp
build_moe_ffn; HF modeling_mixtral MixtralSparseMoeBlock):
- Attention is Llama's: RMSNorm pre-norms, NORM rope (llama_model_rope_type: LLM_ARCH_LLAMA -> NORM) on the
  q/k rows the converter permuted (LlamaModel.permute), scale 1/sqrt(head_dim), GQA.
- The FFN of a layer with ffn_gate_inp is build_moe_ffn(..., n_expert, n_expert_used, LLM_FFN_SILU,
  norm_w = true, hparams.expert_weights_scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX): softmax over all E
  router logits, the top `expert_used_count`, their weights divided by their sum (clamped at 2^-14), each expert
  a SwiGLU. The llama loader reads neither expert_weights_norm nor expert_gating_func (both fixed by the graph:
  a file's expert_weights_norm is ignored here too) nor expert_weights_scale (hparams keeps 0: no scaling; a
  file's key is ignored here too) nor expert_shared_feed_forward_length (n_ff_shexp stays 0: no shared expert).
- The experts' width is `llama.feed_forward_length` (load_arch_tensors: ffn_*_exps {n_embd, n_ff, n_expert};
  no expert_feed_forward_length is read for llama; the converter writes HF's intermediate_size, the experts').
- The router ffn_gate_inp {n_embd, n_expert}, ffn_up_exps and ffn_down_exps are required; ffn_gate_exps is
  TENSOR_NOT_REQUIRED there (ungated experts), which no converter writes for llama: refused by name here.
- The pre-2024 per-expert layout (blk.N.ffn_gate.E.weight, ffn_up.E, ffn_down.E): llama-arch.cpp still names
  LLM_TENSOR_FFN_{GATE,DOWN,UP}_EXP ("split experts for backward compatibility") but no loader in src/ creates
  them any more (the llama loader asks for the stacked _exps only): llama.cpp does not load such a file, and it
  is refused by name here (re-convert, or llama.cpp's gguf-py can re-pack).
- expert_group_count > 1 (group-limited choice, which build_moe_ffn would apply): the converter writes none for
  llama; refused by name. Attention / MLP bias tensors on an expert file (llama_bias.py's) are refused as well.
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.qwen3moe import Qwen3MoeModel

# per-expert tensor names of the old layout (llama-arch.cpp LLM_TENSOR_FFN_*_EXP: "blk.%d.ffn_gate.%d")
OLD_LAYOUT = ("ffn_gate", "ffn_up", "ffn_down")
ATTN_BIASES = ("attn_q", "attn_k", "attn_v", "attn_output")


def old_expert_tensor(gf, n_layers: int) -> str | None:
    """The first per-expert tensor of the pre-2024 layout (blk.N.ffn_gate.E.weight) in the file, or None."""
    for i in range(n_layers):
        for w in OLD_LAYOUT:
            name = f"blk.{i}.{w}.0.weight"
            if name in gf.tensors:
                return name
    return None


class LlamaMoeModel(Qwen3MoeModel):
    """Llama's attention with Mixtral's routed SwiGLU experts in every layer (module doc)."""

    arch = "llama"
    rope_style = "normal"     # llama.cpp llama_model_rope_type: LLM_ARCH_LLAMA -> NORM
    qk_norm = False
    qkv_bias = False
    weights_norm = True       # src/models/llama.cpp: build_moe_ffn(..., LLM_FFN_SILU, true, ...)
    expert_keys = ("expert_count", "expert_used_count")

    @classmethod
    def expert_width(cls, cfg: ModelConfig) -> int:
        return cfg.ffn        # llama.cpp load_arch_tensors: ffn_*_exps {n_embd, n_ff, n_expert}

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "LlamaMoeModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        old = old_expert_tensor(gf, cfg.n_layers)
        if old is not None:
            raise MinferError(f"{gf.path}: tensor '{old}' is the old per-expert layout (blk.N.ffn_gate.E.weight), "
                              "which llama.cpp no longer loads and minfer does not support: expected the stacked "
                              "ffn_gate_exps / ffn_up_exps / ffn_down_exps (re-convert with a current llama.cpp)")
        if cfg.expert_groups > 1:
            raise MinferError(f"{gf.path}: llama.expert_group_count={cfg.expert_groups} (group-limited expert "
                              "choice) is not supported for llama (llama.cpp's converter writes none for it)")
        for i in range(cfg.n_layers):
            for b in ATTN_BIASES:
                if f"blk.{i}.{b}.bias" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{b}.bias' is not supported in a llama file "
                                      "with experts (llama.expert_count > 0)")
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.weights_norm = True     # the llama graph's norm_w is fixed: a file's expert_weights_norm is not read
        return m
