"""InternLM2 / InternLM2.5 (InternLM2ForCausalLM): the GGUF arch `internlm2`.

    x_0 = E[tokens]                                   token_embd (V, D)
    for each layer l:
        x = x + W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))    n = RMSNorm(attn_norm)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))               n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)            output (V, D), always its own

Llama's graph, in a file llama.cpp's converter has already made Llama-shaped. Each rule and its source:
- The HF checkpoint fuses q/k/v as `attention.wqkv`, rows grouped per kv head ([its q_per_kv query heads, its key,
  its value] x n_kv_heads; modeling_internlm2.py rearrange "(h gs d)" with gs = 2 + num_key_value_groups). The
  converter (conversion/internlm.py InternLM2Model.modify_tensors) splits it into attn_q / attn_k / attn_v, query
  heads in order g * q_per_kv + j, and permutes the q/k rows as Llama's (LlamaModel.permute) for NORM rope. So
  query head i reads kv head i // q_per_kv (llama.cpp's GQA; HF repeat_kv), as LlamaModel does.
- RoPE NORM, adjacent pairs on the permuted rows (llama-model.cpp llama_model_rope_type: LLM_ARCH_INTERNLM2 ->
  NORM), base rope.freq_base (InternLM2.5: 1e6), all of each head (src/models/internlm2.cpp asserts
  n_embd_head == n_rot). The release's rope_scaling {dynamic, 2.0} is written as no key (conversion/base.py
  TextModel.set_gguf_parameters "dynamic": pass): llama.cpp, and minfer, rotate without it (HF's dynamic NTK
  changes the base only past max_position_embeddings, 32768).
- RMSNorm with attention.layer_norm_rms_epsilon (internlm2.cpp load_arch_hparams), scores 1/sqrt(head_dim),
  SwiGLU MLP from w1 (ffn_gate), w3 (ffn_up), w2 (ffn_down) (build_ffn LLM_FFN_SILU, LLM_FFN_PAR).
- output.weight is required (load_arch_tensors: output with flag 0, no fallback to token_embd): refused when
  missing. No biases: the converter cannot write them (its wqkv reshape takes a matrix only) and llama.cpp
  loads none on wo or the MLP; a q/k/v bias or a fused attn_qkv (which llama.cpp's create_tensor_qkv would take) is
  refused by name rather than ignored.

The vocabulary (tokenizer.ggml.model llama: SentencePiece with byte fallback) is the converter's: pieces from
tokenizer.model, with tokenizer_config.json's added tokens (<|im_start|>, <|im_end|>, <|action_start|>, ...) over
the [UNUSED_TOKEN_*] ids, as CONTROL tokens, and eos rewritten to <|im_end|>'s id for a chat model (set_vocab:
"For the chat model, we replace the eos with '<|im_end|>'"); the piece "\\x00" is written as "🐉". The chat template
(ChatML with a leading bos) comes from tokenizer_config.json. All of that is the tokenizer's, read from the file.
"""

from __future__ import annotations

import torch

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.layers import refuse_layer_tensors, require_output
from minfer.models.llama import LlamaModel

# tensors llama.cpp's internlm2 loader could take but the converter never writes, which the llama graph here does
# not apply: refused by name, never ignored
_REFUSED_TENSORS = ("attn_qkv.weight", "attn_qkv.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias")


class InternLM2Model(LlamaModel):
    """LlamaModel on the converter's split q/k/v; the loader's checks here."""

    arch = "internlm2"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_INTERNLM2 -> NORM

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "InternLM2Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        require_output(gf, cfg, cls.arch)
        if cfg.rope.n_rot != cfg.head_dim:
            raise MinferError(f"{gf.path}: {cls.arch}.rope.dimension_count {cfg.rope.n_rot} != head_dim "
                              f"{cfg.head_dim} (llama.cpp's internlm2 graph rotates whole heads only)")
        refuse_layer_tensors(gf, cfg, _REFUSED_TENSORS, "llama.cpp's converter splits wqkv into "
                                                        "attn_q/attn_k/attn_v without biases")
        return super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
