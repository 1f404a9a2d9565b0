"""Baichuan / Baichuan2 7B (BaiChuanForCausalLM, BaichuanForCausalLM): the GGUF arch `baichuan`.

    x_0 = E[tokens]                                   token_embd (V, D)
    for each layer l:
        x = x + W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))    n = RMSNorm(attn_norm)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))               n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)            output (V, D), always its own

Llama's graph, in a file llama.cpp's converter has already made Llama-shaped. Each rule and its source:
- The HF checkpoint fuses q/k/v as `self_attn.W_pack` (3*D, D: the q rows, then k, then v). The converter
  (conversion/baichuan.py BaichuanModel.modify_tensors) splits it in thirds into attn_q / attn_k / attn_v and
  permutes the q/k thirds as Llama's (_reverse_hf_permute_part) for NORM rope.
- The position encoding is chosen by the layer count alone (src/models/baichuan.cpp load_arch_hparams: 32 layers ->
  LLM_TYPE_7B, rope; 40 -> LLM_TYPE_13B, ALiBi with f_max_alibi_bias 8 ("TODO: become GGUF KV parameter"); any
  other count -> LLM_TYPE_UNKNOWN, which the graph runs with neither rope nor ALiBi). minfer runs the 7B kind (32
  layers, rope) and refuses the rest by name: the 13B kind (ALiBi, no fixture small enough for this repository at
  40 layers), and other counts (a graph with no position encoding at all, which no released Baichuan is).
- RoPE NORM, adjacent pairs on the permuted rows (llama-model.cpp llama_model_rope_type: LLM_ARCH_BAICHUAN ->
  NORM), base rope.freq_base or 10000 (Baichuan-7B's config has no rope_theta), all of each head (baichuan.cpp
  asserts n_embd_head == n_rot; the converter writes rope.dimension_count = hidden / heads).
- RMSNorm with attention.layer_norm_rms_epsilon, scores 1/sqrt(head_dim), SwiGLU MLP from gate_proj (ffn_gate),
  up_proj (ffn_up), down_proj (ffn_down) (build_ffn LLM_FFN_SILU, LLM_FFN_PAR).
- output.weight is required (load_arch_tensors: output with flag 0, no fallback to token_embd): refused when
  missing. No biases: llama.cpp loads none; a q/k/v bias or a fused attn_qkv is refused by name rather than ignored.
- Baichuan2's NormHead (lm_head rows normalized to unit length inside the HF forward) is not baked in by the
  converter (lm_head.weight goes through map_tensor_name as written) and llama.cpp's graph applies none: minfer, as
  llama.cpp, multiplies by output.weight as stored. A Baichuan2 file converted from the raw checkpoint therefore
  differs from HF's logits by each row's norm (both llama.cpp and minfer).

The vocabulary (tokenizer.ggml.model llama: SentencePiece with byte fallback) is the converter's
(_set_vocab_sentencepiece), read from the file.
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.layers import refuse_layer_tensors, require_output
from minfer.models.llama import LlamaModel

# tensors llama.cpp's baichuan loader could take (create_tensor_qkv) but the converter never writes, which the llama
# graph here does not apply: refused by name, never ignored
_REFUSED_TENSORS = ("attn_qkv.weight", "attn_qkv.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias")


class BaichuanModel(LlamaModel):
    """LlamaModel on the converter's split W_pack (the 7B kind: 32 layers, rope); the loader's checks here."""

    arch = "baichuan"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_BAICHUAN -> NORM

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "BaichuanModel":
        cfg = cfg or ModelConfig.from_gguf(gf)
        if cfg.n_layers == 40:
            raise MinferError(f"{gf.path}: {cls.arch} with 40 layers is the 13B kind, which llama.cpp runs with ALiBi "
                              "(max bias 8) and no rope (src/models/baichuan.cpp); minfer supports only the 7B kind "
                              "(32 layers, rope)")
        if cfg.n_layers != 32:
            raise MinferError(f"{gf.path}: {cls.arch} with {cfg.n_layers} layers: llama.cpp picks the position "
                              "encoding from the layer count (32 -> rope, 7B; 40 -> ALiBi, 13B) and runs any other "
                              "count with none; minfer supports only the 7B kind (32 layers, rope)")
        require_output(gf, cfg, cls.arch)
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {cls.arch}.rope.dimension_count {cfg.rope.n_rot} != head_dim "
                              f"{cfg.head_dim} (llama.cpp's baichuan graph rotates whole heads only)")
        refuse_layer_tensors(gf, cfg, _REFUSED_TENSORS, "llama.cpp's converter splits W_pack into "
                                                        "attn_q/attn_k/attn_v without biases")
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
