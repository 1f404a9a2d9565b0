"""XVERSE-7B / 13B / 65B (XverseForCausalLM, remote code): the GGUF arch `xverse`.

    x_0 = E[tokens]                                   token_embd (V, D)
    for each layer l:
        x = x + W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))    n = RMSNorm(attn_norm)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))               n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)            output (V, D), always its own

Llama's graph (src/models/xverse.cpp), on a file llama.cpp's converter has made Llama-shaped. Each rule and its source:
- q_proj / k_proj rows are permuted by the converter from HF's rotate_half order to adjacent pairs
  (conversion/xverse.py XverseModel.modify_tensors -> _reverse_hf_permute, on names ending q_proj.weight /
  k_proj.weight only), so RoPE is NORM (llama-model.cpp llama_model_rope_type: LLM_ARCH_XVERSE -> NORM) over whole
  heads (xverse.cpp asserts n_embd_head == n_rot; the converter writes rope.dimension_count = hidden / heads),
  base rope.freq_base (config.json's rope_theta, written by TextModel.set_gguf_parameters) or 10000.
  _reverse_hf_permute divides the head count by the kv head count for k (`n_head //= n_kv_head`), which is the
  right per-kv-head permutation only where there is no GQA or n_head == n_kv_head ** 2; a file converted from
  another GQA shape has scrambled k rows, in llama.cpp as here (nothing in the file tells it).
- GQA: head_count_kv from the file; query head h reads kv head h // (H / Hkv) (llama.cpp's build_attn).
- RMSNorm with attention.layer_norm_rms_epsilon, scores 1/sqrt(head_dim) (xverse.cpp's kq_scale), SwiGLU MLP
  (build_ffn LLM_FFN_SILU, LLM_FFN_PAR) from ffn_gate / ffn_up / ffn_down.
- The loader's shapes (xverse.cpp load_arch_tensors): attn_q and attn_output are (n_embd, n_embd), so
  H * head_dim must equal the embedding length; per-layer head counts are not read into those shapes; output.weight
  is required (flag 0, no fallback to token_embd). Each refused by name.
- No biases: llama.cpp's create_tensor_qkv would take q/k/v biases, but the converter permutes only the q/k
  weights (never a bias) and a checkpoint with `bias` true also gives attn_output.bias, which xverse's loader never
  creates; a q/k/v/o bias, a fused attn_qkv (which the converter never writes) and rope_freqs.weight (listed for the
  arch in gguf-py's MODEL_TENSORS, never created by xverse's loader) are refused by name rather than run.

The vocabulary: conversion/xverse.py set_vocab writes tokenizer.ggml.model `llama` (SentencePiece) from the HF
tokenizer.json's vocabulary with token types but no scores (llama.cpp then scores every piece 0.0; minfer's SPM
does the same: tokenizer/tokenizer.py), read from the file.
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.layers import refuse_layer_tensors, refuse_per_layer_shapes, require_output
from minfer.models.llama import LlamaModel

# per layer: tensors llama.cpp's xverse loader would not create or the converter would write wrongly (see above)
_REFUSED_TENSORS = ("attn_qkv.weight", "attn_qkv.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias",
                    "attn_output.bias")


class XverseModel(LlamaModel):
    """LlamaModel with xverse's loader checks (untied output, whole-head rope, no biases)."""

    arch = "xverse"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_XVERSE -> NORM

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "XverseModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        require_output(gf, cfg, cls.arch)
        refuse_per_layer_shapes(gf, cfg, "llama.cpp's xverse loader sizes every layer alike")
        if cfg.n_heads * cfg.head_dim != cfg.d_model:
            raise MinferError(f"{gf.path}: {cls.arch}.attention.key_length {cfg.head_dim} x head_count {cfg.n_heads} "
                              f"!= embedding_length {cfg.d_model} (llama.cpp's xverse loader makes attn_q and "
                              "attn_output (n_embd, n_embd))")
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {cls.arch}.rope.dimension_count {cfg.rope.n_rot} != head_dim "
                              f"{cfg.head_dim} (llama.cpp's xverse graph rotates whole heads only)")
        if "rope_freqs.weight" in gf.tensors:
            raise MinferError(f"{gf.path}: tensor 'rope_freqs.weight' is not supported for {cls.arch} "
                              "(llama.cpp's xverse loader does not create it)")
        refuse_layer_tensors(gf, cfg, _REFUSED_TENSORS, "the converter writes attn_q/attn_k/attn_v/attn_output "
                                                        "weights; it permutes no q/k bias and xverse's loader "
                                                        "creates no attn_output.bias")
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
