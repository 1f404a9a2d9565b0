"""OpenAI GPT-2 (HF GPT2LMHeadModel; and ruGPT3XL, which llama.cpp converts to the same arch): the GGUF arch `gpt2`.

    x_0 = E[tokens] + P[positions]                      token_embd (V, D), position_embd (n_ctx_train, D)
    for each layer l:
        h = LN(x; attn_norm, attn_norm.bias)
        q, k, v = split(W_qkv h + b_qkv)                rows: D q, D k, D v
        x = x + W_o attn(q, k, v) + b_o                 no rope
        h = LN(x; ffn_norm, ffn_norm.bias)
        x = x + W_down gelu(W_up h + b_up) + b_down
    logits = W_out LN(x; output_norm, output_norm.bias)  output, or the embedding when tied

StarCoder 1's graph with multi-head attention: every rule is starcoder.py's (StarcoderModel), each checked here
against its source (llama.cpp src/models/gpt2.cpp, src/llama-model.cpp; conversion/gpt2.py GPT2Model; HF
modeling_gpt2 GPT2Model / GPT2Attention / GPT2MLP):
- Learned absolute positions added to the token embeddings (gpt2.cpp: inpL = tok rows + ggml_get_rows(pos_embd,
  inp_pos); HF wte + wpe); `position_embd.weight` (context_length, D) required (flag 0). No rope. The converter
  writes context_length from the released config's n_ctx (= n_positions). A --ctx past the table is refused by
  name (StarcoderModel.check_positions).
- LayerNorm with weight AND bias, eps `gpt2.attention.layer_norm_epsilon` (build_norm(..., LLM_NORM); HF ln_1,
  ln_2, ln_f), sequential residuals (gpt2.cpp ffn_inp = cur + inpL).
- HF's Conv1D stores c_attn / c_proj / c_fc as (in, out); the converter transposes them to the usual (out, in)
  (modify_tensors: c_attn, c_proj, c_fc .weight transpose(1, 0)), so `blk.N.attn_qkv.weight` is (3 D, D), rows q,
  k, v (HF c_attn split(split_size) along its output). MHA: the converter writes no head_count_kv (= head_count).
  Separate q/k/v refused by name (the loader takes attn_qkv only).
- Scale 1/sqrt(head_dim) (gpt2.cpp kq_scale; HF scale_attn_weights). HF's scale_attn_by_inverse_layer_idx and
  reorder_and_upcast_attn (off in every GPT-2 release) are not in the GGUF, as llama.cpp ignores them.
- Biases on q/k/v, the output projection and both MLP matrices, all required (flag 0; HF Conv1D bias).
- The ungated MLP with GELU's tanh approximation (build_ffn(..., LLM_FFN_GELU, LLM_FFN_SEQ): ggml_gelu; HF
  activation_function gelu_new). torch's gelu on both backends.
- The lm head: `output.weight`, else the embedding (TENSOR_NOT_REQUIRED then TENSOR_DUPLICATED; HF ties lm_head
  to wte).
"""

from __future__ import annotations

from minfer.models.starcoder import StarcoderModel


class Gpt2Model(StarcoderModel):
    arch = "gpt2"
    rope_style = "normal"     # llama_model_rope_type: LLM_ARCH_GPT2 -> NONE (never applied: no rope)
