"""EleutherAI GPT-J (GPT-J 6B and its fine-tunes: GPT4All-J, Pygmalion-6B; HF GPTJForCausalLM): the GGUF arch `gptj`.

    x_0 = E[tokens]                                             token_embd (V, D), no position table
    for each layer l:
        h = LN(x; attn_norm, attn_norm.bias)                    one norm feeds both branches
        x = x + W_o attn(rope(W_q h), rope(W_k h), W_v h)
              + W_down gelu(W_up h + b_up) + b_down             attention and MLP in parallel
    logits = W_out LN(x; output_norm, output_norm.bias) + b_out

phi2's graph (Phi2Model) with GPT-J's rope style and biases. llama.cpp 0.3.36 names the architecture only: LLM_ARCH_GPTJ
"gptj" (src/llama-arch.cpp), its tensor list (gguf-py constants.py MODEL_TENSORS[MODEL_ARCH.GPTJ]: token_embd,
output_norm, output, attn_norm, attn_qkv, attn_q, attn_k, attn_v, attn_output, ffn_up, ffn_down), GPT-J's HF tensor
names (gguf-py tensor_mapping.py "# gpt-j"), "gpt-j n_rot = rotary_dim" (llama-model.cpp load_hparams); there is no
src/models/gptj.cpp, no loader and no converter class (the model factory throws "unsupported model architecture"),
so llama.cpp runs no gptj file. The rules below are HF's (modeling_gptj), on the files tools/gptj_fixture.py writes
with llama.cpp's converter machinery and gguf-py's names:
- Parallel block: GPTJBlock returns attn(ln_1(x)) + mlp(ln_1(x)) + x: one LayerNorm (ln_1 -> attn_norm, with weight
  AND bias, eps `gptj.attention.layer_norm_epsilon`), no second norm (as phi2.cpp's graph).
- RoPE on the first `gptj.rope.dimension_count` (HF rotary_dim; the 6B: 64 of 256) dims of each q/k head, the rest
  unrotated; rotate_every_two turns ADJACENT pairs (x[2i], x[2i+1]) by position * 10000^(-2i/rotary_dim): ggml's
  NORM mode with n_rot = rotary_dim ("normal" here; llama.cpp's llama_model_rope_type lists LLM_ARCH_GPTJ under
  NONE, a placeholder of an arch it builds no graph for). Without the key the whole head rotates (llama.cpp's
  n_rot default; HF's rotary_dim None). Base 10000 (HF create_sinusoidal_positions' constant; llama.cpp's default
  without rope.freq_base, which a file may still set).
- Scale 1/sqrt(head_dim) (HF scaling head_dim**-0.5), MHA (no head_count_kv: = head_count).
- No q/k/v or out_proj biases (HF bias=False); the loader takes them when a file has them (attn_q.bias, ...,
  attn_output.bias: optional). q/k/v separate (attn_q/k/v) or fused (attn_qkv, rows q, k, v: the gguf-py list
  has both; phi2's fused path).
- MLP ungated: fc_out(gelu_new(fc_in(h))) with both biases required (fc_in -> ffn_up, fc_out -> ffn_down), GELU's
  tanh approximation (HF activation_function gelu_new in every release), torch's gelu on both backends.
- Final ln_f -> output_norm with bias; untied lm_head WITH a bias (HF nn.Linear(n_embd, vocab)): `output.weight`
  and `output.bias` required.
"""

from __future__ import annotations

from minfer.config import ModelConfig
from minfer.models.phi2 import Phi2Block, Phi2Model
from minfer.weights import load_qweight, load_vector


class GptjModel(Phi2Model):
    arch = "gptj"
    rope_style = "normal"     # HF rotate_every_two: adjacent pairs, ggml NORM (llama.cpp has no gptj graph)
    norm_eps_key = "attention.layer_norm_epsilon"

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Phi2Block:
        p = f"blk.{i}."
        D, Fw = cfg.d_model, cfg.ffn
        q_out, kv_out = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim

        def w(name, shape):
            return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

        def v(name, n, optional=False):
            return load_vector(gf, p + name, device, n) if not optional or p + name in gf.tensors else None

        blk = Phi2Block(
            attn_norm=v("attn_norm.weight", D), attn_norm_b=v("attn_norm.bias", D),
            attn_q=None, attn_k=None, attn_v=None,
            attn_output=w("attn_output", (D, q_out)), attn_output_b=v("attn_output.bias", D, optional=True),
            ffn_norm=None, ffn_gate=None, ffn_up=w("ffn_up", (Fw, D)), ffn_up_b=v("ffn_up.bias", Fw),
            ffn_down=w("ffn_down", (D, Fw)), ffn_down_b=v("ffn_down.bias", D))
        if p + "attn_qkv.weight" in gf.tensors:
            blk.attn_qkv = w("attn_qkv", (q_out + 2 * kv_out, D))
            blk.attn_qkv_b = v("attn_qkv.bias", q_out + 2 * kv_out, optional=True)
        else:
            blk.attn_q, blk.attn_k, blk.attn_v = w("attn_q", (q_out, D)), w("attn_k", (kv_out, D)), \
                w("attn_v", (kv_out, D))
        if blk.attn_qkv_b is None:
            blk.attn_q_bias = v("attn_q.bias", q_out, optional=True)
            blk.attn_k_bias = v("attn_k.bias", kv_out, optional=True)
            blk.attn_v_bias = v("attn_v.bias", kv_out, optional=True)
        return blk
