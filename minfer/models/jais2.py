"""Jais-2 (inceptionai Jais-2 8B / 70B, HF Jais2ForCausalLM): the GGUF arch `jais2`.

    x_0 = E[tokens]                                     token_embd (V, D); output (V, D), or tied
    for each layer l:
        h = LN(x; attn_norm, attn_norm.bias)
        x = x + W_o attn(rope(W_q h + b_q), rope(W_k h + b_k), W_v h + b_v) + b_o
        h = LN(x; ffn_norm, ffn_norm.bias)
        x = x + W_down relu(W_up h + b_up)^2 + b_down
    logits = W_out LN(x; output_norm, output_norm.bias)

nemotron.py's computation (LayerNorms with weight and bias, NEOX rope, the ungated squared-ReLU MLP),
with Jais-2's tensor rules. Each rule and its source (llama.cpp src/models/jais2.cpp: load_arch_hparams,
load_arch_tensors, the graph; conversion/jais.py Jais2Model; HF transformers models/jais2/modular_jais2.py):
- LayerNorm (nn.LayerNorm, stored as is by the converter) with weight and bias, all required (flag 0),
  eps jais2.attention.layer_norm_epsilon (LLM_KV_ATTENTION_LAYERNORM_EPS, required; HF layer_norm_eps).
- q/k/v biases taken when present (create_tensor_qkv: TENSOR_NOT_REQUIRED; HF attention_bias, on in the
  release); the output projection's bias required (wo_b flag 0); a fused attn_qkv (which create_tensor_qkv
  would take; the converter never writes it) refused by name.
- The MLP: W_down relu(W_up h + b_up)^2 + b_down (build_ffn LLM_FFN_RELU_SQR, LLM_FFN_SEQ; HF NemotronMLP
  with hidden_act relu2, mlp_bias), up and down biases required (flag 0); an ffn_gate refused by name.
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_JAIS2 -> NEOX; HF rotate_half) over the whole head (the graph
  asserts n_rot == head size; the converter writes rope.dimension_count = head_dim), the file's freq_base
  and linear scale, scale 1/sqrt(head_dim), GQA, no window.
- output.weight optional (TENSOR_NOT_REQUIRED): the embedding when absent.
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.layers import Block
from minfer.models.nemotron import NemotronModel

REQUIRED_BIASES = ("attn_output.bias", "ffn_up.bias", "ffn_down.bias")   # jais2.cpp: wo_b, ffn_up_b, ffn_down_b


class Jais2Model(NemotronModel):
    arch = "jais2"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_JAIS2 -> NEOX
    norm_eps_key = "attention.layer_norm_epsilon"

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Jais2Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        a = cls.arch
        for i in range(cfg.n_layers):
            for name in ("attn_qkv.weight", "ffn_gate.weight"):
                if f"blk.{i}.{name}" in gf.tensors:
                    raise MinferError(f"{gf.path}: tensor 'blk.{i}.{name}' is not supported for {a} (the converter "
                                      "writes separate attn_q/attn_k/attn_v and an ungated MLP)")
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {a}.rope.dimension_count={cfg.rope.n_rot}, expected the head size "
                              f"{cfg.head_dim} (jais2.cpp asserts n_rot == head size)")
        # the starcoder2 loading (NemotronModel's own from_gguf requires output.weight, which jais2 does not)
        m = super(NemotronModel, cls).from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress,
                                                act_dtype=act_dtype)
        m.window = 0              # jais2.cpp: build_attn_inp_kv, no window
        return m

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        p = f"blk.{i}."
        for name in REQUIRED_BIASES:
            if p + name not in gf.tensors:
                raise MinferError(f"{gf.path}: tensor '{p}{name}' is missing (llama.cpp's jais2 loader requires it)")
        return super().load_block(gf, cfg, i, device, dtype)
