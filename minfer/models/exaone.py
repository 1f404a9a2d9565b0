"""LG EXAONE 3.0 / 3.5 (EXAONE-3.0-7.8B, EXAONE-3.5-2.4B/7.8B/32B, EXAONE Deep): the GGUF arch `exaone`.

Llama's computation (minfer/models/llama.py) under its own name. Each rule and its source
(llama.cpp src/models/exaone.cpp; conversion/exaone.py ExaoneModel; HF: transformers 5 runs
`exaone` checkpoints as LlamaForCausalLM, renaming transformer.h.N.attn.attention.{q,k,v,out}_proj,
ln_1 / ln_2 and mlp.c_fc_0 / c_fc_1 / c_proj to Llama's names, conversion_mapping.py "exaone";
gguf-py's tensor_mapping.py maps the original names to the same GGUF tensors):
- Pre-norm blocks with RMSNorm (attn_norm = ln_1, ffn_norm = ln_2), GQA attention with scale
  1/sqrt(head_dim), a SwiGLU MLP (c_fc_0 the gate, c_fc_1 the up: the converter asserts
  activation_function silu), `output.weight` or tied (EXAONE-3.5-2.4B ties).
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_EXAONE -> NEOX; the converter does not permute q/k,
  HF Llama's rotate_half takes halves) over the whole head: exaone.cpp asserts n_rot == head size,
  so a partial rope.dimension_count is refused. EXAONE 3.5's Llama-3 rope scaling comes as
  `rope_freqs.weight` (conversion/exaone.py generate_extra_tensors; model.get_rope_factors), read by
  ModelConfig as for llama.
- No biases: the graph applies q/k/v biases if the file has them (create_tensor_qkv,
  TENSOR_NOT_REQUIRED) but loads no attn_output.bias; the released models have none (HF
  attention_bias / mlp_bias false), so any bias tensor is refused by name.
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.llama import LlamaModel


class ExaoneModel(LlamaModel):
    arch = "exaone"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_EXAONE -> NEOX

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "ExaoneModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        if cfg.rope.n_rot != cfg.head_dim:      # exaone.cpp: GGML_ASSERT(n_embd_head == n_rot)
            raise MinferError(f"{gf.path}: {cls.arch} rotates the whole head (rope.dimension_count "
                              f"{cfg.rope.n_rot} != head size {cfg.head_dim})")
        for name in gf.tensors:
            if name.startswith("blk.") and name.endswith(".bias"):
                raise MinferError(f"{gf.path}: tensor '{name}' is not supported for {cls.arch} (the released "
                                  "models have no biases; llama.cpp's loader takes no attn_output.bias)")
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
