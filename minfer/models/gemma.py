"""Gemma 1 (Gemma 2B / 7B, CodeGemma 2B / 7B; HF GemmaForCausalLM): the GGUF arch `gemma`.

    x_0 = E[tokens] * sqrt(D)                                      token_embd (V, D), always the lm head
    for each layer l:
        x = x + W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))  n  = RMSNorm(attn_norm)
        x = x + W_down(gelu_tanh(W_gate n'(x)) * W_up n'(x))         n' = RMSNorm(ffn_norm)
    logits = token_embd RMSNorm(x; output_norm)

Gemma 2 / 3's block without their post-norms, q/k norms, soft-caps and sliding window. Each rule
and its source (llama.cpp src/models/gemma.cpp; conversion/gemma.py GemmaModel; HF modeling_gemma):
- Norms: the converter stores every `*norm.weight` as 1 + w (GemmaModel.modify_tensors; HF
  GemmaRMSNorm computes x * (1 + w) in float32), so all three are plain RMSNorms, eps
  `gemma.attention.layer_norm_rms_epsilon` (load_arch_hparams; HF rms_norm_eps).
- Embeddings scaled by sqrt(D) (gemma.cpp: ggml_scale(inpL, sqrtf(n_embd)); HF GemmaModel
  `normalizer`, sqrt(hidden_size)).
- Attention: GQA / MQA (the 2B has one kv head) with head size `gemma.attention.key_length`
  (256 for both sizes; the 7B's 16 heads of 256 are wider than D = 3072), scale 1/sqrt(head_dim)
  (gemma.cpp scales Q by 1/sqrt(n_embd_head) and attends with kq_scale 1; HF head_dim**-0.5).
- RoPE NEOX (llama_model_rope_type: LLM_ARCH_GEMMA -> NEOX; HF rotate_half) over the whole head.
  The converter writes no rope.freq_base: llama.cpp's default 10000 is the released rope_theta.
- MLP: GeGLU with GELU's tanh approximation (build_ffn(..., LLM_FFN_GELU, LLM_FFN_PAR); HF
  hidden_act gelu_pytorch_tanh, the released "gelu" read as it: GemmaConfig's legacy rule), the
  gate and up as one decode group (ops.linear_many), GELU by ops.geglu (`geglu.triton` on CUDA).
- The lm head is token_embd (gemma.cpp: output = token_embd, TENSOR_DUPLICATED; the converter
  drops lm_head.weight): a file with `output.weight` is refused by name, as llama.cpp's loader
  refuses a tensor it did not create.
- No biases: the released models have none (HF attention_bias false). llama.cpp's loader would take
  q/k/v biases as optional (create_tensor_qkv, TENSOR_NOT_REQUIRED) but no attn_output or MLP bias
  (HF attention_bias writes o_proj's too, a file llama.cpp refuses), so any bias tensor is refused
  by name.
"""

from __future__ import annotations

import math

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.layers import Block
from minfer.models.llama import LlamaModel


def check_gemma_tensors(gf, arch: str) -> None:
    """Refuse, by name, the tensors llama.cpp's gemma loader does not create (output.weight, biases)."""
    if "output.weight" in gf.tensors:
        raise MinferError(f"{gf.path}: tensor 'output.weight' is not supported for {arch}: the lm head is "
                          "token_embd.weight (llama.cpp's gemma graph; the converter drops lm_head)")
    for name in gf.tensors:
        if name.endswith(".bias"):
            raise MinferError(f"{gf.path}: tensor '{name}' is not supported for {arch} (the released models "
                              "have no biases; llama.cpp's gemma loader takes no output or MLP bias)")


class GemmaModel(LlamaModel):
    arch = "gemma"
    rope_style = "neox"       # llama_model_rope_type: LLM_ARCH_GEMMA -> NEOX

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "GemmaModel":
        check_gemma_tensors(gf, cls.arch)
        m = super().from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        m.embed_scale = math.sqrt(m.cfg.d_model)
        return m

    def mlp_hidden(self, h: torch.Tensor, blk: Block, ctx) -> torch.Tensor:
        """gelu_tanh(W_gate h) * W_up h, (T, D) -> (T, F)."""
        gate, up = ops.linear_many(h, (blk.ffn_gate, blk.ffn_up), (None, None), ctx)
        return ops.geglu(gate, up)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        # Llama's loop (models/llama.py) with the scaled embedding and the GeGLU MLP: each residual
        # add together with the norm after it
        act, eps, blocks = self.act_dtype, self.cfg.rms_eps, self.blocks
        x = ops.embedding(tokens, self.token_embd) * self.embed_scale          # (T, D) float32
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)           # (T, D) act
        for i, blk in enumerate(blocks):
            x, h = self.attention_residual_norm(h, blk, i, cache, step, ctx, x, eps, act)
            a = self.mlp_hidden(h, blk, ctx)                                   # (T, F)
            if i + 1 < len(blocks):
                x, h = ops.linear_add_rms_norm(a, blk.ffn_down, x, blocks[i + 1].attn_norm, eps, act, ctx,
                                               into_linear=True)
            else:
                f = ops.linear(a, blk.ffn_down, None, ctx)
        x, f = step.rows(x), step.rows(f)                                      # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)  # (R, V)
