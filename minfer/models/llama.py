"""Llama (and its many relatives, e.g. SmolLM2): the GGUF arch `llama`.

    x_0 = E[tokens]                                   token_embd      (V, D)
    for each layer l:
        x = x + W_o attn(rope(W_q n(x)), rope(W_k n(x)), W_v n(x))    n = RMSNorm(attn_norm)
        x = x + W_down(silu(W_gate n'(x)) * W_up n'(x))               n' = RMSNorm(ffn_norm)
    logits = W_out RMSNorm(x; output_norm)            output (V, D), or token_embd when tied

RoPE: ggml NORM mode (adjacent pairs); the converter permuted attn_q/attn_k rows so this
equals HF's rotate_half on the original weights (see minfer/config.py).
"""

from __future__ import annotations

import torch

from minfer import ops
from minfer.config import ModelConfig
from minfer.models.base import Model, Step
from minfer.models.layers import Block, attention_residual_norm, ffn_branch, ffn_residual_norm, load_block, load_head
from minfer.weights import QWeight, load_qweight


class LlamaModel(Model):
    arch = "llama"
    rope_style = "normal"     # llama.cpp llama_model_rope_type: LLM_ARCH_LLAMA -> NORM

    def __init__(self, cfg: ModelConfig, token_embd: QWeight, blocks: list[Block],
                 output_norm: torch.Tensor, output: QWeight, act_dtype: torch.dtype = torch.float32):
        self.cfg = cfg
        # dtype of the matmul inputs and of the KV cache: float32 on the CPU (the reference),
        # bf16 on CUDA by default (Switches.act_dtype). The residual stream stays float32.
        self.act_dtype = act_dtype
        self.token_embd = token_embd      # (V, D)
        self.blocks = blocks
        self.output_norm = output_norm    # (D,)
        self.output = output              # (V, D); the same object as token_embd when tied

    @property
    def device(self) -> torch.device:
        return self.output_norm.device

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "LlamaModel":
        from tqdm import tqdm

        cfg = cfg or ModelConfig.from_gguf(gf)
        if cls is LlamaModel and cfg.n_experts > 0:   # Mixtral: llama.cpp's llama loader with n_expert > 0
            from minfer.models.llama_moe import LlamaMoeModel

            return LlamaMoeModel.from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress, act_dtype=act_dtype)
        if cls is LlamaModel:       # llama.cpp's llama loader takes bias tensors optionally (models/llama_bias.py)
            from minfer.models.llama_bias import LlamaBiasModel, has_biases

            if has_biases(gf, cfg.n_layers):
                return LlamaBiasModel.from_gguf(gf, cfg, device=device, dtype=dtype, progress=progress,
                                                act_dtype=act_dtype)
        V, D = cfg.vocab, cfg.d_model
        bar = tqdm(total=cfg.n_layers + 2, desc=f"loading {gf.path.name}", unit="layer",
                   disable=not progress, leave=False)
        # An untied embedding is only gathered row by row: keep it quantized on the CPU
        # (saves V*D*4 bytes: 545 MB for Qwen2.5-0.5B).
        token_embd = load_qweight(gf, "token_embd.weight", device, (V, D), dense=cfg.tied_output, dtype=dtype)
        bar.update()
        blocks = []
        for i in range(cfg.n_layers):
            blocks.append(cls.load_block(gf, cfg, i, device, dtype))
            bar.update()
        output_norm, output = load_head(gf, cfg, token_embd, device, dtype)
        bar.update()
        bar.close()
        return cls(cfg, token_embd, blocks, output_norm, output, act_dtype=act_dtype)

    @classmethod
    def load_block(cls, gf, cfg: ModelConfig, i: int, device, dtype) -> Block:
        """blk.i's weights (an architecture with other block tensors overrides this)."""
        return load_block(gf, cfg, i, device, dtype, qkv_bias=cls.qkv_bias, qk_norm=cls.qk_norm)

    # ---- declarations (minfer.models.base.Model) ----

    def qweights(self) -> list[QWeight]:
        """The embedding, each layer's Block matrices then its layer_matrices, the untied lm head."""
        ws = [self.token_embd]
        for i, b in enumerate(self.blocks):
            ws += b.matrices() + self.layer_matrices(i)
        if self.output is not self.token_embd:
            ws.append(self.output)
        return ws

    def layer_matrices(self, i: int) -> list[QWeight]:
        """Layer i's matrices outside its Block (a recurrent mixer's, the MoE experts); none here."""
        return []

    def linear_groups(self) -> list[tuple]:
        # a hybrid's recurrent / conv layers have no attn_q, hence no q/k/v group
        return [(b.attn_q, b.attn_k, b.attn_v) for b in self.blocks if b.attn_q is not None]

    def head_weights(self) -> list:
        return [self.token_embd, self.output]

    # ---- the forward ----

    def attention_residual_norm(self, h: torch.Tensor, blk: Block, i: int, cache, step: Step, ctx, x: torch.Tensor,
                                eps: float, act) -> tuple:
        """Layer i's attention, its residual add and the FFN norm (layers.attention_residual_norm); an
        architecture whose attention differs by layer overrides this (smollm3's NoPE layers)."""
        return attention_residual_norm(h, blk, self.cfg, cache, i, step, ctx, x, blk.ffn_norm, eps, act)

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        # x: the float32 residual stream; h: its RMSNorm, in the matmuls' dtype. Each residual
        # add is done together with the norm that follows it (ops.add_rms_norm: one kernel on
        # CUDA), so the loop is
        #   x, h = x + attn(h), ffn_norm(x + attn(h));   x, h = x + ffn(h), next_norm(x + ffn(h))
        act, eps, blocks = self.act_dtype, self.cfg.rms_eps, self.blocks
        x = ops.embedding(tokens, self.token_embd)                 # (T, D) float32
        h = ops.rms_norm_cast(x, blocks[0].attn_norm, eps, act, ctx)   # (T, D) act
        for i, blk in enumerate(blocks):
            x, h = self.attention_residual_norm(h, blk, i, cache, step, ctx, x, eps, act)
            if i + 1 < len(blocks):
                # the down projection, the residual add and the next layer's norm; h goes to that
                # layer's q/k/v GEMV only, whose programs may do the norm (Switches.norm_into_gemv)
                x, h = ffn_residual_norm(h, blk, x, blocks[i + 1].attn_norm, eps, act, ctx)
            else:
                f = ffn_branch(h, blk, ctx)
        # the last residual add and the output norm only on the rows whose logits are wanted
        x, f = step.rows(x), step.rows(f)                          # (R, D)
        _, h = ops.add_rms_norm(x, f, self.output_norm, eps, act, ctx)
        return self.head(h, ctx)      # (R, V)


def activation_dtype(device, name: str = "bfloat16") -> torch.dtype:
    """float32 on the CPU (the reference); on CUDA the Switches.act_dtype name."""
    if torch.device(device).type != "cuda":
        return torch.float32
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
             "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16}
    return table[name]
